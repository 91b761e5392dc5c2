"""The one error hierarchy of polnet.

Every class subclasses :class:`PolnetError` *and* the builtin it resembles, so
callers can catch either ``PolnetError`` or e.g. ``ValueError``. Messages say
what went wrong and what to do about it.
"""

from __future__ import annotations


class PolnetError(Exception):
    """Base of every error raised by polnet on purpose."""


# --- input and configuration -------------------------------------------------


class ConfigError(PolnetError, ValueError):
    """Bad configuration: a file, an environment variable or a flag."""


class SpecError(PolnetError, ValueError):
    """A job spec that is malformed or out of range.

    ``field`` names the offending field (dotted path) when one is known.
    """

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field


class DatasetError(PolnetError, ValueError):
    """A dataset source (a folder of images, a CSV, arrays, a text file) that cannot be
    packed as it is; the message names the file and what to change."""


# --- integrity ---------------------------------------------------------------


class MalformedInput(PolnetError, ValueError):
    """Bytes from a peer, a submitter or a file that do not decode within bounds:
    too big, nested too deep, not UTF-8, not JSON, or not of the expected shape."""


class IntegrityError(PolnetError, ValueError):
    """Bytes that do not match the hash they were promised to have."""


class ProofError(IntegrityError):
    """A Merkle proof or trace leaf that does not check out."""


class CheckpointError(IntegrityError):
    """A checkpoint that is missing, truncated, corrupt or of the wrong state."""


# --- storage -----------------------------------------------------------------


class StoreError(PolnetError, OSError):
    """The local artifact store could not do what was asked."""


class ArtifactNotFound(StoreError, FileNotFoundError):
    """No artifact with that id is held locally (or by any reachable peer)."""


class ArtifactTooLarge(StoreError):
    """An artifact exceeds the configured size limit."""


# --- chain -------------------------------------------------------------------


class ChainError(PolnetError, RuntimeError):
    """Something went wrong talking to the chain."""


class RpcUnavailable(ChainError, ConnectionError):
    """The JSON-RPC endpoint cannot be reached. Is the devnet up?"""


class TransactionFailed(ChainError):
    """A transaction was mined but reverted, or could not be sent."""


class ContractRevert(TransactionFailed):
    """A contract reverted with a decoded custom error.

    ``error`` is the custom error's name (e.g. ``"BondTooSmall"``) and ``args``
    its decoded arguments.
    """

    def __init__(self, error: str, args: dict[str, object] | None = None,
                 message: str | None = None) -> None:
        self.error = error
        self.error_args = dict(args or {})
        detail = ", ".join(f"{k}={v!r}" for k, v in self.error_args.items())
        super().__init__(message or f"contract reverted with {error}({detail})")


class DeploymentNotFound(ChainError, FileNotFoundError):
    """No deployment file: run `polnet devnet up` first."""


class DevnetError(ChainError):
    """The local devnet could not be started, stopped or found."""


# --- network -----------------------------------------------------------------


class P2PError(PolnetError, ConnectionError):
    """A peer-to-peer operation failed."""


class PeerMisbehaved(P2PError):
    """A peer sent bytes or messages that fail validation; it gets dropped."""


class PeerTooSlow(PeerMisbehaved, TimeoutError):
    """A peer missed a transfer deadline (counted in our own loop's running time); it
    is dropped for a shorter while than a peer that sent something false."""


class PeerUnavailable(P2PError):
    """No reachable peer could serve the request."""


class RateLimited(P2PError):
    """A peer exceeded its request allowance."""


# --- training and verification -------------------------------------------------


class TrainingError(PolnetError, RuntimeError):
    """Training could not proceed (not a verification verdict)."""


class VerificationError(PolnetError, RuntimeError):
    """Verification could not be carried out (missing data, bad proof)."""


class DisputeError(PolnetError, RuntimeError):
    """A dispute move could not be made."""


class JobRejected(PolnetError, ValueError):
    """A posted job this node will not take: its spec or inputs are unusable, or it
    needs more memory or time than this node has. The reason says which."""
