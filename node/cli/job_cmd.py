"""`polnet job ...`: the submitter's commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from node.cli.common import (
    BootstrapOpt,
    ConfigOpt,
    DevAccountOpt,
    KeystoreOpt,
    NameOpt,
    settings_from,
)
from node.units import TOKEN, wei_to_pol, when

if TYPE_CHECKING:  # node.chain is heavy: the CLI imports it when a command runs
    from node.chain.ids import CollabId, JobId

app = typer.Typer(help="Submit training jobs and follow them to settlement.",
                  no_args_is_help=True)


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


def _client(config: Path | None, dev_account: int | None = None,  # type: ignore[no-untyped-def]
            keystore: Path | None = None):
    from node.chain.client import ChainClient
    from node.chain.deployment import Deployment

    s = settings_from(config, dev_account=dev_account, keystore=keystore)
    key = s.load_private_key() if (s.dev_account is not None or s.private_key or s.keystore) \
        else None
    return ChainClient.from_deployment(Deployment.load(s.deployment_path), key, s.rpc_url,
                                       s.expected_chain_id, rpc=s.rpc)


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
    dry_run: bool = typer.Option(False, "--dry-run",
                                 help="Show what the job costs and the bond a solver locks; "
                                      "post nothing."),
    round_duration: int = typer.Option(
        300, "--round-duration",
        help="Collaborative jobs: seconds a round's workers have to commit their inner run."),
    init_weights: Path | None = typer.Option(
        None, "--init-weights", exists=True, dir_okay=False, metavar="FILE",
        help="S_0's weights of a fine-tuning job (theta_0 of a collaborative one): the file "
             "the spec's init_weights names (make one with `polnet job init-weights`); "
             "served beside the inputs."),
    pipeline_depth: int = typer.Option(
        0, "--pipeline-depth", min=0, metavar="D",
        help="Collaborative jobs: rounds that may start on a posted candidate while the "
             "last finalized one is still open (0..4; each slot and outer post then bonds "
             "D x slots x sub-reward more)."),
    samples: int | None = typer.Option(
        None, "--samples", min=1, metavar="N",
        help="Segments the committee replays (default: the market's derived n). An edit "
             "of one segment is caught with P = N / S; --budget pays the default n and "
             "the market escrows budget * N / n."),
    full_replay: bool = typer.Option(False, "--full-replay",
                                     help="Replay every segment (--samples S)."),
) -> None:
    """Store SPEC and DATASET in this node's store, escrow the reward, post the job
    and print its id. Solvers fetch the inputs from us over p2p, so keep it serving.
    A spec with kind = "collaborative" posts a DiLoCo job to the CollabMarket: its
    slots' workers train every round (--round-duration each) and are paid per
    accepted inner run."""
    import trio

    from node.errors import ConfigError
    from node.roles.runtime import Runtime
    from node.roles.submitter import (
        FULL_REPLAY,
        JobRequest,
        assurance,
        assurance_lines,
        check_request,
        post,
        serve_until_final,
    )
    from node.spec import is_collaborative_file

    if is_collaborative_file(spec):
        _submit_collab(spec, dataset, reward, budget, round_duration, serve, config, name,
                       dev_account, keystore, bootstrap, dry_run, init_weights,
                       pipeline_depth)
        return
    if full_replay and samples is not None:
        raise ConfigError("--samples and --full-replay: give one")
    req = JobRequest(spec, dataset, pol_to_wei(reward, "--reward"), pol_to_wei(budget, "--budget"),
                     solve_duration, FULL_REPLAY if full_replay else samples or 0,
                     init_weights_path=init_weights)
    job_spec = check_request(req)  # fail before starting anything
    if dry_run:
        _dry_run(req, job_spec, config, dev_account, keystore)
        return
    settings = settings_from(config, name=name or "submitter", dev_account=dev_account,
                             keystore=keystore, bootstrap=bootstrap)
    c = _client(config, dev_account, keystore)
    a = assurance(req, job_spec, c.market.market_params().sample_count)
    for line in assurance_lines(a):  # before anything is escrowed
        typer.echo(line)
    _check_balance(c, req.reward + a.budget)

    async def main() -> None:
        async with Runtime(settings, "submitter") as rt:
            job_id = await post(rt, req)
            # addrs already end in /p2p/<peer id>
            typer.echo(f"job {job_id} posted; serving inputs at {rt.p2p.addrs[0]}")
            if serve:
                await serve_until_final(rt, [job_id], None)

    trio.run(main)


def _submit_collab(spec: Path, dataset: Path, reward: str, budget: str, round_duration: int,
                   serve: bool, config: Path | None, name: str | None,
                   dev_account: int | None, keystore: Path | None,
                   bootstrap: list[str] | None, dry_run: bool,
                   init_weights: Path | None, pipeline_depth: int = 0) -> None:
    import trio

    from node.roles.collab_submit import (
        CollabRequest,
        check_collab_request,
        post_collab,
        serve_collab_until_done,
    )
    from node.roles.runtime import Runtime

    req = CollabRequest(spec, dataset, pol_to_wei(reward, "--reward"),
                        pol_to_wei(budget, "--budget"), round_duration, init_weights,
                        pipeline_depth)
    cspec = check_collab_request(req)
    subs = cspec.outer_rounds * cspec.workers.max
    if dry_run:
        typer.echo("dry run: nothing stored, escrowed or posted")
        typer.echo(f"collaborative job {cspec.name or '(unnamed)'}: {cspec.outer_rounds} rounds "
                   f"x {cspec.workers.max} slots (at least {cspec.workers.min} per round) x "
                   f"{cspec.inner_steps} inner steps; {round_duration} s per round")
        typer.echo("theta_0: " + (f"init weights {cspec.init_weights}" if cspec.init_weights
                                  else f"seeded weights (seed {cspec.inner.seed})"))
        typer.echo(f"you escrow {wei_to_pol(req.reward + req.budget)} POL; each of the {subs} "
                   f"sub-jobs pays its worker {wei_to_pol(req.reward // subs)} POL")
        return
    settings = settings_from(config, name=name or "submitter", dev_account=dev_account,
                             keystore=keystore, bootstrap=bootstrap)
    _check_balance(_client(config, dev_account, keystore), req.reward + req.budget)

    async def main() -> None:
        async with Runtime(settings, "submitter") as rt:
            cid = await post_collab(rt, req)
            typer.echo(f"collaborative job {cid} posted; serving inputs at {rt.p2p.addrs[0]}")
            if serve:
                end = await serve_collab_until_done(rt, cid, None)
                typer.echo(f"collaborative job {cid} {end}")

    trio.run(main)


def _check_balance(c: Any, total: int) -> None:
    """Before any p2p node starts or anything is stored: can this account pay?"""
    from node.errors import ConfigError

    if c.sender is None:
        raise ConfigError("no account configured: pass --dev-account N (devnet) or "
                          "--keystore FILE")
    balance = c.token.balance_of(c.address)
    if balance < total:
        raise ConfigError(f"{c.address} holds {wei_to_pol(balance)} POL, the job escrows "
                          f"{wei_to_pol(total)} POL (reward + verification budget): short by "
                          f"{wei_to_pol(total - balance)} POL; fund it or lower "
                          "--reward/--budget")


def _dry_run(req: Any, spec: Any, config: Path | None, dev_account: int | None,
             keystore: Path | None = None) -> None:
    """What `submit` would escrow and what a solver would lock, read from the chain's
    parameters (the bond is the contract's own integer arithmetic); nothing is sent."""
    from node.errors import ChainError
    from node.roles.submitter import assurance, assurance_lines

    segments = spec.total_steps // spec.checkpoint_interval
    typer.echo("dry run: nothing stored, escrowed or posted")
    typer.echo(f"job          {spec.name or '(unnamed)'}  spec 0x{spec.spec_hash_hex()}")
    typer.echo(f"training     {spec.total_steps} steps = {segments} segments of "
               f"{spec.checkpoint_interval}; solver has {req.solve_duration} s after claiming")
    total = req.reward + req.budget
    typer.echo(f"you escrow   {wei_to_pol(total)} POL = reward {wei_to_pol(req.reward)} POL + "
               f"verification budget {wei_to_pol(req.budget)} POL")
    try:
        c = _client(config, dev_account, keystore)  # a keystore's balance too
        mp = c.market.market_params()
        bps = mp.bond_factor_bps
        balance = c.token.balance_of(c.address) if c.sender is not None else None
    except (ChainError, OSError) as exc:  # offline is fine for a dry run: say what is missing
        typer.echo(f"solver bond  unknown: the chain's bond factor could not be read ({exc})")
        if req.samples:
            typer.echo("sampled      unknown: the market's derived n (the floor, and what "
                       "--budget pays for) could not be read")
        return
    a = assurance(req, spec, mp.sample_count)
    for line in assurance_lines(a):
        typer.echo(line)
    if a.budget != req.budget:
        total = req.reward + a.budget
        typer.echo(f"you escrow   {wei_to_pol(total)} POL for {a.n} samples = reward "
                   f"{wei_to_pol(req.reward)} POL + verification budget "
                   f"{wei_to_pol(a.budget)} POL ({wei_to_pol(req.budget)} x {a.n} / {a.floor})")
    bond = req.reward * bps // 10_000
    typer.echo(f"solver bond  {wei_to_pol(bond)} POL ({bps / 100:g}% of the reward), locked "
               "from the solver's stake until the job is final; slashed if it cheats")
    if balance is not None:
        verdict = "enough" if balance >= total else \
            f"short by {wei_to_pol(total - balance)} POL: fund it or lower --reward/--budget"
        typer.echo(f"your balance {wei_to_pol(balance)} POL ({c.address}): {verdict}")


@app.command("init-weights")
def init_weights_cmd(
    checkpoint: Path | None = typer.Argument(
        None, exists=True, dir_okay=False, metavar="[CHECKPOINT]",
        help="A polnet checkpoint, e.g. the final state of a job trained with `polnet train`."),
    spec: Path = typer.Option(..., "--spec", exists=True, dir_okay=False, metavar="SPEC",
                              help="The spec (single-solver or collaborative) whose model "
                                   "it must fit."),
    out: Path = typer.Option(..., "--out", dir_okay=False, metavar="FILE",
                             help="Where to write the init-weights file."),
    from_hf: Path | None = typer.Option(
        None, "--from-hf", exists=True, file_okay=False, metavar="DIR",
        help="Instead of CHECKPOINT: a transformers save_pretrained directory (config.json "
             "+ model.safetensors) for a spec of an hf_* family."),
) -> None:
    """Write CHECKPOINT's (or --from-hf DIR's) model weights as S_0 of a fine-tuning job
    (theta_0 of a warm-started collaborative one) and print the init_weights line to
    put in SPEC (then submit with --init-weights FILE)."""
    from node.errors import ConfigError
    from node.spec import is_collaborative_file, load_collaborative_spec, load_spec
    from node.train.init_weights import from_checkpoint, from_hf_dir

    model = load_collaborative_spec(spec).inner.model if is_collaborative_file(spec) \
        else load_spec(spec).model
    if (checkpoint is None) == (from_hf is None):
        raise ConfigError("give either CHECKPOINT or --from-hf DIR")
    digest = from_checkpoint(checkpoint, model, out) if checkpoint is not None \
        else from_hf_dir(from_hf, model, out)  # type: ignore[arg-type]
    typer.echo(f"wrote {out}; put this in {spec.name}:")
    typer.echo(f'init_weights = "{digest}"')


@app.command("status")
def status(
    job_id: int = typer.Argument(..., help="Job id."),
    config: ConfigOpt = None,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    watch: bool = typer.Option(False, "--watch",
                               help="Print again whenever it changes, until the job is "
                                    "finalized or cancelled (Ctrl-C to stop watching)."),
    interval: float = typer.Option(2.0, "--interval", min=0.1, help="--watch: poll period (s)."),
    collab: bool = typer.Option(False, "--collab",
                                help="JOB_ID is a collaborative job (CollabMarket)."),
    exact: bool = typer.Option(False, "--exact",
                               help="Amounts to the last wei (default: 2 decimals)."),
    name: NameOpt = None,
) -> None:
    """State, solver, sampled segments, verdicts (attestations, challenges) and payouts.
    --collab: a collaborative job's rounds, slots, accepted and dropped inner runs, and
    the held-out loss per round that the submitter serving it recorded (--name: that
    submitter's node name, default "submitter")."""
    import time

    from node.chain.ids import CollabId, JobId
    from node.errors import ConfigError
    from node.roles.submitter import job_report

    c = _client(config)
    if collab:
        from node.roles.collab_progress import read_losses

        cid = CollabId(job_id)
        losses = read_losses(settings_from(config, name=name or "submitter").node_dir, cid)
        _collab_status(c, cid, as_json, losses)
        return
    jid = JobId(job_id)
    count = c.market.job_count()
    if not 1 <= job_id <= count:
        raise ConfigError(f"no job {job_id}: the market has {count} job(s) "
                          "(`polnet job list` shows them)")
    home = settings_from(config).home
    last = None
    try:
        while True:
            rep = job_report(c, jid)
            rep["segments"] = _segments(c, jid, home)
            if rep != last:
                if last is None or as_json:
                    _print_report(jid, rep, as_json, watch, exact, c)
                else:  # a watch prints what changed, not the whole table again
                    _print_changes(last, rep, exact, c)
                last = rep
            if not watch or rep["status"] in ("finalized", "cancelled"):
                return
            time.sleep(interval)
    except KeyboardInterrupt:  # stopping a watch is not an error
        return


def _segments(c: Any, job_id: JobId, home: Path) -> list[dict[str, Any]]:
    """Tokens seen and mean loss per segment of the committed round, from a trace
    manifest of a node under HOME whose root is the one on chain (the explorer's rule);
    [] when no node here holds that trace."""
    from node.explorer.index import find_loss_curve

    curve = find_loss_curve(home, job_id, c.market.get_job(job_id))
    return [] if curve is None else curve.rows()


def _collab_status(c: Any, cid: CollabId, as_json: bool,
                   losses: dict[int, dict[str, Any]]) -> None:
    from node.errors import ConfigError
    from node.roles.collab_submit import collab_report

    if c.deployment is None or "CollabMarket" not in c.deployment.contracts:
        raise ConfigError("this deployment has no CollabMarket: redeploy (`polnet devnet up`)")
    count = c.collab.collab_count()
    if not 1 <= cid <= count:
        raise ConfigError(f"no collaborative job {cid}: the CollabMarket has {count}")
    rep = collab_report(c, cid, losses)
    if as_json:
        typer.echo(json.dumps(rep, indent=2, sort_keys=True))
        return
    typer.echo(f"collaborative job {cid}: {rep['status']} (round {rep['round']} of "
               f"{rep['rounds']}, {rep['phase']}); {rep['per_sub_job_pol']} POL per inner run")
    typer.echo("slots: " + ", ".join(f"{i}={a or 'free'}" for i, a in enumerate(rep["slots"])))
    if rep["initial_loss"] is not None:
        typer.echo(f"held-out loss of theta_0: {rep['initial_loss']:.4f}")
    for r in rep["history"]:
        loss = "-" if r["loss"] is None else f"{r['loss']:.4f}"
        typer.echo(f"  round {r['round']} (try {r['attempt']}): accepted {r['accepted']} "
                   f"dropped {r['dropped']} sub-jobs {r['sub_jobs']} outer "
                   f"{r['outer_hash'] or '-'} {r['outer_challenge']}; held-out loss {loss}")
    if not losses:
        typer.echo("(no loss record here: the submitter serving the job keeps one in its "
                   "data dir; pass --name/--config for that node)")


def _print_report(job_id: JobId, rep: dict[str, Any], as_json: bool, lines: bool,
                  exact: bool = False, c: Any = None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from node.event_text import event_line, pol

    if as_json:  # a watch prints one document per change: JSON lines
        typer.echo(json.dumps(rep, indent=None if lines else 2, default=str))
        return
    names = _party_names(rep, c)
    t = Table(title=f"job {job_id}")
    t.add_column("field")
    t.add_column("value", overflow="fold")
    for k, v in rep.items():
        if k not in ("events", "payouts", "segments"):
            t.add_row(k, escape(_human(k, v, rep["status"], exact, names)))
    Console().print(t)
    seg = Table(title="loss per segment (the committed trace, as a node here holds it)")
    for col in ("segment", "to step", "tokens seen", "loss"):
        seg.add_column(col, justify="right")
    for r in rep.get("segments") or ():
        seg.add_row(str(r["segment"]), str(r["step"]),
                    "-" if r["tokens_seen"] is None else f"{r['tokens_seen']:,}",
                    f"{r['loss']:.4f}")
    Console().print(seg if rep.get("segments") else
                    "loss per segment: no trace of this round on a node here (a solver's "
                    "node shows it)")
    pay = Table(title="payouts (credited; each account pulls with withdraw)")
    for col in ("to", "POL", "why"):
        pay.add_column(col, overflow="fold")
    for p in rep["payouts"]:
        pay.add_row(escape(f"{names.get(p['to'], '')} {p['to']}".strip()),
                    pol(p["amount"], exact).removesuffix(" POL"), p["why"])
    Console().print(pay if rep["payouts"] else "payouts: none yet")
    ev = Table(title="events")
    for col in ("block", "event", "details"):
        ev.add_column(col, overflow="fold")
    for e in rep["events"]:
        args = {k: v for k, v in e.items() if k not in ("event", "block")}
        ev.add_row(str(e["block"]), e["event"],
                   escape(event_line(e["event"], args, names, exact=exact, skip=("jobId",))))
    Console().print(ev)


def _print_changes(old: dict[str, Any], new: dict[str, Any], exact: bool, c: Any) -> None:
    from node.event_text import event_line

    names = _party_names(new, c)
    for k, v in new.items():
        if k not in ("events", "payouts", "segments") and old.get(k) != v:
            typer.echo(f"{k}: {_human(k, old.get(k), old['status'], exact, names)} -> "
                       f"{_human(k, v, new['status'], exact, names)}")
    for r in new.get("segments", [])[len(old.get("segments") or ()):]:
        typer.echo(f"segment {r['segment']} (to step {r['step']}"
                   + ("" if r["tokens_seen"] is None else f", {r['tokens_seen']:,} tokens")
                   + f"): loss {r['loss']:.4f}")
    for e in new["events"][len(old["events"]):]:
        args = {k: v for k, v in e.items() if k not in ("event", "block")}
        typer.echo(f"#{e['block']} {e['event']} "
                   + event_line(e["event"], args, names, exact=exact, skip=("jobId",)))


def _party_names(rep: dict[str, Any], c: Any) -> dict[str, str]:
    """The job's parties and the contracts by role, for the tables."""
    names = {a: n for n, a in (c.deployment.contracts.items()
                               if c is not None and c.deployment is not None else ())}
    names[rep["submitter"]] = "submitter"
    if rep["solver"] and int(rep["solver"], 16):
        names[rep["solver"]] = "solver"
    for i, a in enumerate(rep.get("committee") or ()):
        names.setdefault(a, f"committee-{i}")
    return names


def _human(key: str, value: object, status: str = "", exact: bool = False,
           names: dict[str, str] | None = None) -> str:
    """Amounts in POL, times as local time and "in 42 s", for people; --json keeps the
    raw numbers. A settled job's deadlines are history, not a countdown."""
    from node.event_text import address_text, pol

    if key in ("reward", "verification_budget", "bond") and isinstance(value, int):
        return pol(value, exact)
    if key in ("deadline", "window_end") and isinstance(value, int):
        if status in ("finalized", "cancelled") and value:
            return when(value).split(" (")[0] + " (passed or met)"
        return when(value)
    if key in ("submitter", "solver") and isinstance(value, str) and names:
        return f"{address_text(value, names)} {value}" if value in names else value
    return str(value)


@app.command("list")
def list_jobs(config: ConfigOpt = None) -> None:
    """Every job on the market."""
    from rich.console import Console
    from rich.table import Table

    c = _client(config)
    from node.event_text import pol

    opened = _disputes_per_job(c)
    t = Table(title="jobs")
    for col in ("id", "status", "reward", "solver", "segments", "disputes"):
        t.add_column(col)
    for jid in range(1, c.market.job_count() + 1):
        j = c.market.get_job(jid)
        t.add_row(str(jid), j.status.name.lower(), pol(j.reward), j.solver,
                  str(j.segment_count), f"{opened.get(jid, 0)} ({j.open_disputes} open)")
    Console().print(t)


def _disputes_per_job(c: Any) -> dict[int, int]:
    """Disputes ever opened per job (the job record counts only open ones), from one
    read of the market's ``Challenged`` events."""
    from collections import Counter

    from node.chain.events import EventWatcher

    if c.deployment is None:
        return {}
    start = c.deployment.deploy_block
    watcher = EventWatcher(c.w3, [c.market], start_block=start)
    return dict(Counter(int(e.args["jobId"]) for e in watcher.fetch(start, c.block_number())
                        if e.event == "Challenged"))


@app.command("cancel")
def cancel(job_id: int = typer.Argument(...), config: ConfigOpt = None,
           dev_account: DevAccountOpt = None) -> None:
    """Cancel an unclaimed job; the escrow is credited back and withdrawn at once."""
    c = _client(config, dev_account)
    c.market.cancel(job_id)
    paid = c.market.withdraw()
    typer.echo(f"job {job_id} cancelled; {wei_to_pol(paid)} POL withdrawn")


@app.command("fetch")
def fetch(
    job_id: int = typer.Argument(...),
    out: Path = typer.Option(Path("model.safetensors"), "--out", help="Where to write it."),
    fmt: str = typer.Option("polnet", "--format",
                            help="polnet: one file (OUT); hf: also a directory (DIR, the "
                                 "argument after --format hf) that transformers' "
                                 "from_pretrained loads, with a tokenizer."),
    hf_dir: Path | None = typer.Argument(None, metavar="[DIR]",
                                         help="--format hf: the directory to write."),
    config: ConfigOpt = None,
    name: NameOpt = None,
    dev_account: DevAccountOpt = None,
    bootstrap: BootstrapOpt = None,
) -> None:
    """Download the trained model of a finalized job (checked against the chain): its
    weights with the job's spec inside, so `node.train.models.load_model(OUT)` rebuilds it.
    `--format hf DIR` (an hf_* family) also writes DIR for
    `AutoModelForCausalLM.from_pretrained(DIR)` (`AutoModelForMaskedLM` for hf_albert)."""
    import trio

    from node.chain.contracts import JobStatus
    from node.chain.ids import JobId
    from node.errors import ConfigError
    from node.roles.runtime import Runtime
    from node.roles.submitter import fetch_model

    if fmt not in ("polnet", "hf") or (fmt == "hf") != (hf_dir is not None):
        raise ConfigError("--format is polnet (no DIR) or hf with a DIR: "
                          "`polnet job fetch JOB --format hf DIR`")
    # Its own node ("fetch"): a second process with the running submitter's name would
    # also have its peer id. And the chain says at once whether there is a model yet.
    settings = settings_from(config, name=name or "fetch", dev_account=dev_account,
                             bootstrap=bootstrap)
    c = _client(config)
    count = c.market.job_count()
    if not 1 <= job_id <= count:
        raise ConfigError(f"no job {job_id}: the market has {count} job(s)")
    status = c.market.get_job(job_id).status
    if status != JobStatus.FINALIZED:
        raise ConfigError(f"job {job_id} is {status.name.lower()}, not finalized: its model "
                          f"can be fetched once it is final (`polnet job status {job_id} "
                          "--watch` follows it)")

    async def main() -> None:
        async with Runtime(settings, "submitter") as rt:
            path = await fetch_model(rt, JobId(job_id), out, hf_dir=hf_dir)
            typer.echo(f"model of job {job_id} written to {path}; load it with "
                       f"node.train.models.load_model({str(path)!r})")
            if hf_dir is not None:
                typer.echo(f"transformers directory: {hf_dir} (from_pretrained({str(hf_dir)!r}"
                           ", attn_implementation='eager') gives the trained logits exactly)")

    trio.run(main)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="job")
