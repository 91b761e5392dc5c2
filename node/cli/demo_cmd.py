"""`polnet demo`: a whole local network run to settlement."""

from __future__ import annotations

from pathlib import Path

import typer

# DiLoCo's regime: workers start from a pretrained model. From seeded weights the
# demo's few rounds leave the collaborative model behind one solver alone; from 100
# steps of warm-up it is ahead (bench/collab.py measures both).
DEFAULT_WARM_START = 100


def demo(
    home: Path = typer.Option(Path(".demo"), "--home",
                              help="Where the demo keeps chain, node state and logs "
                                   "(wiped at start)."),
    timeout: float | None = typer.Option(
        None, "--timeout", help="Give up after this many seconds (default 900; --collab 1500)."),
    collab: bool = typer.Option(False, "--collab",
                                help="Run a collaborative (DiLoCo) job instead: 4 workers, one "
                                     "byzantine, one killed mid-round and restarted."),
    rounds: int = typer.Option(5, "--rounds", min=3, max=50, help="--collab: outer rounds."),
    warm_start: int | None = typer.Option(
        None, "--warm-start", min=0, max=5000, metavar="STEPS",
        help="--collab: start the job from one worker's weights after STEPS steps (another "
             "seed), as DiLoCo starts from a pretrained model; the spec names the file "
             f"(default {DEFAULT_WARM_START}; 0: from the seeded initial weights)."),
) -> None:
    """Start a devnet, 3 verifiers, an honest, a cheating and a withholding solver and a
    submitter; post three jobs (LM on text, MLP and CNN on digits) and run them to
    settlement: the cheater is caught by replay, the withholder without one. With --collab: one
    collaborative job trained by 4 workers, its byzantine worker slashed and excluded."""
    if warm_start is not None and not collab:
        raise typer.BadParameter("--warm-start applies to --collab only", param_hint="--warm-start")
    if collab:
        from node.demo_collab import run_collab_demo

        steps = DEFAULT_WARM_START if warm_start is None else warm_start
        raise typer.Exit(run_collab_demo(home.resolve(), timeout or 1500.0, rounds, steps))
    from node.demo import run_demo

    raise typer.Exit(run_demo(home.resolve(), timeout or 900.0))


def register(root: typer.Typer) -> None:
    root.command("demo")(demo)
