"""The environment of a child process that handles untrusted input (issue 37).

A probe parses and runs a stranger's spec and dataset; whatever it runs must find
no key and no password to leak. So a child gets an allow-list of this process's
environment (how to run Python and torch here), never ``POLNET_*`` or anything
named like a secret, plus what the caller sets. Callers also start it with
``close_fds=True`` (no descriptor but stdin/stdout/stderr inherited).

Public API::

    child_env(extra) -> dict[str, str]
"""

from __future__ import annotations

import os
from collections.abc import Mapping

KEEP = frozenset({"PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "TZ", "PYTHONPATH",
                  "PYTHONHASHSEED", "VIRTUAL_ENV", "LD_LIBRARY_PATH"})
# Threading and kernel-choice knobs of torch and its BLAS/OpenMP: a child must compute
# as its parent would (verifier.drift sets some on purpose).
KEEP_PREFIXES = ("ATEN_", "MKL_", "OMP_", "KMP_", "OPENBLAS_", "TORCH_", "CUDA_", "CUBLAS_",
                 "NVIDIA_", "MALLOC_")
SECRET_MARKERS = ("KEY", "PASSWORD", "PASSWD", "SECRET", "TOKEN", "CREDENTIAL", "PASSPHRASE",
                  "MNEMONIC", "AUTH")


def _secret(name: str) -> bool:
    upper = name.upper()
    return upper.startswith("POLNET_") or any(m in upper for m in SECRET_MARKERS)


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allowed part of ``os.environ`` plus ``extra`` (which may not name a secret:
    ValueError, a bug in the caller)."""
    env = {k: v for k, v in os.environ.items()
           if (k in KEEP or k.startswith(KEEP_PREFIXES)) and not _secret(k)}
    for k, v in (extra or {}).items():
        if _secret(k):
            raise ValueError(f"{k} looks like a secret: a child handling untrusted input "
                             "must not get it")
        env[k] = v
    return env
