"""DisputeGame against anvil: every transition and revert, the chess clock, the
jury draw, commit-reveal, each settlement outcome, moot disputes, and that the
pull payments add up to exactly the tokens that moved.

The module deploys its own contracts on the session anvil (``anvil`` fixture)
with a verification window longer than a whole dispute: with the devnet
defaults (window 60 s, clock 60 s per side) no dispute can end inside the
window, so ``SegmentAlreadyUpheld`` would be unreachable. Each test runs in an
anvil snapshot that is reverted afterwards. Time is moved with
``evm_setNextBlockTimestamp`` / ``evm_mine`` so clock boundaries are exact.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from eth_abi import encode as abi_encode
from eth_utils import keccak
from web3.types import TxReceipt

from devnet.anvil import AnvilProcess, dev_accounts
from devnet.deploy import CONTRACTS, constructor_args, deploy_all
from devnet.params import TOKEN, DevnetParams
from devnet.testing import LocalChain
from node.chain.artifacts import artifacts_dir
from node.chain.contracts import SOLVER, VERIFIER, DisputeState, JobStatus, Phase, Side
from node.chain.rpc import make_web3
from node.errors import ChainError, ContractRevert
from node.proof import MerkleTree, TraceLeaf, build_trace_tree

BPS = 10_000
ZERO = bytes(32)
SPEC, DATA = keccak(b"dispute-spec"), keccak(b"dispute-data")
# Odd wei amounts so that every bps split and pool division leaves rounding dust.
REWARD, BUDGET, DURATION = 100 * TOKEN + 7, 30 * TOKEN, 3600
# sampleCount (8) >= SEGMENTS: every segment is sampled. k = 16 with fanout 4: two rounds
# of three mids (16 -> 4 -> 1 steps), so first, middle and last parts are all reachable.
SEGMENTS, K, FANOUT = 4, 16, 4
SEG = 1  # the segment disputed by default

# dev accounts: 0 deploys; the rest play these roles
SOLVER_I, CHAL, CHAL2, SUBMITTER, OUTSIDER = 1, 2, 3, 8, 9
VERIFIERS = (4, 5, 6, 7)
ATTESTORS = (4, 5)  # attest the disputed segment(s)

PARAMS = DevnetParams.model_validate({
    "accounts": 10,
    "registry": {"unbond_delay": 7200},  # longer than a whole dispute (see contracts/README)
    "market": {"verification_window": 3600},
    "dispute": {"fanout": FANOUT},
})


# --- fixtures -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def dchain(anvil: AnvilProcess) -> LocalChain:
    missing = [n for n in CONTRACTS if not (artifacts_dir() / f"{n}.json").is_file()]
    if missing:
        pytest.skip(f"contract artifacts missing ({', '.join(missing)}): run `make contracts`")
    return deploy_game(anvil, PARAMS)


def deploy_game(anvil: AnvilProcess, params: DevnetParams) -> LocalChain:
    """Fresh contracts on ``anvil``, every account funded, the roles registered."""
    accts = dev_accounts(10)
    dep = deploy_all(make_web3(anvil.url), accts[0], params, fund=accts, rpc_url=anvil.url)
    c = LocalChain(anvil, dep)
    c.join(SOLVER_I, SOLVER | VERIFIER, 500 * TOKEN)  # a verifier too: the draw must skip it
    for i in (CHAL, CHAL2, *VERIFIERS):
        c.join(i, VERIFIER, 100 * TOKEN)
    return c


@pytest.fixture
def c(dchain: LocalChain) -> Iterator[LocalChain]:
    snap = dchain.snapshot()
    try:
        yield dchain
    finally:
        dchain.revert(snap)


# --- helpers ------------------------------------------------------------------------


def revert(fn: Callable[..., Any], *args: Any) -> ContractRevert:
    with pytest.raises(ContractRevert) as e:
        fn(*args)
    return e.value


def next_ts(c: LocalChain, t: int) -> None:
    """The next mined block (and the 'pending' block that gas estimation runs on) has time t."""
    c.rpc("evm_setNextBlockTimestamp", t)


def mine_at(c: LocalChain, t: int) -> None:
    c.rpc("evm_mine", t)


def ts_of(c: LocalChain, r: TxReceipt) -> int:
    return int(c.w3.eth.get_block(r["blockNumber"])["timestamp"])


def idx(c: LocalChain, addr: str) -> int:
    return c.addresses.index(addr)


def addr(c: LocalChain, i: int) -> str:
    return c.addresses[i]


def state(c: LocalChain, did: int) -> DisputeState:
    return c.reader.dispute.get_dispute(did)


def ev(c: LocalChain, r: TxReceipt, event: str, contract: str = "dispute") -> list[Any]:
    """``event`` args emitted by that contract itself (market and game share event names)."""
    b = getattr(c.reader, contract)
    return [e["args"] for e in b.events(r, event) if e["address"] == b.address]


def uints(c: LocalChain, calls: Sequence[tuple[Any, str, tuple[Any, ...]]]) -> list[int]:
    """Many uint256 view calls in one JSON-RPC batch."""
    reqs = [("eth_call", [{"to": b.address, "data": b.encode(fn, *args)}, "latest"])
            for b, fn, args in calls]
    resps = c.w3.provider.make_batch_request(reqs)  # type: ignore[attr-defined]
    assert isinstance(resps, list), resps
    return [int(r["result"], 16) for r in resps]


@dataclass
class Job:
    id: int
    leaves: list[TraceLeaf]
    tree: MerkleTree
    bond: int


def new_job(c: LocalChain, k: int = K, attest: Sequence[int] = (SEG,)) -> Job:
    """Post, claim and commit a job; ATTESTORS attest the segments in ``attest``."""
    job = c[SUBMITTER].post_job(SPEC, DATA, REWARD, BUDGET, DURATION)
    solver = c[SOLVER_I]
    solver.market.claim_job(job)
    states = [keccak(b"S-%d-%d" % (job, i)) for i in range(SEGMENTS + 1)]
    leaves, tree = build_trace_tree(job, k, states, [10**9 + i for i in range(SEGMENTS)])
    solver.market.commit_result(job, tree.root, states[-1], SEGMENTS, k)
    c.mine(c.reader.market.market_params().sample_lookahead + 1)
    for seg in attest:
        for i in ATTESTORS:
            c[i].market.attest(job, seg)
    return Job(job, leaves, tree, c.reader.market.get_job(job).bond)


def challenge(c: LocalChain, job: Job, who: int = CHAL, seg: int = SEG) -> int:
    return c[who].market.challenge(job.id, seg, job.leaves[seg], job.tree.proof(seg),
                                   job.leaves[seg + 1], job.tree.proof(seg + 1))


def mids(c: LocalChain, did: int, tag: bytes = b"") -> list[bytes]:
    """Mid hashes for the dispute's current ``mid_steps``."""
    return [keccak(b"mid-%d-%d%s" % (did, t, tag)) for t in state(c, did).mid_steps]


def bisect(c: LocalChain, did: int, lower: bool = True) -> TxReceipt:
    """Play the bisection down to one step, always disputing the first part (``lower``)
    or the last; returns the receipt that drew the jury."""
    d = state(c, did)
    solver, chal = c[idx(c, d.solver)].dispute, c[idx(c, d.challenger)].dispute
    r: TxReceipt | None = None
    while d.phase == Phase.BISECTION:
        hs = mids(c, did)
        solver.post_mids(did, hs)
        r = chal.choose(did, 0 if lower else len(hs), hs)
        d = state(c, did)
    assert r is not None and d.phase == Phase.COMMIT
    return r


def salt(juror: str) -> bytes:
    return keccak(b"salt" + bytes.fromhex(juror[2:]))


HIDE = "hide"  # commit (valid) but never reveal
Ballot = bool | str | None  # True / False: commit and reveal; HIDE; None: never commit


def run_jury(c: LocalChain, did: int, ballots: Sequence[Ballot]) -> TxReceipt:
    """Jurors (in ``jury`` order) vote per ``ballots``; then resolve at revealEnd."""
    d = state(c, did)
    for juror, b in zip(d.jury, ballots, strict=True):
        if b is not None:
            c[idx(c, juror)].dispute.commit_vote(did, b is True, salt(juror))
    mine_at(c, d.commit_end)
    for juror, b in zip(d.jury, ballots, strict=True):
        if isinstance(b, bool):
            c[idx(c, juror)].dispute.reveal_vote(did, b, salt(juror))
    mine_at(c, d.reveal_end)
    return c[OUTSIDER].dispute.resolve(did)


# --- money ----------------------------------------------------------------------------

_PER_ACCOUNT = (("token", "balanceOf"), ("registry", "freeStake"), ("registry", "lockedStake"),
                ("registry", "unbondingStake"), ("market", "credits"), ("dispute", "credits"))


def worth(c: LocalChain) -> dict[str, int]:
    """Per account: tokens + every stake bucket + market and game credits."""
    r = c.reader
    calls = [(getattr(r, b), fn, (a,)) for a in c.addresses for b, fn in _PER_ACCOUNT]
    out = uints(c, calls)
    n = len(_PER_ACCOUNT)
    return {a: sum(out[i * n:(i + 1) * n]) for i, a in enumerate(c.addresses)}


def check_books(c: LocalChain) -> None:
    """Each contract holds exactly what it owes; no token outside accounts + contracts."""
    r = c.reader
    cons = (r.registry, r.market, r.dispute)
    out = uints(c, [(r.token, "balanceOf", (b.address,)) for b in cons]
                + [(b, "totalOwed", ()) for b in cons] + [(r.token, "totalSupply", ())]
                + [(r.token, "balanceOf", (a,)) for a in c.addresses])
    held, owed, supply, wallets = out[0:3], out[3:6], out[6], out[7:]
    assert held == owed, f"registry/market/game hold {held} but owe {owed}"
    assert sum(held) + sum(wallets) == supply


def diff(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {a: after[a] - before[a] for a in after if after[a] != before[a]}


def nonzero(d: Counter[str] | dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in d.items() if v}


def game_credits(c: LocalChain) -> dict[str, int]:
    out = uints(c, [(c.reader.dispute, "credits", (a,)) for a in c.addresses])
    return {a: v for a, v in zip(c.addresses, out, strict=True) if v}


def expected(c: LocalChain, d: DisputeState, job: Job, *, solver_won: bool,
             majority: Sequence[str], losers: Sequence[str], attestors: Sequence[str] = (),
             submitter: str = "") -> tuple[dict[str, int], dict[str, int]]:
    """(worth deltas, game credits) the settlement must produce, from the on-chain params."""
    p = c.reader.dispute.call("params")
    mp = c.reader.market.market_params()
    minv = int(c.reader.registry.call("minVerifierStake"))
    cut = minv * p.jurorSlashBps // BPS
    value: Counter[str] = Counter()
    cred: Counter[str] = Counter()
    pool = cut * len(losers)
    for j in losers:
        value[j] -= cut
    if solver_won:
        winner = d.solver
        cb = mp.challenge_bond
        to_jury = cb * p.jurorShareOfChallengerBondBps // BPS
        value[d.challenger] -= cb
        cred[winner] += cb - to_jury
    else:
        winner = d.challenger
        to_jury = job.bond * p.jurorShareBps // BPS
        to_sub = job.bond * p.submitterShareBps // BPS
        value[d.solver] -= job.bond
        cred[submitter or addr(c, SUBMITTER)] += to_sub
        cred[winner] += job.bond - to_jury - to_sub
        att = minv * mp.attestor_slash_bps // BPS
        for a in attestors:  # paid to the challenger through the market
            value[a] -= att
            value[winner] += att
    pool += to_jury
    per = pool // len(majority) if majority else 0
    for m in majority:
        cred[m] += per
    cred[winner] += pool - per * len(majority)
    for a, v in cred.items():
        value[a] += v
    assert sum(value.values()) == 0  # a settlement only moves tokens
    return nonzero(value), nonzero(cred)


def withdraw_all(c: LocalChain, settled: Sequence[TxReceipt]) -> None:
    """Everyone pulls their game credit; the pulls equal the credits, the credits equal
    the stake slashed into the game, and the game ends empty."""
    r = c.reader
    credited = sum(e["amount"] for s in settled for e in ev(c, s, "Credited"))
    slashed_in = sum(e["amount"] for s in settled for e in ev(c, s, "Slashed", "registry")
                     if e["to"] == r.dispute.address)
    assert credited == slashed_in == r.dispute.total_owed()
    pulled = 0
    for i, a in enumerate(c.addresses):
        owed = r.dispute.credits(a)
        if not owed:
            assert revert(c[i].dispute.withdraw).error == "NothingToWithdraw"
            continue
        bal = r.token.balance_of(a)
        assert c[i].dispute.withdraw() == owed
        assert r.token.balance_of(a) == bal + owed
        assert r.dispute.credits(a) == 0
        pulled += owed
        check_books(c)
    assert pulled == credited
    assert r.dispute.total_owed() == 0 == r.token.balance_of(r.dispute.address)


def py_draw_jury(c: LocalChain, seed: bytes, solver: str, challenger: str) -> list[str]:
    """DisputeGame.drawJury re-done in Python from its documented rule."""
    reg = c.reader.registry
    verifiers = reg.verifiers()
    want = c.reader.dispute.call("params").jurySize
    slots = list(range(len(verifiers)))
    jury: list[str] = []
    for i in range(len(verifiers)):
        if len(jury) >= want:
            break
        h = int.from_bytes(keccak(abi_encode(["bytes32", "uint256"], [seed, i])), "big")
        r = i + h % (len(verifiers) - i)
        slots[i], slots[r] = slots[r], slots[i]
        a = verifiers[slots[i]]
        if a not in (solver, challenger) and reg.is_verifier(a):
            jury.append(a)
    return jury


# --- construction and access ----------------------------------------------------------


def test_constructor_guards_and_open_only_by_market(c: LocalChain) -> None:
    r = c.reader
    job = new_job(c, attest=())
    addrs = {n: c.deployment.address_of(n) for n in CONTRACTS}
    bad = PARAMS.dispute.model_copy(update={"challenger_share_bps": 5_001})
    assert revert(c[0].deploy, "DisputeGame",
                  *constructor_args("DisputeGame", addrs, bad)).error == "InvalidParams"
    for update in ({"clock": 0}, {"fanout": 1}, {"fanout": 65}):
        bad = PARAMS.dispute.model_copy(update=update)
        assert revert(c[0].deploy, "DisputeGame",
                      *constructor_args("DisputeGame", addrs, bad)).error == "InvalidParams"
    zero = {**addrs, "NodeRegistry": "0x" + "00" * 20}
    assert revert(c[0].deploy, "DisputeGame",
                  *constructor_args("DisputeGame", zero, PARAMS.dispute)).error == "ZeroAddress"

    lv = job.leaves
    args = (job.id, SEG, addr(c, SOLVER_I), addr(c, CHAL), SEG * K, (SEG + 1) * K,
            lv[SEG].state_hash, lv[SEG + 1].state_hash)
    for who in (OUTSIDER, CHAL, SOLVER_I, 0):  # 0: the deployer / owner of everything
        e = revert(c[who].dispute.open, *args)
        assert (e.error, e.error_args) == ("Unauthorized", {"caller": addr(c, who)})
    assert int(r.dispute.call("disputeCount")) == 0

    for fn, extra in (("post_mids", ([keccak(b"x")],)), ("choose", (0, [])), ("timeout", ()),
                      ("commit_vote", (True, ZERO)), ("reveal_vote", (True, ZERO)),
                      ("resolve", ())):
        e = revert(getattr(c[CHAL].dispute, fn), 99, *extra)
        assert (e.error, e.error_args) == ("UnknownDispute", {"id": 99}), fn
    e = revert(c[OUTSIDER].dispute.abort_moot, 99)
    assert (e.error, e.error_args) == ("WrongPhase", {"id": 99, "phase": Phase.NONE})
    assert revert(c[OUTSIDER].dispute.withdraw).error == "NothingToWithdraw"

    did = challenge(c, job)  # through the market: works, ids start at 1
    assert did == 1 == int(r.dispute.call("disputeCount"))
    check_books(c)


# --- bisection --------------------------------------------------------------------------


def test_bisection_turns_phases_and_narrowing(c: LocalChain) -> None:
    job = new_job(c, attest=())
    did = challenge(c, job)
    solver, chal, out = c[SOLVER_I].dispute, c[CHAL].dispute, c[OUTSIDER].dispute
    d = state(c, did)
    bond = c.reader.market.market_params().challenge_bond
    lo0, hi0 = SEG * K, (SEG + 1) * K
    assert (d.job_id, d.segment, d.solver, d.challenger, d.challenge_bond) == (
        job.id, SEG, addr(c, SOLVER_I), addr(c, CHAL), bond)
    assert (d.start_step, d.end_step, d.lo, d.hi) == (lo0, hi0, lo0, hi0)
    assert (d.lo_hash, d.hi_hash, d.mids_root) == (job.leaves[SEG].state_hash,
                                                   job.leaves[SEG + 1].state_hash, ZERO)
    assert (d.phase, d.turn, d.rounds, d.jury, d.votes) == (Phase.BISECTION, Side.SOLVER, 0,
                                                            [], [])
    q = K // FANOUT
    assert d.mid_steps == [lo0 + q, lo0 + 2 * q, lo0 + 3 * q]
    assert c.reader.dispute.call("midSteps", did) == d.mid_steps

    # solver to move: nobody else may; exactly parts - 1 non-zero hashes
    m1 = mids(c, did)
    for poster, who in ((chal.post_mids, CHAL), (out.post_mids, OUTSIDER)):
        e = revert(poster, did, m1)
        assert (e.error, e.error_args) == ("NotYourTurn", {"caller": addr(c, who)})
    for chooser in (chal.choose, solver.choose):
        assert revert(chooser, did, 0, m1).error == "NotYourTurn"
    for wrong in (m1[:2], [*m1, keccak(b"extra")], []):
        e = revert(solver.post_mids, did, wrong)
        assert (e.error, e.error_args) == ("WrongMidCount", {"given": len(wrong),
                                                            "expected": FANOUT - 1})
    assert revert(solver.post_mids, did, [m1[0], ZERO, m1[2]]).error == "ZeroHash"

    r = solver.post_mids(did, m1)
    (e,) = ev(c, r, "MidsPosted")
    assert (e["id"], e["steps"], [bytes(h) for h in e["hashes"]]) == (did, d.mid_steps, m1)
    d = state(c, did)
    assert (d.turn, d.mids_root) == (Side.CHALLENGER, keccak(b"".join(m1)))
    assert c.reader.dispute.posted_mids(did, d.mids_root) == m1
    with pytest.raises(ChainError, match="no MidsPosted log matches"):
        c.reader.dispute.posted_mids(did, keccak(b"not posted"))
    # challenger to move, with exactly the posted hashes and an existing part
    assert revert(solver.post_mids, did, mids(c, did, b"again")).error == "NotYourTurn"
    for chooser in (solver.choose, out.choose):
        assert revert(chooser, did, 1, m1).error == "NotYourTurn"
    e = revert(chal.choose, did, FANOUT, m1)
    assert (e.error, e.error_args) == ("NoSuchPart", {"part": FANOUT, "parts": FANOUT})
    forged = [m1[0], keccak(b"forged"), m1[2]]
    e = revert(chal.choose, did, 1, forged)
    assert e.error == "MidsMismatch" and e.error_args["posted"] == d.mids_root
    assert revert(chal.choose, did, 1, m1[:2]).error == "MidsMismatch"

    pts = d.points
    r = chal.choose(did, 1, m1)  # accepts the state at p1, disputes the one at p2
    (e,) = ev(c, r, "RangeNarrowed")
    assert (e["lo"], e["hi"], e["loHash"], e["hiHash"]) == (pts[1], pts[2], m1[0], m1[1])
    d = state(c, did)
    assert (d.lo, d.hi, d.lo_hash, d.hi_hash, d.mids_root, d.turn, d.rounds) == (
        pts[1], pts[2], m1[0], m1[1], ZERO, Side.SOLVER, 1)
    assert d.phase == Phase.BISECTION and not ev(c, r, "JuryDrawn")
    assert d.mid_steps == [pts[1] + 1, pts[1] + 2, pts[1] + 3]

    m2 = mids(c, did)
    solver.post_mids(did, m2)
    r = chal.choose(did, FANOUT - 1, m2)  # the last part: accepts every mid
    d = state(c, did)
    assert (d.lo, d.hi, d.lo_hash, d.hi_hash) == (pts[2] - 1, pts[2], m2[-1], m1[1])
    assert d.rounds == 2 and d.mid_steps == []
    assert d.phase == Phase.COMMIT and len(ev(c, r, "JuryDrawn")) == 1
    assert d.jury_seed not in (ZERO, d.lo_hash, d.hi_hash)

    # bisection is over
    moves: list[tuple[Callable[..., Any], tuple[Any, ...]]] = [
        (solver.post_mids, ([keccak(b"m3")],)), (chal.choose, (0, m2)), (out.timeout, ())]
    for fn, args in moves:
        e = revert(fn, did, *args)
        assert (e.error, e.error_args) == ("WrongPhase", {"id": did, "phase": Phase.COMMIT})
    assert revert(out.abort_moot, did).error == "DisputeStillLive"
    assert revert(out.commit_vote, did, True, ZERO).error == "NotJuror"
    check_books(c)


@pytest.mark.parametrize("parts_seq", [[0, 0], [3, 0], [0, 3], [2, 1]])
def test_every_part_choice_keeps_the_ends_the_solver_posted(c: LocalChain,
                                                           parts_seq: list[int]) -> None:
    """Whichever parts are chosen, the final one-step range's end hashes are the start
    state, a posted mid or the disputed end state, at the matching steps (the three
    rotating hash words never lose one)."""
    job = new_job(c, attest=())
    did = challenge(c, job)
    known = {SEG * K: job.leaves[SEG].state_hash, (SEG + 1) * K: job.leaves[SEG + 1].state_hash}
    for part in parts_seq:
        d = state(c, did)
        hs = mids(c, did)
        known.update(zip(d.mid_steps, hs, strict=True))
        c[SOLVER_I].dispute.post_mids(did, hs)
        c[CHAL].dispute.choose(did, part, hs)
        nd = state(c, did)
        assert (nd.lo, nd.hi) == (d.points[part], d.points[part + 1])
        assert (nd.lo_hash, nd.hi_hash) == (known[nd.lo], known[nd.hi])
    assert state(c, did).phase == Phase.COMMIT


def test_uneven_ranges_and_plain_bisection(c: LocalChain) -> None:
    """A game deployed with fanout 2 is the classic bisection; ranges that do not
    divide evenly use p_j = lo + span * j // parts, and a short range uses every step."""
    c2 = deploy_game(c.anvil, PARAMS.model_copy(update={"dispute": PARAMS.dispute.model_copy(
        update={"fanout": 2})}))
    job = new_job(c2, k=10, attest=())
    did = challenge(c2, job)
    seen = []
    while (d := state(c2, did)).phase == Phase.BISECTION:
        span = d.hi - d.lo
        assert d.mid_steps == [d.lo + span // 2]
        seen.append((d.lo, d.hi))
        hs = mids(c2, did)
        c2[SOLVER_I].dispute.post_mids(did, hs)
        c2[CHAL].dispute.choose(did, 1, hs)
    assert seen == [(10, 20), (15, 20), (17, 20), (18, 20)] and (d.lo, d.hi) == (19, 20)

    # fanout 4 over 10 steps: 2, 5, 7; then part [5, 7] has two parts, one mid
    job = new_job(c, k=10, attest=())
    did = challenge(c, job)
    assert state(c, did).mid_steps == [12, 15, 17]
    hs = mids(c, did)
    c[SOLVER_I].dispute.post_mids(did, hs)
    c[CHAL].dispute.choose(did, 2, hs)
    d = state(c, did)
    assert (d.lo, d.hi, d.mid_steps) == (15, 17, [16])
    e = revert(c[SOLVER_I].dispute.post_mids, did, hs)
    assert e.error_args == {"given": 3, "expected": 1}


def test_single_step_segment_draws_the_jury_at_open(c: LocalChain) -> None:
    job = new_job(c, k=1, attest=())
    did = challenge(c, job)
    d = state(c, did)
    assert (d.lo, d.hi, d.rounds, d.phase) == (SEG, SEG + 1, 0, Phase.COMMIT)
    assert len(d.jury) == c.reader.dispute.call("params").jurySize
    assert d.mid_steps == []
    e = revert(c[SOLVER_I].dispute.post_mids, did, [keccak(b"m")])
    assert (e.error, e.error_args["phase"]) == ("WrongPhase", Phase.COMMIT)


# --- chess clock ---------------------------------------------------------------------------


def test_chess_clock_runs_only_for_the_side_to_move(c: LocalChain) -> None:
    clock = c.reader.dispute.call("params").clock
    job = new_job(c, attest=())
    r = c[CHAL].market.transact("challenge", job.id, SEG, job.leaves[SEG].state_hash,
                                job.leaves[SEG].loss_e9, job.tree.proof(SEG),
                                job.leaves[SEG + 1].state_hash, job.leaves[SEG + 1].loss_e9,
                                job.tree.proof(SEG + 1))
    did = c.reader.market.event_arg(r, "Challenged", "disputeId")
    t0 = ts_of(c, r)
    solver, chal, out = c[SOLVER_I].dispute, c[CHAL].dispute, c[OUTSIDER].dispute

    mine_at(c, t0 + 3)
    d = state(c, did)
    assert (d.solver_clock_left, d.challenger_clock_left) == (clock - 3, clock)

    next_ts(c, t0 + 7)  # solver thinks 7 s
    m1 = mids(c, did)
    r = solver.post_mids(did, m1)
    assert ev(c, r, "MidsPosted")[0]["solverClockLeft"] == clock - 7
    mine_at(c, t0 + 27)  # challenger thinks 20 s: only its clock runs
    d = state(c, did)
    assert (d.solver_clock_left, d.challenger_clock_left) == (clock - 7, clock - 20)
    e = revert(out.timeout, did)
    assert (e.error, e.error_args) == ("ClockNotExpired", {"id": did,
                                                           "expiresAt": t0 + 7 + clock})
    next_ts(c, t0 + 32)
    r = chal.choose(did, 1, m1)
    assert ev(c, r, "RangeNarrowed")[0]["challengerClockLeft"] == clock - 25
    mine_at(c, t0 + 62)  # solver thinks 30 s more
    d = state(c, did)
    assert (d.solver_clock_left, d.challenger_clock_left) == (clock - 37, clock - 25)

    expires = t0 + 32 + clock - 7
    e = revert(out.timeout, did)
    assert e.error_args == {"id": did, "expiresAt": expires}
    next_ts(c, expires - 1)
    assert revert(out.timeout, did).error == "ClockNotExpired"
    snap = c.snapshot()
    next_ts(c, expires - 1)  # the last second still belongs to the solver
    r = solver.post_mids(did, mids(c, did))
    assert ev(c, r, "MidsPosted")[0]["solverClockLeft"] == 1
    c.revert(snap)

    next_ts(c, expires)  # out of time: a move can no longer steal the win ...
    e = revert(solver.post_mids, did, mids(c, did))
    assert (e.error, e.error_args) == ("ClockExpired", {"id": did})
    next_ts(c, expires)  # ... but the timeout is claimable at that very second
    r = out.timeout(did)
    assert ts_of(c, r) == expires
    assert ev(c, r, "TimedOut")[0]["loser"] == Side.SOLVER
    d = state(c, did)
    assert (d.phase, d.solver_won, d.solver_clock_left) == (Phase.RESOLVED, False, 0)
    assert d.challenger_clock_left == clock - 25


# --- timeouts -------------------------------------------------------------------------------


def test_solver_out_of_time_loses(c: LocalChain) -> None:
    clock = c.reader.dispute.call("params").clock
    m = c.reader.market
    job = new_job(c)
    did = challenge(c, job)
    out = c[OUTSIDER].dispute
    assert revert(out.timeout, did).error == "ClockNotExpired"
    before, escrow = worth(c), m.totalEscrow()
    c.advance(clock)
    e = revert(c[SOLVER_I].dispute.post_mids, did, mids(c, did))
    assert (e.error, e.error_args) == ("ClockExpired", {"id": did})
    d = state(c, did)
    assert d.solver_clock_left == 0 and d.challenger_clock_left == clock
    r = out.timeout(did)
    assert ev(c, r, "TimedOut")[0]["loser"] == Side.SOLVER
    (res,) = ev(c, r, "DisputeResolved")
    assert (res["solverWon"], res["slashedBond"]) == (False, job.bond)

    value, cred = expected(c, d, job, solver_won=False, majority=(), losers=(),
                           attestors=[addr(c, i) for i in ATTESTORS])
    assert diff(before, worth(c)) == value
    assert game_credits(c) == cred
    att = int(c.reader.registry.call("minVerifierStake")) * \
        m.market_params().attestor_slash_bps // BPS
    assert m.credits(addr(c, CHAL)) == len(ATTESTORS) * att
    j = m.get_job(job.id)
    assert (j.status, j.solver, j.bond, j.open_disputes, j.round) == (
        JobStatus.OPEN, "0x" + "00" * 20, 0, 0, 1)
    assert m.totalEscrow() == escrow == REWARD + BUDGET  # the escrow stays for the next solver
    assert c.reader.registry.locked_stake(addr(c, SOLVER_I)) == 0
    assert c.reader.registry.locked_stake(addr(c, CHAL)) == 0  # the challenge bond is back
    assert not m.isDisputeLive(did)
    assert revert(out.timeout, did).error == "WrongPhase"
    check_books(c)
    withdraw_all(c, [r])
    check_books(c)
    c[SOLVER_I].market.claim_job(job.id)  # reopened: claimable again, a new round
    assert m.get_job(job.id).round == 2


def test_challenger_out_of_time_loses_and_the_segment_is_upheld(c: LocalChain) -> None:
    clock = c.reader.dispute.call("params").clock
    m = c.reader.market
    job = new_job(c)
    did = challenge(c, job)
    hs = mids(c, did)
    c[SOLVER_I].dispute.post_mids(did, hs)
    out = c[OUTSIDER].dispute
    assert revert(out.timeout, did).error == "ClockNotExpired"
    before = worth(c)
    c.advance(clock)
    e = revert(c[CHAL].dispute.choose, did, 0, hs)
    assert (e.error, e.error_args) == ("ClockExpired", {"id": did})
    d = state(c, did)
    r = out.timeout(did)
    assert ev(c, r, "TimedOut")[0]["loser"] == Side.CHALLENGER
    assert ev(c, r, "DisputeResolved")[0]["solverWon"] is True
    assert state(c, did).challenger_clock_left == 0

    value, cred = expected(c, d, job, solver_won=True, majority=(), losers=())
    assert value == {addr(c, CHAL): -m.market_params().challenge_bond,
                     addr(c, SOLVER_I): m.market_params().challenge_bond}
    assert diff(before, worth(c)) == value and game_credits(c) == cred
    j = m.get_job(job.id)
    assert (j.status, j.open_disputes) == (JobStatus.COMMITTED, 0)
    assert m.isUpheld(job.id, SEG) and not m.isUpheld(job.id, SEG + 1)
    e = revert(challenge, c, job, CHAL2)
    assert (e.error, e.error_args) == ("SegmentAlreadyUpheld", {"segment": SEG})
    challenge(c, job, CHAL2, SEG + 1)  # another segment can still be disputed
    check_books(c)
    withdraw_all(c, [r])


# --- jury -----------------------------------------------------------------------------------


def test_jury_draw_excludes_the_parties_and_is_reproducible(c: LocalChain) -> None:
    out = c[OUTSIDER]
    out.registry.register(VERIFIER, "12D3KooWout", [], "{}")  # listed, but no stake
    assert not out.registry.is_verifier(addr(c, OUTSIDER))
    g = c.reader.dispute
    p = g.call("params")
    job = new_job(c, attest=())
    did = challenge(c, job)
    r = bisect(c, did)
    d = state(c, did)
    (e,) = ev(c, r, "JuryDrawn")
    n = r["blockNumber"]
    seed = keccak(abi_encode(["bytes32", "uint256"],
                             [bytes(c.w3.eth.get_block(n - 1)["hash"]), did]))
    assert e["jurySeed"] == d.jury_seed == seed
    assert list(e["jury"]) == d.jury == list(g.drawJury(seed, d.solver, d.challenger))
    assert d.jury == py_draw_jury(c, seed, d.solver, d.challenger)
    assert len(d.jury) == len(set(d.jury)) == p.jurySize
    assert not {d.solver, d.challenger, out.address} & set(d.jury)
    assert d.commit_end == ts_of(c, r) + p.commitWindow
    assert d.reveal_end == d.commit_end + p.revealWindow
    assert (e["commitEnd"], e["revealEnd"]) == (d.commit_end, d.reveal_end)
    for a in c.addresses:
        assert g.is_juror(did, a) == (a in d.jury)

    # the rule, for any seed: same as the Python re-draw, parties and the unstaked excluded
    solver, chal = addr(c, SOLVER_I), addr(c, CHAL)
    for i in range(12):
        s = keccak(b"seed%d" % i)
        jury = list(g.drawJury(s, solver, chal))
        assert jury == py_draw_jury(c, s, solver, chal)
        assert len(jury) == p.jurySize and not {solver, chal, out.address} & set(jury)
    # fewer eligible verifiers than seats: everyone eligible, no more
    for i in VERIFIERS:
        c[i].registry.update_node(SOLVER, f"12D3KooWdev{i}", [], "{}")
    assert list(g.drawJury(seed, solver, chal)) == [addr(c, CHAL2)]
    assert list(g.drawJury(seed, solver, addr(c, CHAL2))) == [chal]


def test_commit_reveal_rules(c: LocalChain) -> None:
    job = new_job(c, attest=())
    did = challenge(c, job)
    bisect(c, did)
    d = state(c, did)
    j0, j1, j2 = d.jury
    g0, g1, g2 = (c[idx(c, j)].dispute for j in d.jury)
    out = c[OUTSIDER].dispute

    for who in (SOLVER_I, CHAL, OUTSIDER):
        e = revert(c[who].dispute.commit_vote, did, False, salt(addr(c, who)))
        assert (e.error, e.error_args) == ("NotJuror", {"caller": addr(c, who)})
    assert revert(g0.transact, "commitVote", did, ZERO).error == "ZeroHash"
    r = g0.commit_vote(did, True, salt(j0))
    assert ev(c, r, "VoteCommitted")[0]["juror"] == j0
    assert revert(g0.commit_vote, did, False, salt(j0)).error == "AlreadyCommitted"
    e = revert(g0.reveal_vote, did, True, salt(j0))
    assert (e.error, e.error_args) == ("RevealNotOpen", {"commitEnd": d.commit_end,
                                                         "revealEnd": d.reveal_end})
    e = revert(out.resolve, did)
    assert (e.error, e.error_args) == ("RevealNotOver", {"revealEnd": d.reveal_end})
    g1.commit_vote(did, True, salt(j1))
    assert state(c, did).phase == Phase.COMMIT

    next_ts(c, d.commit_end)  # the commit window is [draw, commitEnd)
    e = revert(g2.commit_vote, did, False, salt(j2))
    assert (e.error, e.error_args) == ("CommitClosed", {"commitEnd": d.commit_end})
    mine_at(c, d.commit_end)
    assert state(c, did).phase == Phase.REVEAL
    assert revert(g2.reveal_vote, did, False, salt(j2)).error == "NoCommitment"
    assert revert(out.reveal_vote, did, True, salt(j0)).error == "NotJuror"
    assert revert(g0.reveal_vote, did, True, salt(j1)).error == "BadReveal"  # wrong salt
    assert revert(g0.reveal_vote, did, False, salt(j0)).error == "BadReveal"  # wrong vote
    assert revert(g1.reveal_vote, did, True, salt(j0)).error == "BadReveal"  # another's
    r = g0.reveal_vote(did, True, salt(j0))
    assert ev(c, r, "VoteRevealed")[0]["valid"] is True
    assert revert(g0.reveal_vote, did, True, salt(j0)).error == "AlreadyRevealed"
    next_ts(c, d.reveal_end - 1)
    assert revert(out.resolve, did).error == "RevealNotOver"
    mine_at(c, d.reveal_end)  # reveals closed: j1 keeps its vote to itself
    assert revert(g1.reveal_vote, did, True, salt(j1)).error == "RevealNotOpen"

    v = state(c, did).votes
    assert (v[0].revealed, v[0].valid, v[1].revealed, v[2].commitment) == (True, True, False,
                                                                           ZERO)
    assert v[1].commitment == g1.call("voteOf", did, j1).commitment != ZERO
    before = worth(c)
    r = out.resolve(did)
    value, cred = expected(c, d, job, solver_won=True, majority=[j0], losers=[j1, j2])
    assert diff(before, worth(c)) == value and game_credits(c) == cred
    assert {e["juror"] for e in ev(c, r, "JurorSlashed")} == {j1, j2}
    assert state(c, did).phase == Phase.RESOLVED
    for fn, args in ((g2.commit_vote, (True, salt(j2))), (g1.reveal_vote, (True, salt(j1))),
                     (out.resolve, ()), (out.abort_moot, ())):
        e = revert(fn, did, *args)
        assert (e.error, e.error_args) == ("WrongPhase", {"id": did, "phase": Phase.RESOLVED})
    withdraw_all(c, [r])


# --- settlement -------------------------------------------------------------------------------


def test_majority_invalid_slashes_the_solver_and_reopens_the_job(c: LocalChain) -> None:
    m, reg = c.reader.market, c.reader.registry
    job = new_job(c)
    did = challenge(c, job)
    bisect(c, did, lower=False)
    d = state(c, did)
    escrow, before = m.totalEscrow(), worth(c)
    r = run_jury(c, did, [False, False, True])
    (res,) = ev(c, r, "DisputeResolved")
    assert (res["solverWon"], res["validVotes"], res["invalidVotes"], res["slashedBond"]) == (
        False, 1, 2, job.bond)
    atts = [addr(c, i) for i in ATTESTORS]
    value, cred = expected(c, d, job, solver_won=False, majority=d.jury[:2],
                           losers=d.jury[2:], attestors=atts)
    assert diff(before, worth(c)) == value
    assert game_credits(c) == cred
    minv = int(reg.call("minVerifierStake"))
    cut = minv * c.reader.dispute.call("params").jurorSlashBps // BPS
    assert [(e["juror"], e["amount"]) for e in ev(c, r, "JurorSlashed")] == [(d.jury[2], cut)]
    att = minv * m.market_params().attestor_slash_bps // BPS
    slashed = [(e["attestor"], e["amount"], e["beneficiary"])
               for e in ev(c, r, "AttestorSlashed", "market")]
    assert slashed == [(a, att, d.challenger) for a in atts]
    assert m.credits(d.challenger) == len(atts) * att

    j = m.get_job(job.id)
    assert (j.status, j.bond, j.open_disputes, j.trace_root) == (JobStatus.OPEN, 0, 0, ZERO)
    assert m.totalEscrow() == escrow
    assert reg.locked_stake(d.solver) == 0 and reg.locked_stake(d.challenger) == 0
    assert not m.isDisputeLive(did) and m.disputeRef(did).settled
    check_books(c)
    withdraw_all(c, [r])
    assert c[CHAL].market.withdraw() == len(atts) * att
    check_books(c)


def test_majority_valid_pays_the_solver_and_upholds_the_segment(c: LocalChain) -> None:
    m = c.reader.market
    job = new_job(c)
    did = challenge(c, job)
    bisect(c, did)
    d = state(c, did)
    before = worth(c)
    r = run_jury(c, did, [True, HIDE, True])  # j1 committed but never revealed
    (res,) = ev(c, r, "DisputeResolved")
    cb = m.market_params().challenge_bond
    assert (res["solverWon"], res["validVotes"], res["invalidVotes"], res["slashedBond"]) == (
        True, 2, 0, cb)
    value, cred = expected(c, d, job, solver_won=True, majority=[d.jury[0], d.jury[2]],
                           losers=[d.jury[1]])
    assert diff(before, worth(c)) == value and game_credits(c) == cred
    assert [e["juror"] for e in ev(c, r, "JurorSlashed")] == [d.jury[1]]
    assert not ev(c, r, "AttestorSlashed", "market")
    assert state(c, did).solver_won
    assert m.isUpheld(job.id, SEG)
    e = revert(challenge, c, job, CHAL2)
    assert (e.error, e.error_args) == ("SegmentAlreadyUpheld", {"segment": SEG})
    assert m.get_job(job.id).status == JobStatus.COMMITTED
    check_books(c)
    withdraw_all(c, [r])
    c.advance(m.market_params().verification_window)
    c[OUTSIDER].market.finalize(job.id)  # no live dispute left: the job pays out
    assert m.credits(d.solver) == REWARD
    check_books(c)


@pytest.mark.parametrize("ballots", [
    pytest.param([True, False, None], id="tie-1-1"),
    pytest.param([HIDE, HIDE, HIDE], id="no-reveals"),
    pytest.param([None, None, None], id="no-commits"),
    pytest.param([True, True, True], id="unanimous-valid"),
])
def test_ties_and_silence_uphold_the_solver(c: LocalChain, ballots: list[Ballot]) -> None:
    job = new_job(c)
    did = challenge(c, job)
    bisect(c, did)
    d = state(c, did)
    before = worth(c)
    r = run_jury(c, did, ballots)
    majority = [j for j, b in zip(d.jury, ballots, strict=True) if b is True]
    losers = [j for j in d.jury if j not in majority]
    value, cred = expected(c, d, job, solver_won=True, majority=majority, losers=losers)
    assert diff(before, worth(c)) == value and game_credits(c) == cred
    assert ev(c, r, "DisputeResolved")[0]["solverWon"] is True
    assert sorted(e["juror"] for e in ev(c, r, "JurorSlashed")) == sorted(losers)
    assert c.reader.market.isUpheld(job.id, SEG)
    withdraw_all(c, [r])


def test_second_dispute_is_moot_once_the_first_proves_the_job_invalid(c: LocalChain) -> None:
    m, reg = c.reader.market, c.reader.registry
    cb = m.market_params().challenge_bond
    job = new_job(c, attest=(1, 2))
    third = VERIFIERS[-1]
    a = challenge(c, job, CHAL, 1)
    b = challenge(c, job, CHAL2, 2)
    cc = challenge(c, job, third, 3)
    assert m.get_job(job.id).open_disputes == 3
    out = c[OUTSIDER].dispute
    for did in (a, b, cc):
        e = revert(out.abort_moot, did)
        assert (e.error, e.error_args) == ("DisputeStillLive", {"id": did})
    bisect(c, a)
    bisect(c, b)  # b waits in its commit phase, cc in bisection (solver to move)
    da = state(c, a)
    before = worth(c)
    free_b, free_c = reg.free_stake(addr(c, CHAL2)), reg.free_stake(addr(c, third))
    assert reg.locked_stake(addr(c, CHAL2)) == cb
    r = run_jury(c, a, [False, False, False])
    assert ev(c, r, "DisputeResolved")[0]["solverWon"] is False
    assert m.get_job(job.id).status == JobStatus.OPEN
    assert not m.isDisputeLive(b) and not m.isDisputeLive(cc)

    # b: anyone aborts it; the bond comes back, nobody is paid or slashed
    rb = out.abort_moot(b)
    assert ev(c, rb, "DisputeMooted") and not ev(c, rb, "Credited")
    assert state(c, b).phase == Phase.MOOT
    assert reg.locked_stake(addr(c, CHAL2)) == 0
    assert reg.free_stake(addr(c, CHAL2)) == free_b + cb
    e = revert(out.abort_moot, b)
    assert (e.error, e.error_args) == ("WrongPhase", {"id": b, "phase": Phase.MOOT})
    jb = state(c, b).jury[0]
    assert revert(c[idx(c, jb)].dispute.commit_vote, b, True, ZERO).error == "WrongPhase"
    # cc: its solver ran out of clock meanwhile, but the timeout only moots it
    rc = out.timeout(cc)
    assert ev(c, rc, "DisputeMooted") and not ev(c, rc, "TimedOut")
    assert not ev(c, rc, "Credited")
    assert state(c, cc).phase == Phase.MOOT
    assert reg.free_stake(addr(c, third)) == free_c + cb
    assert revert(out.resolve, cc).error == "WrongPhase"

    # only dispute a moved money
    value, cred = expected(c, da, job, solver_won=False, majority=da.jury, losers=(),
                           attestors=[addr(c, i) for i in ATTESTORS])
    assert diff(before, worth(c)) == value and game_credits(c) == cred
    check_books(c)
    withdraw_all(c, [r, rb, rc])
    check_books(c)
