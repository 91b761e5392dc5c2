"""`polnet job ...`: the submitter's commands."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from node.cli.common import (
    BootstrapOpt,
    ConfigOpt,
    DevAccountOpt,
    KeystoreOpt,
    NameOpt,
    settings_from,
)

app = typer.Typer(help="Submit training jobs and follow them to settlement.",
                  no_args_is_help=True)
TOKEN = 10**18


def pol_to_wei(text: str, flag: str) -> int:
    """POL as an exact decimal ("1.1" is 1.1e18 wei, not 1100000000000000128)."""
    from decimal import Decimal, InvalidOperation

    from node.errors import ConfigError

    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        raise ConfigError(f"{flag} {text!r} is not a number of POL (e.g. 100 or 1.5)") from None
    wei = value * TOKEN
    if not value.is_finite() or wei != wei.to_integral_value() or value < 0:
        raise ConfigError(f"{flag} {text!r}: POL has 18 decimals; give a non-negative "
                          "amount with at most 18 digits after the point")
    return int(wei)


def _client(config: Path | None, dev_account: int | None = None):  # type: ignore[no-untyped-def]
    from node.chain.client import ChainClient
    from node.chain.deployment import Deployment

    s = settings_from(config, dev_account=dev_account)
    key = s.load_private_key() if (s.dev_account is not None or s.private_key or s.keystore) \
        else None
    return ChainClient.from_deployment(Deployment.load(s.deployment_path), key, s.rpc_url)


@app.command("submit")
def submit(
    spec: Path = typer.Argument(..., help="Job spec (TOML or JSON)."),
    dataset: Path = typer.Option(..., "--dataset", help="Dataset file the spec names."),
    reward: str = typer.Option(..., "--reward", help="Reward in POL (exact decimal, e.g. 1.1)."),
    budget: str = typer.Option("10", "--budget", help="Verification budget in POL."),
    solve_duration: int = typer.Option(600, "--solve-duration",
                                       help="Seconds a solver has after claiming."),
    serve: bool = typer.Option(True, "--serve/--no-serve",
                               help="Keep serving spec + dataset until the job is final."),
    config: ConfigOpt = None,
    name: NameOpt = None,
    dev_account: DevAccountOpt = None,
    keystore: KeystoreOpt = None,
    bootstrap: BootstrapOpt = None,
) -> None:
    """Store SPEC and DATASET in this node's store, escrow the reward, post the job
    and print its id. Solvers fetch the inputs from us over p2p, so keep it serving."""
    import trio

    from node.roles.runtime import Runtime
    from node.roles.submitter import JobRequest, check_request, post, serve_until_final

    req = JobRequest(spec, dataset, pol_to_wei(reward, "--reward"), pol_to_wei(budget, "--budget"),
                     solve_duration)
    check_request(req)  # fail before starting anything
    settings = settings_from(config, name=name or "submitter", dev_account=dev_account,
                             keystore=keystore, bootstrap=bootstrap)

    async def main() -> None:
        async with Runtime(settings, "submitter") as rt:
            job_id = await post(rt, req)
            # addrs already end in /p2p/<peer id>
            typer.echo(f"job {job_id} posted; serving inputs at {rt.p2p.addrs[0]}")
            if serve:
                await serve_until_final(rt, [job_id], None)

    trio.run(main)


@app.command("status")
def status(
    job_id: int = typer.Argument(..., help="Job id."),
    config: ConfigOpt = None,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """State, solver, sampled segments, verdicts (attestations, challenges) and payouts."""
    from rich.console import Console
    from rich.table import Table

    from node.errors import ConfigError
    from node.roles.submitter import job_report

    c = _client(config)
    count = c.market.job_count()
    if not 1 <= job_id <= count:
        raise ConfigError(f"no job {job_id}: the market has {count} job(s) "
                          "(`polnet job list` shows them)")
    rep = job_report(c, job_id)
    if as_json:
        typer.echo(json.dumps(rep, indent=2, default=str))
        return
    t = Table(title=f"job {job_id}")
    t.add_column("field")
    t.add_column("value", overflow="fold")
    for k, v in rep.items():
        if k not in ("events", "payouts"):
            t.add_row(k, _human(k, v))
    Console().print(t)
    pay = Table(title="payouts (credited; each account pulls with withdraw)")
    for col in ("to", "POL", "why"):
        pay.add_column(col, overflow="fold")
    for p in rep["payouts"]:
        pay.add_row(p["to"], f"{p['amount'] / TOKEN:g}", p["why"])
    Console().print(pay if rep["payouts"] else "payouts: none yet")
    ev = Table(title="events")
    for col in ("block", "event", "details"):
        ev.add_column(col, overflow="fold")
    for e in rep["events"]:
        details = {k: v for k, v in e.items() if k not in ("event", "block", "jobId")}
        ev.add_row(str(e["block"]), e["event"], json.dumps(details, default=str))
    Console().print(ev)


def _human(key: str, value: object) -> str:
    """Amounts in POL and times in UTC for people; --json keeps the raw numbers."""
    import datetime as dt

    if key in ("reward", "verification_budget", "bond") and isinstance(value, int):
        return f"{value / TOKEN:g} POL"
    if key in ("deadline", "window_end") and isinstance(value, int):
        if not value:
            return "-"
        return dt.datetime.fromtimestamp(value, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return str(value)


@app.command("list")
def list_jobs(config: ConfigOpt = None) -> None:
    """Every job on the market."""
    from rich.console import Console
    from rich.table import Table

    c = _client(config)
    t = Table(title="jobs")
    for col in ("id", "status", "reward (POL)", "solver", "segments", "disputes"):
        t.add_column(col)
    for jid in range(1, c.market.job_count() + 1):
        j = c.market.get_job(jid)
        t.add_row(str(jid), j.status.name.lower(), f"{j.reward / TOKEN:g}", j.solver,
                  str(j.segment_count), str(j.open_disputes))
    Console().print(t)


@app.command("cancel")
def cancel(job_id: int = typer.Argument(...), config: ConfigOpt = None,
           dev_account: DevAccountOpt = None) -> None:
    """Cancel an unclaimed job; the escrow is credited back and withdrawn at once."""
    c = _client(config, dev_account)
    c.market.cancel(job_id)
    paid = c.market.withdraw()
    typer.echo(f"job {job_id} cancelled; {paid / TOKEN:g} POL withdrawn")


@app.command("fetch")
def fetch(
    job_id: int = typer.Argument(...),
    out: Path = typer.Option(Path("model.safetensors"), "--out", help="Where to write it."),
    config: ConfigOpt = None,
    name: NameOpt = None,
    dev_account: DevAccountOpt = None,
    bootstrap: BootstrapOpt = None,
) -> None:
    """Download the trained model of a finalized job (checked against the chain): its
    weights with the job's spec inside, so `node.train.models.load_model(OUT)` rebuilds it."""
    import trio

    from node.roles.runtime import Runtime
    from node.roles.submitter import fetch_model

    settings = settings_from(config, name=name or "submitter", dev_account=dev_account,
                             bootstrap=bootstrap)

    async def main() -> None:
        async with Runtime(settings, "submitter") as rt:
            path = await fetch_model(rt, job_id, out)
            typer.echo(f"model of job {job_id} written to {path}; load it with "
                       f"node.train.models.load_model({str(path)!r})")

    trio.run(main)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="job")
