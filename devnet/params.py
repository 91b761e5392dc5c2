"""Devnet parameters: the one place their defaults live.

Windows and clocks are short (about a minute) so a demo settles while you
watch; tests use the same model, overriding fields where they need to.
Field names are the contracts' parameter names in snake_case: the deployer
fills each constructor struct by component name (see :func:`struct_args`), so a
field the contracts do not know is an error rather than silently dropped.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from node.errors import ConfigError
from node.incentives import incentive_sample_count, required_sample_count

TOKEN = 10**18
BOND_FACTOR_BPS = 15_000
JURY_SIZE = 3
# The market's sample count follows from the bond and the jury (docs/protocol.md,
# "Incentives"): cheating on any fraction loses >= half the saved work, plus a floor.
SAMPLE_COUNT = required_sample_count(BOND_FACTOR_BPS / 10_000, JURY_SIZE)
# A reserved sub-job (a collaborative inner run) replays its final segment plus this
# many others: the incentive term alone; the floor is met over a worker's rounds.
RESERVED_SAMPLE_COUNT = incentive_sample_count(BOND_FACTOR_BPS / 10_000, JURY_SIZE)


class RegistryParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # Longer than window + grace + a whole dispute (2 clocks, every clock extension,
    # commit + reveal; the DisputeGame refuses less) so a juror or attestor cannot unbond
    # and walk away from a slash it has coming.
    unbond_delay: int = Field(
        default=1800, ge=0, description="seconds between requestUnbond and withdraw"
    )
    min_solver_stake: int = Field(default=100 * TOKEN, ge=0)
    min_verifier_stake: int = Field(default=50 * TOKEN, ge=1)
    sortition_cap: int = Field(
        default=200 * TOKEN, ge=1,
        description="stake weight cap of one address in jury / committee draws (>= min "
                    "verifier stake): a draw picks an address with probability ~ its capped "
                    "free stake, so sybils gain nothing by splitting stake")


class MarketParams(BaseModel):
    """JobMarket ``Params`` (see IJobMarket.sol)."""

    model_config = ConfigDict(extra="forbid")
    bond_factor_bps: int = Field(
        default=BOND_FACTOR_BPS, ge=0, description="solver bond = reward * this / 1e4"
    )
    verification_window: int = Field(
        default=60, ge=1, description="seconds after commit to attest or challenge"
    )
    sample_lookahead: int = Field(
        default=2, ge=1, description="blocks from commit to the seed block"
    )
    sample_count: int = Field(default=SAMPLE_COUNT, ge=1, description=(
        "segments drawn for verification; the default is required_sample_count(bond "
        "factor, jury size) of node.incentives"))
    reserved_sample_count: int = Field(default=RESERVED_SAMPLE_COUNT, ge=1, description=(
        "reserved sub-jobs (collaborative inner runs): segments drawn besides the final one, "
        "which is always replayed; the default is incentive_sample_count(bond factor, jury "
        "size) of node.incentives"))
    missed_deadline_slash_bps: int = Field(
        default=5_000,
        ge=0,
        le=10_000,
        description="share of a late solver's bond paid to the submitter",
    )
    challenge_bond: int = Field(default=10 * TOKEN, ge=0, description="locked from a challenger")
    attestor_slash_bps: int = Field(
        default=5_000, ge=0, le=10_000, description="of min verifier stake, per wrong attestation"
    )
    attestors_per_job: int = Field(
        default=3, ge=1, le=16,
        description="committee seats drawn (stake-weighted) per round to verify the sample")
    dispute_grace: int = Field(
        default=30, ge=1,
        description="seconds of window left to other challengers whenever a dispute ends")
    challenger_share_bps: int = Field(default=5_000, ge=0, le=10_000)
    juror_share_bps: int = Field(default=3_000, ge=0, le=10_000)
    submitter_share_bps: int = Field(default=2_000, ge=0, le=10_000)

    @model_validator(mode="after")
    def _shares_sum(self) -> MarketParams:
        if self.challenger_share_bps + self.juror_share_bps + self.submitter_share_bps != 10_000:
            raise ValueError("challenger + juror + submitter shares must sum to 10000 bps")
        return self


class DisputeParams(BaseModel):
    """DisputeGame ``Params`` (see DisputeGame.sol)."""

    model_config = ConfigDict(extra="forbid")
    clock: int = Field(default=60, ge=1, description="seconds per side for all its bisection moves")
    jury_size: int = Field(default=JURY_SIZE, ge=1, le=15)
    quorum: int = Field(default=2, ge=1, description="reveals needed for a verdict")
    commit_window: int = Field(default=60, ge=1, description="seconds from the jury draw to commit")
    reveal_window: int = Field(default=60, ge=1, description="seconds after that to reveal")
    juror_slash_bps: int = Field(
        default=1_000, ge=0, le=10_000,
        description="of (solver bond + challenge bond), per minority or silent juror")
    juror_share_of_challenger_bond_bps: int = Field(
        default=5_000, ge=0, le=10_000,
        description="of a losing challenger's bond, to the majority jurors; the rest is burned")
    fanout: int = Field(
        default=8, ge=2, le=64,
        description="parts per bisection round (2 = halves); a k-step segment takes "
                    "ceil(log_fanout(k)) rounds")
    jury_lookahead: int = Field(
        default=2, ge=1, le=128,
        description="blocks between the jury request and the block whose hash seeds it")
    clock_extension: int = Field(
        default=10, ge=0,
        description="seconds a side to move always has after the other side's move")

    @model_validator(mode="after")
    def _quorum_fits(self) -> DisputeParams:
        if self.quorum > self.jury_size:
            raise ValueError("quorum must not exceed jury_size")
        if self.clock_extension > self.clock:
            raise ValueError("clock_extension must not exceed clock")
        return self


class CollabParams(BaseModel):
    """CollabMarket ``Params`` (see ICollabMarket.sol). A job picks its own round duration."""

    model_config = ConfigDict(extra="forbid")
    outer_window: int = Field(
        default=20, ge=2,
        description="seconds a posted outer state stays open to challenge (a challenge that "
                    "ends leaves at least half of it)")
    outer_bond: int = Field(
        default=20 * TOKEN, ge=0, description="tokens a poster and a challenger each put up")
    max_slots: int = Field(default=16, ge=1, le=64, description="bound on a job's worker slots")
    max_rounds: int = Field(default=1_000, ge=1, le=100_000,
                            description="bound on a job's outer rounds")
    max_round_retries: int = Field(
        default=2, ge=0, le=100,
        description="retries of a round that settled below min workers before the job fails")
    throughput_tolerance_bps: int = Field(
        default=2_000, ge=0, le=10_000,
        description="how far a node's delivered rate may fall below its claim before its "
                    "slots are capped at what it delivered")
    slot_bond: int = Field(
        default=5 * TOKEN, ge=0, le=2**96 - 1,
        description="tokens a worker puts up per slot it holds: back when the slot is released "
                    "or the job ends, lost to the round's accepted workers when the worker "
                    "leaves its reserved sub-job unclaimed (an idle slot is not free)")



class OuterJuryParams(BaseModel):
    """OuterJury ``Params`` (see IOuterJury.sol): the juries over challenged outer states."""

    model_config = ConfigDict(extra="forbid")
    jury_lookahead: int = Field(
        default=2, ge=1, le=128,
        description="blocks between an outer challenge and the block whose hash seeds its jury")
    jury_size: int = Field(default=JURY_SIZE, ge=1, le=15,
                           description="jurors drawn (stake-weighted) per outer challenge")
    quorum: int = Field(default=2, ge=1, description="reveals needed for an outer verdict")
    commit_window: int = Field(default=30, ge=1,
                               description="seconds from the outer jury draw to commit votes")
    reveal_window: int = Field(default=30, ge=1, description="seconds after that to reveal")
    juror_slash: int = Field(
        default=10 * TOKEN, ge=0, le=2**128 - 1,
        description="unlocked stake a drawn juror loses for not revealing, or for revealing "
                    "against the verdict; paid to the majority (burned when nobody revealed)")

    @model_validator(mode="after")
    def _quorum_fits(self) -> OuterJuryParams:
        if self.quorum > self.jury_size:
            raise ValueError("quorum must not exceed jury_size")
        return self


class AvailabilityParams(BaseModel):
    """Availability ``Params`` (see IAvailability.sol): data-availability requests."""

    model_config = ConfigDict(extra="forbid")
    bond: int = Field(default=5 * TOKEN, ge=0, le=2**96 - 1,
                      description="escrowed by a requester (tokens, returned unless frivolous)")
    answer_window: int = Field(
        default=60, ge=1,
        description="seconds a solver has to publish a requested segment's leaves on chain")
    solver_share_bps: int = Field(
        default=2_000, ge=0, le=10_000,
        description="of the bond paid to a solver that answers: the price of a frivolous request")


class DevnetParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    registry: RegistryParams = Field(default_factory=RegistryParams)
    market: MarketParams = Field(default_factory=MarketParams)
    dispute: DisputeParams = Field(default_factory=DisputeParams)
    collab: CollabParams = Field(default_factory=CollabParams)
    outer_jury: OuterJuryParams = Field(default_factory=OuterJuryParams)
    availability: AvailabilityParams = Field(default_factory=AvailabilityParams)
    accounts: int = Field(default=10, ge=2, le=100, description="funded dev accounts")
    mint_per_account: int = Field(default=1_000_000 * TOKEN, ge=0)


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def struct_args(model: BaseModel, abi_input: dict[str, Any]) -> tuple[Any, ...] | Any:
    """Values of ``model`` laid out as the ABI ``abi_input`` wants them.

    A tuple input is filled by component name (camelCase <-> snake_case); a
    scalar input takes the field of the same name.
    """
    values = {camel(k): v for k, v in model.model_dump().items()}
    comps = abi_input.get("components")
    if comps is None:
        key = abi_input["name"]
        if key not in values:
            raise ConfigError(f"devnet params have no value for {key!r}")
        return values[key]
    names = [c["name"] for c in comps]
    missing = [n for n in names if n not in values]
    unknown = [snake(k) for k in values if k not in names]
    if missing or unknown:
        raise ConfigError(
            f"devnet params do not match the contract's {abi_input.get('internalType', 'struct')}: "
            f"missing {[snake(m) for m in missing]}, unknown {unknown}"
        )
    return tuple(values[n] for n in names)


def short_network_params() -> DevnetParams:
    """Windows for whole-network runs of real daemons on a LocalNet (tests/test_e2e_network.py,
    bench/chaos.py): short enough that jobs settle in minutes. With three verifiers in all,
    one committee seat leaves two to judge (attestors never sit on a jury), and one juror
    makes a quorum."""
    return DevnetParams.model_validate({
        "market": {"verification_window": 35, "sample_count": 4, "attestors_per_job": 1,
                   "dispute_grace": 20},
        "dispute": {"clock": 60, "commit_window": 25, "reveal_window": 20, "fanout": 8,
                    "quorum": 1},
        "registry": {"unbond_delay": 3600}})


PRODUCTION_PARAMS = Path(__file__).with_name("production.toml")


def production_params() -> DevnetParams:
    """The shipped parameters for a public chain (devnet/production.toml)."""
    return load_params(PRODUCTION_PARAMS)


def load_params(path: Path | None) -> DevnetParams:
    """Contract parameters from a TOML file ([registry], [market], [dispute], [collab]); the
    devnet's defaults for what it leaves out, or for no file at all."""
    import tomllib

    from pydantic import ValidationError

    if path is None:
        return DevnetParams()
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"parameter file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not TOML: {exc}") from None
    try:
        return DevnetParams.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"{path}: {where}: {first['msg']}") from None
