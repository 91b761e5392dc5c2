"""A test cheat: a verifier that challenges honest work and votes against the solver.

Started by a test as a process, `python -m tests.malicious_verifier verifier run --name N
--dev-account I [--bootstrap ADDR]` (``LocalNet.start_verifier(...,
module="tests.malicious_verifier")``): the production CLI has no flag for it.
"""

from __future__ import annotations

import argparse

from node import logs
from node.cli.common import run_daemon, settings_from
from node.roles.verifier import Verifier


class MaliciousVerifier(Verifier):
    """Fails the first segment of every sample it replays, always disputes the last
    part of a bisection round, and votes invalid on every jury it sits on."""

    def reported_pass(self, first_of_sample: bool, passed: bool) -> bool:
        return passed and not first_of_sample

    def chosen_part(self, part: int, parts: int) -> int:
        return parts - 1  # walk to the last step and hope the jury errs

    def vote_value(self, valid: bool) -> bool:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m tests.malicious_verifier")
    ap.add_argument("group", choices=["verifier"])
    ap.add_argument("command", choices=["run"])
    ap.add_argument("--name", required=True)
    ap.add_argument("--dev-account", type=int, required=True)
    ap.add_argument("--bootstrap", action="append")
    ap.add_argument("--log-json", action="store_true")
    args = ap.parse_args()
    logs.configure(json=args.log_json)
    settings = settings_from(None, name=args.name, dev_account=args.dev_account,
                             bootstrap=args.bootstrap)
    run_daemon(settings, "verifier", MaliciousVerifier, None)


if __name__ == "__main__":
    main()
