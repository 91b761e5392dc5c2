"""`polnet dispute status ID`."""

from __future__ import annotations

import json

import typer

from node.cli.common import ConfigOpt

app = typer.Typer(help="Inspect dispute games.", no_args_is_help=True)


@app.command("status")
def status(
    dispute_id: int = typer.Argument(..., help="Dispute id."),
    config: ConfigOpt = None,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Range, clocks, jury and votes of one dispute."""
    from rich.console import Console
    from rich.table import Table

    from node.chain.client import ChainClient
    from node.chain.deployment import Deployment
    from node.chain.ids import DisputeId
    from node.config import load_config

    settings = load_config(config)
    c = ChainClient.from_deployment(Deployment.load(settings.deployment_path), None,
                                    settings.rpc_url, settings.expected_chain_id,
                                    rpc=settings.rpc)
    count = int(c.dispute.call("disputeCount"))
    if not 1 <= dispute_id <= count:
        from node.errors import ConfigError

        raise ConfigError(f"no dispute {dispute_id}: {count} dispute(s) so far (a dispute "
                          "id, not a job id: `polnet job status JOB` lists its challenges)")
    d = c.dispute.get_dispute(DisputeId(dispute_id))
    data = {"id": d.id, "job": d.job_id, "segment": d.segment, "phase": d.phase.name.lower(),
            "range": [d.lo, d.hi], "steps": [d.start_step, d.end_step], "rounds": d.rounds,
            "mid_steps": d.mid_steps,
            "turn": d.next_move, "solver": d.solver, "challenger": d.challenger,
            "solver_clock_left": d.solver_clock_left,
            "challenger_clock_left": d.challenger_clock_left, "jury": d.jury,
            "votes": [{"juror": j, "committed": v.commitment != bytes(32),
                       "revealed": v.revealed, "valid": v.valid if v.revealed else None}
                      for j, v in zip(d.jury, d.votes, strict=True)],
            "valid_votes": d.valid_votes, "invalid_votes": d.invalid_votes,
            "verdict": d.verdict.name.lower() if d.phase.name == "RESOLVED" else None,
            "draw_block": d.draw_block if d.phase.name == "DRAWING" else None,
            "solver_won": d.solver_won if d.phase.name == "RESOLVED" else None}
    if d.jury:
        p = c.dispute.call("params")
        size, quorum = int(p.jurySize), int(p.quorum)
        if len(d.jury) < size:  # say why, or it reads like a bug
            data["jury_note"] = (f"{len(d.jury)} of {size} seats filled: too few eligible "
                                 "verifiers (free stake >= the minimum, unchanged since the "
                                 "request, not the solver, challenger or an attestor); below "
                                 f"the quorum of {quorum} the dispute ends Void")
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    t = Table(title=f"dispute {d.id}: job {d.job_id}, segment {d.segment}")
    t.add_column("field")
    t.add_column("value")
    for k, v in data.items():
        t.add_row(k, json.dumps(v) if isinstance(v, list | dict) else str(v))
    Console().print(t)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="dispute")
