"""DisputeGame against anvil: every transition and revert, the chess clock, the
jury request and draw, commit-reveal, each verdict (Valid, Invalid,
SolverTimedOut, Void), the one settlement per round that the market makes
afterwards (``finalize``, which also pays the round's one winner: the
earliest-opened dispute the solver lost), and that the pull payments add up to
exactly the tokens that moved (burned tokens included).

The module deploys its own contracts on the session anvil (``anvil`` fixture)
with a verification window longer than a whole dispute, so a dispute's end and
the round's settlement are separate steps, and with 20 funded accounts: 14
verifiers at the sortition cap besides the parties, so a committee of 3 and a
jury of 3 are always filled however the seed falls (the draws are random:
every test reads the committee and the jury from the chain and re-derives them
in Python from the documented rule). Each test runs in an anvil snapshot that
is reverted afterwards. Time is moved with ``evm_setNextBlockTimestamp`` /
``evm_mine`` so clock boundaries are exact.
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
from devnet.testing import (
    LocalChain,
    expect_revert,
    fake_trace,
    job_terms,
    py_sortition,
    set_balance,
)
from node.chain.artifacts import artifacts_dir
from node.chain.contracts import (
    SOLVER,
    VERIFIER,
    DisputeState,
    JobStatus,
    Phase,
    Side,
    Verdict,
    mids_commitment,
    range_root,
    vote_commitment,
)
from node.chain.ids import DisputeId, JobId
from node.chain.rpc import make_web3
from node.errors import ChainError
from node.proof import MerkleTree, TraceLeaf

BPS = 10_000
ZERO = bytes(32)
ZERO_ADDR = "0x" + "00" * 20
BURN = "0x000000000000000000000000000000000000dEaD"
# Odd wei amounts so that every bps split and pool division leaves rounding dust.
REWARD, BUDGET, DURATION = 100 * TOKEN + 7, 30 * TOKEN + 1, 3600
# sampleCount (7) >= SEGMENTS: every segment is sampled. k = 16 with fanout 4: two rounds
# of three mids (16 -> 4 -> 1 steps), so first, middle and last parts are all reachable.
SEGMENTS, K, FANOUT = 4, 16, 4
SEG = 1  # the segment disputed by default

# dev accounts: 0 deploys; the rest play these roles
N_ACCOUNTS = 20
SOLVER_I, CHAL, CHAL2, SUBMITTER, OUTSIDER = 1, 2, 3, 4, 5
VERIFIERS = tuple(range(6, N_ACCOUNTS))
VERIFIER_STAKE = 200 * TOKEN  # = the sortition cap: every draw attempt on one is accepted

PARAMS = DevnetParams.model_validate({
    "accounts": N_ACCOUNTS,
    "registry": {"unbond_delay": 7200},  # > window + grace + a whole dispute (the game checks)
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
    accts = dev_accounts(N_ACCOUNTS)
    w3 = make_web3(anvil.url)
    for a in accts:  # the session anvil funds only its first 10 accounts with ether
        set_balance(w3, a.address, 10**24)
    dep = deploy_all(w3, accts[0], params, fund=accts, rpc_url=anvil.url)
    c = LocalChain(anvil, dep)
    c.join(SOLVER_I, SOLVER | VERIFIER, 500 * TOKEN)  # a verifier too: the draws must skip it
    for i in (CHAL, CHAL2, *VERIFIERS):
        c.join(i, VERIFIER, VERIFIER_STAKE)
    return c


@pytest.fixture
def c(dchain: LocalChain) -> Iterator[LocalChain]:
    snap = dchain.snapshot()
    try:
        yield dchain
    finally:
        dchain.revert(snap)


# --- helpers ------------------------------------------------------------------------


revert = expect_revert


def next_ts(c: LocalChain, t: int) -> None:
    """The next mined block (and the 'pending' block that gas estimation runs on) has time t."""
    c.rpc("evm_setNextBlockTimestamp", t)


def mine_at(c: LocalChain, t: int) -> None:
    c.rpc("evm_mine", t)


def ts_of(c: LocalChain, r: TxReceipt) -> int:
    return int(c.w3.eth.get_block(r["blockNumber"])["timestamp"])


def idx(c: LocalChain, a: str) -> int:
    return c.addresses.index(a)


def addr(c: LocalChain, i: int) -> str:
    return c.addresses[i]


def state(c: LocalChain, did: DisputeId) -> DisputeState:
    return c.reader.dispute.get_dispute(did)


def gp(c: LocalChain) -> Any:
    """The game's Params (web3 struct, camelCase)."""
    return c.reader.dispute.call("params")


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
    id: JobId
    leaves: list[TraceLeaf]
    tree: MerkleTree
    bond: int
    committee: list[str]
    attestors: list[str]


def new_job(c: LocalChain, k: int = K, attest: bool = True, segments: int = SEGMENTS,
            reward: int = REWARD) -> Job:
    """Post, claim and commit a job, fix its seed (drawing the committee); the committee
    attests unless ``attest`` is false. CHAL and CHAL2 touch their stake right after the
    commit, so the committee (drawn from stake as of the commit block) never seats them:
    the default challengers are never attestors of the job they dispute."""
    m = c.reader.market
    job = c[SUBMITTER].post_job(job_terms(reward, BUDGET, DURATION, segments, k))
    solver = c[SOLVER_I]
    solver.market.claim_job(job)
    leaves, tree = fake_trace(job, segments, k, tag=f"job{job}-")
    solver.market.commit_trace(job, leaves, tree)
    for i in (CHAL, CHAL2):
        c[i].stake(1)
    c.mine(m.market_params().sample_lookahead + 1)
    c[OUTSIDER].market.fix_seed(job)
    committee = m.committee_of(job)
    assert len(committee) == m.market_params().attestors_per_job
    assert not {addr(c, SOLVER_I), addr(c, CHAL), addr(c, CHAL2)} & set(committee)
    if attest:
        for a in committee:
            c[idx(c, a)].market.attest(job)
    return Job(job, leaves, tree, m.get_job(job).bond, list(committee),
               list(m.attestors_of(job)))


def liable(c: LocalChain, job: Job, *segs: int) -> list[str]:
    """The attestors slashed when a jury finds ``segs`` invalid: each sampled segment's
    committee seat (its sample position modulo the seats), if that seat attested."""
    sample = c.reader.market.sampled_segments(job.id)
    hit = {sample.index(s) % len(job.committee) for s in segs if s in sample}
    return [a for i, a in enumerate(job.committee) if i in hit and a in job.attestors]


def challenge(c: LocalChain, job: Job, who: int = CHAL, seg: int = SEG) -> DisputeId:
    return c[who].market.challenge(job.id, seg, job.leaves[seg], job.tree.proof(seg),
                                   job.leaves[seg + 1], job.tree.proof(seg + 1))


def mids(c: LocalChain, did: DisputeId, tag: bytes = b"") -> list[bytes]:
    """Mid hashes for the dispute's current ``mid_steps``."""
    return [keccak(b"mid-%d-%d%s" % (did, t, tag)) for t in state(c, did).mid_steps]


def bisect(c: LocalChain, did: DisputeId, lower: bool = True) -> TxReceipt:
    """Play the bisection down to one step, always disputing the first part (``lower``)
    or the last; returns the receipt that asked for the jury."""
    d = state(c, did)
    solver, chal = c[idx(c, d.solver)].dispute, c[idx(c, d.challenger)].dispute
    r: TxReceipt | None = None
    while d.phase == Phase.BISECTION:
        hs = mids(c, did)
        solver.post_mids(did, hs)
        r = chal.choose(did, 0 if lower else len(hs), hs)
        d = state(c, did)
    assert r is not None and d.phase == Phase.DRAWING
    return r


def draw(c: LocalChain, did: DisputeId) -> TxReceipt:
    """Mine up to the dispute's seed block, then an outsider draws the jury."""
    d = state(c, did)
    assert d.phase == Phase.DRAWING
    behind = d.draw_block - int(c.w3.eth.block_number)
    if behind > 0:
        c.mine(behind)
    return c[OUTSIDER].dispute.draw_jury(did)


def to_jury(c: LocalChain, did: DisputeId, lower: bool = True) -> TxReceipt:
    """Bisect and draw; returns the draw's receipt (a full jury is asserted)."""
    bisect(c, did, lower)
    r = draw(c, did)
    d = state(c, did)
    assert d.phase == Phase.COMMIT and len(d.jury) == gp(c).jurySize
    return r


def salt(juror: str) -> bytes:
    return keccak(b"salt" + bytes.fromhex(juror[2:]))


HIDE = "hide"  # commit (valid) but never reveal
Ballot = bool | str | None  # True / False: commit and reveal; HIDE; None: never commit


def run_jury(c: LocalChain, did: DisputeId, ballots: Sequence[Ballot]) -> TxReceipt:
    """Jurors (in ``jury`` order) vote per ``ballots``; then resolve at revealEnd, unless
    every juror revealed: then the last reveal settled it, and its receipt is returned."""
    d = state(c, did)
    for juror, b in zip(d.jury, ballots, strict=True):
        if b is not None:
            c[idx(c, juror)].dispute.commit_vote(did, b is True, salt(juror))
    mine_at(c, d.commit_end)
    last = None
    for juror, b in zip(d.jury, ballots, strict=True):
        if isinstance(b, bool):
            last = c[idx(c, juror)].dispute.reveal_vote(did, b, salt(juror))
    if last is not None and all(isinstance(b, bool) for b in ballots):
        assert state(c, did).phase == Phase.RESOLVED and ev(c, last, "DisputeResolved")
        return last
    mine_at(c, d.reveal_end)
    return c[OUTSIDER].dispute.resolve(did)


def finalize(c: LocalChain, job: Job) -> TxReceipt:
    """At the (possibly extended) window end, an outsider finalizes."""
    end = c.reader.market.get_job(job.id).window_end
    if c.timestamp() < end:
        mine_at(c, end)
    return c[OUTSIDER].market.finalize(job.id)


def requested(c: LocalChain, r: TxReceipt) -> tuple[int, int, int]:
    """(request block Q, draw block Q + lookahead, pool length) of the JuryRequested in r."""
    (e,) = ev(c, r, "JuryRequested")
    return r["blockNumber"], e["drawBlock"], e["poolLen"]


def jury_seed(c: LocalChain, draw_block: int, did: DisputeId) -> bytes:
    bh = bytes(c.w3.eth.get_block(draw_block)["hash"])
    return keccak(abi_encode(["bytes32", "uint256"], [bh, did]))


# --- money ----------------------------------------------------------------------------

_PER_ACCOUNT = (("token", "balanceOf"), ("registry", "freeStake"), ("registry", "lockedStake"),
                ("registry", "unbondingStake"), ("registry", "seatLockedStake"),
                ("market", "credits"), ("dispute", "credits"))


def holders(c: LocalChain) -> list[str]:
    return [*c.addresses, BURN]


def worth(c: LocalChain) -> dict[str, int]:
    """Per account (and the burn address): tokens + every stake bucket + market and game
    credits."""
    r = c.reader
    calls = [(getattr(r, b), fn, (a,)) for a in holders(c) for b, fn in _PER_ACCOUNT]
    out = uints(c, calls)
    n = len(_PER_ACCOUNT)
    return {a: sum(out[i * n:(i + 1) * n]) for i, a in enumerate(holders(c))}


def check_books(c: LocalChain) -> None:
    """Each contract holds exactly what it owes; no token outside accounts, contracts and
    the burn address; the burn address holds exactly what the game and the market
    (attestor slashes) burned."""
    r = c.reader
    cons = (r.registry, r.market, r.dispute)
    out = uints(c, [(r.token, "balanceOf", (b.address,)) for b in cons]
                + [(b, "totalOwed", ()) for b in cons] + [(r.token, "totalSupply", ())]
                + [(r.token, "balanceOf", (a,)) for a in holders(c)])
    held, owed, supply, wallets = out[0:3], out[3:6], out[6], out[7:]
    assert held == owed, f"registry/market/game hold {held} but owe {owed}"
    assert sum(held) + sum(wallets) == supply
    assert wallets[-1] == r.dispute.total_burned() + r.market.total_burned()


def diff(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {a: after[a] - before[a] for a in after if after[a] != before[a]}


def nonzero(d: Counter[str] | dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in d.items() if v}


def game_credits(c: LocalChain) -> dict[str, int]:
    out = uints(c, [(c.reader.dispute, "credits", (a,)) for a in c.addresses])
    return {a: v for a, v in zip(c.addresses, out, strict=True) if v}


def juror_cut(c: LocalChain, job: Job) -> int:
    """What a silent or minority juror loses: (solver bond + challenge bond) * bps, seat-
    locked at the draw in whole gwei (the registry's SEAT_UNIT, rounded up)."""
    cb = c.reader.market.market_params().challenge_bond
    unit = int(c.reader.registry.call("SEAT_UNIT"))
    cut = (job.bond + cb) * gp(c).jurorSlashBps // BPS
    return -(-cut // unit) * unit


def split(pool: int, among: Sequence[str], out: Counter[str]) -> None:
    """The game's split: equal shares, the division dust to the first."""
    if not among:
        out[BURN] += pool
        return
    per = pool // len(among)
    out[among[0]] += pool - per * (len(among) - 1)
    for a in among[1:]:
        out[a] += per


def expected_resolve(c: LocalChain, d: DisputeState, job: Job, verdict: Verdict,
                     majority: Sequence[str] = (), losers: Sequence[str] = ()
                     ) -> tuple[dict[str, int], dict[str, int]]:
    """(worth deltas, game credits) that ending dispute ``d`` with ``verdict`` must produce,
    from the on-chain params. ``majority``: the jurors paid (on Void: those who revealed);
    ``losers``: the jurors slashed."""
    cb = c.reader.market.market_params().challenge_bond
    cut = juror_cut(c, job)
    value: Counter[str] = Counter()
    cred: Counter[str] = Counter()
    pool = cut * len(losers)
    held = 0
    for j in losers:
        value[j] -= cut
    if verdict == Verdict.VALID:
        # INVARIANT under test: not to the solver now; a share to the jury, half the rest
        # held in the game for the round's solver (settleDelay), the other half burned
        to_jury = cb * gp(c).jurorShareOfChallengerBondBps // BPS if majority else 0
        held = delay_share(cb - to_jury)
        value[d.challenger] -= cb
        value[BURN] += cb - to_jury - held
        pool += to_jury
    split(pool, majority, cred)
    burned = cred.pop(BURN, 0)
    value[BURN] += burned
    for a, v in cred.items():
        value[a] += v
    # ending a dispute only moves tokens (the held share stays in the game)
    assert sum(value.values()) == -held
    return nonzero(value), nonzero(cred)


def delay_share(rest: int) -> int:
    """DisputeGame.DELAY_SHARE_BPS of what a lost bond leaves after the jurors."""
    return rest * 5_000 // BPS


@dataclass
class RoundSplit:
    to_submitter: int
    per_challenger: int
    per_jury: int
    attestor_cut: int


def expected_round(c: LocalChain, job: Job, by_jury: bool,
                   attestors: Sequence[str] = ()) -> RoundSplit:
    """IJobMarket's split of a condemned round's bond, from the on-chain params: the
    submitter's share; the rest, plus the attestors' slashes, to the round's one winner
    (``by_jury``: its verdict was Invalid, so its majority jurors get the jurors' share;
    on the solver's clock the challenger gets that too)."""
    mp = c.reader.market.market_params()
    att = int(c.reader.registry.call("minVerifierStake")) * mp.attestor_slash_bps // BPS
    to_sub = job.bond * mp.submitter_share_bps // BPS
    jury_pot = job.bond * mp.juror_share_bps // BPS
    ch_pot = job.bond - to_sub - jury_pot  # the attestors' slashes are burned, not paid
    per_jury = jury_pot if by_jury else 0
    return RoundSplit(to_sub, ch_pot + jury_pot - per_jury, per_jury, att)


def assert_paid_in_finalize(c: LocalChain, job: Job, rf: TxReceipt, winner: DisputeId,
                            exp: RoundSplit) -> dict[str, int]:
    """``rf`` (finalize of a condemned round) settled the round and paid ``winner`` there:
    ``RewardPaid``, the round's record, and the market's credits: the submitter, the
    winner's challenger, then the jurors' share split over ``winner``'s majority (the
    game's ``majorityOf``). Returns the juror credits that finalize created."""
    m, g = c.reader.market, c.reader.dispute
    challenger = m.dispute_ref(winner).challenger
    assert challenger == g.challengerOf(winner) != ZERO_ADDR
    (rw,) = ev(c, rf, "RewardPaid", "market")
    assert (rw["disputeId"], rw["challenger"], rw["amount"], rw["juryAmount"]) == (
        winner, challenger, exp.per_challenger, exp.per_jury)
    (rs,) = ev(c, rf, "RoundSettled", "market")
    assert (rs["slashedBond"], rs["toSubmitter"], rs["perChallenger"], rs["perJury"]) == (
        job.bond, exp.to_submitter, exp.per_challenger, exp.per_jury)
    ri = m.round_info(job.id, m.dispute_ref(winner).round)
    assert (ri.condemned, ri.settled, ri.first_winner) == (True, True, winner)
    jury_cred: Counter[str] = Counter()
    if exp.per_jury:
        majority = majority_invalid(state(c, winner))
        assert majority  # the market only pays the jurors' share when they exist
        assert g.majorityOf(winner) == majority
        split(exp.per_jury, majority, jury_cred)
    # the market credits the submitter, the winner's challenger, then its majority jurors
    credited = [(e["account"], e["amount"]) for e in ev(c, rf, "Credited", "market")]
    assert credited == [(a, v) for a, v in ((addr(c, SUBMITTER), exp.to_submitter),
                                            (challenger, exp.per_challenger),
                                            *jury_cred.items()) if v]
    assert not ev(c, rf, "Credited")  # nothing through the game
    assert not ev(c, rf, "Burned")
    assert m.totalOwed() == m.totalEscrow() + m.totalCredits()
    # settled once: the job is Open again, a second finalize has nothing to settle
    e = revert(c[OUTSIDER].market.finalize, job.id)
    assert (e.error, e.error_args) == ("InvalidStatus", {"jobId": job.id,
                                                         "status": JobStatus.OPEN})
    return dict(jury_cred)


def majority_invalid(d: DisputeState) -> list[str]:
    return [j for j, v in zip(d.jury, d.votes, strict=True) if v.revealed and not v.valid]


def withdraw_all(c: LocalChain) -> None:
    """Everyone pulls their game and market credit; the pulls equal the credits and both
    contracts end owing nothing (the market still holds the open jobs' escrow)."""
    r = c.reader
    for which in ("dispute", "market"):
        bound = getattr(r, which)
        owed_total, pulled = bound.call("totalCredits"), 0
        for i, a in enumerate(c.addresses):
            owed = bound.credits(a)
            if not owed:
                if which == "dispute":
                    assert revert(c[i].dispute.withdraw).error == "NothingToWithdraw"
                continue
            bal = r.token.balance_of(a)
            assert getattr(c[i], which).withdraw() == owed
            assert r.token.balance_of(a) == bal + owed and bound.credits(a) == 0
            pulled += owed
        assert pulled == owed_total and bound.call("totalCredits") == 0
        check_books(c)
    # what it still holds is delay compensation for rounds not yet settled (settleDelay)
    assert r.dispute.total_owed() == r.dispute.total_delay_held() == \
        r.token.balance_of(r.dispute.address)


def assert_window_kept_open(c: LocalChain, job: Job, r: TxReceipt) -> None:
    """Every dispute end leaves the others at least disputeGrace of window."""
    grace = c.reader.market.market_params().dispute_grace
    assert c.reader.market.get_job(job.id).window_end >= ts_of(c, r) + grace


# --- construction and access ----------------------------------------------------------


def test_constructor_guards_and_open_only_by_market(c: LocalChain) -> None:
    r = c.reader
    job = new_job(c, attest=False)
    addrs = {n: c.deployment.address_of(n) for n in CONTRACTS}

    def deploy(update: dict[str, int]) -> Any:
        bad = PARAMS.dispute.model_copy(update=update)
        return c[0].deploy("DisputeGame", *constructor_args("DisputeGame", addrs, bad))

    for update in ({"clock": 0}, {"fanout": 1}, {"fanout": 65}, {"quorum": 0},
                   {"quorum": 4}, {"jury_size": 0}, {"jury_size": 16}, {"jury_lookahead": 0},
                   {"jury_lookahead": 129}, {"juror_slash_bps": 10_001},
                   {"juror_share_of_challenger_bond_bps": 10_001}, {"commit_window": 0},
                   {"reveal_window": 0}, {"clock": 5, "clock_extension": 6}):
        assert revert(deploy, update).error == "InvalidParams", update
    # the unbonding delay (7200 s) must outlast window 3600 + grace 30 + 2 clocks + every
    # clock extension (2 x 32 rounds x 10 s) + 60 + 60: a juror or attestor cannot walk
    # away from a slash it has coming
    ext = 2 * 32 * PARAMS.dispute.clock_extension
    assert revert(deploy, {"clock": 1_500}).error == "InvalidParams"  # 6750 + ext >= 7200
    assert 3600 + 30 + 2 * 1_400 + ext + 120 < 7200
    deploy({"clock": 1_400})
    zero = {**addrs, "NodeRegistry": ZERO_ADDR}
    assert revert(c[0].deploy, "DisputeGame",
                  *constructor_args("DisputeGame", zero, PARAMS.dispute)).error == "ZeroAddress"

    lv = job.leaves
    args = (job.id, SEG, 1, addr(c, SOLVER_I), addr(c, CHAL), SEG * K, (SEG + 1) * K,
            lv[SEG].state_hash, lv[SEG + 1].state_hash)
    for who in (OUTSIDER, CHAL, SOLVER_I, 0):  # 0: the deployer / owner of everything
        e = revert(c[who].dispute.open, *args)
        assert (e.error, e.error_args) == ("Unauthorized", {"caller": addr(c, who)})
    assert int(r.dispute.call("disputeCount")) == 0

    for fn, extra in (("post_mids", ([keccak(b"x")],)), ("choose", (0, [])), ("timeout", ()),
                      ("draw_jury", ()), ("commit_vote", (True, ZERO)),
                      ("reveal_vote", (True, ZERO)), ("resolve", ())):
        e = revert(getattr(c[CHAL].dispute, fn), 99, *extra)
        assert (e.error, e.error_args) == ("UnknownDispute", {"id": 99}), fn
    assert revert(c[OUTSIDER].dispute.withdraw).error == "NothingToWithdraw"

    did = challenge(c, job)  # through the market: works, ids start at 1
    assert did == 1 == int(r.dispute.call("disputeCount"))
    assert r.dispute.challengerOf(did) == addr(c, CHAL)
    check_books(c)


# --- bisection --------------------------------------------------------------------------


def test_bisection_turns_phases_and_narrowing(c: LocalChain) -> None:
    job = new_job(c, attest=False)
    did = challenge(c, job)
    solver, chal, out = c[SOLVER_I].dispute, c[CHAL].dispute, c[OUTSIDER].dispute
    d = state(c, did)
    bond = c.reader.market.market_params().challenge_bond
    lo0, hi0 = SEG * K, (SEG + 1) * K
    assert (d.job_id, d.segment, d.solver, d.challenger, d.challenge_bond) == (
        job.id, SEG, addr(c, SOLVER_I), addr(c, CHAL), bond)
    assert (d.start_step, d.end_step, d.lo, d.hi) == (lo0, hi0, lo0, hi0)
    h0, h1 = job.leaves[SEG].state_hash, job.leaves[SEG + 1].state_hash
    # only the range root is stored; the end states come from DisputeOpened
    assert (d.lo_hash, d.hi_hash, d.mids_root) == (h0, h1, ZERO)
    assert d.range_root == range_root(h0, h1) == keccak(h0 + h1)
    assert (d.phase, d.turn, d.rounds, d.jury, d.votes, d.verdict, d.draw_block) == (
        Phase.BISECTION, Side.SOLVER, 0, [], [], Verdict.NONE, 0)
    q = K // FANOUT
    assert d.mid_steps == [lo0 + q, lo0 + 2 * q, lo0 + 3 * q]
    assert c.reader.dispute.call("midSteps", did) == d.mid_steps
    assert revert(out.draw_jury, did).error_args == {"id": did, "phase": Phase.BISECTION}

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
    assert (d.turn, d.range_root) == (Side.CHALLENGER, ZERO)
    assert d.mids_root == mids_commitment(h0, h1, m1) == keccak(keccak(h0 + h1)
                                                                + keccak(b"".join(m1)))
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
    # the range's ends are checked too (the game keeps only their commitment)
    for lo_h, hi_h in ((keccak(b"forged"), h1), (h0, keccak(b"forged")), (h1, h0)):
        e = revert(chal.transact, "choose", did, 0, m1, lo_h, hi_h)
        assert e.error == "MidsMismatch" and e.error_args["posted"] == d.mids_root

    pts = d.points
    r = chal.choose(did, 1, m1)  # accepts the state at p1, disputes the one at p2
    (e,) = ev(c, r, "RangeNarrowed")
    assert (e["lo"], e["hi"], e["loHash"], e["hiHash"]) == (pts[1], pts[2], m1[0], m1[1])
    d = state(c, did)
    assert (d.lo, d.hi, d.lo_hash, d.hi_hash, d.mids_root, d.turn, d.rounds) == (
        pts[1], pts[2], m1[0], m1[1], ZERO, Side.SOLVER, 1)
    assert d.range_root == range_root(m1[0], m1[1])
    assert d.phase == Phase.BISECTION and not ev(c, r, "JuryRequested")
    assert d.mid_steps == [pts[1] + 1, pts[1] + 2, pts[1] + 3]

    m2 = mids(c, did)
    solver.post_mids(did, m2)
    r = chal.choose(did, FANOUT - 1, m2)  # the last part: accepts every mid
    d = state(c, did)
    assert (d.lo, d.hi, d.lo_hash, d.hi_hash) == (pts[2] - 1, pts[2], m2[-1], m1[1])
    assert d.rounds == 2 and d.mid_steps == []
    # one step left: the jury is requested, not drawn (its seed is a later block's hash)
    q_block, draw_block, pool_len = requested(c, r)
    assert d.phase == Phase.DRAWING and not ev(c, r, "JuryDrawn") and d.jury == []
    assert draw_block == d.draw_block == q_block + gp(c).juryLookahead
    assert pool_len == len(c.reader.registry.verifiers())
    assert d.jury_seed == ZERO

    # bisection is over
    moves: list[tuple[Callable[..., Any], tuple[Any, ...]]] = [
        (solver.post_mids, ([keccak(b"m3")],)), (chal.choose, (0, m2)), (out.timeout, ()),
        (out.commit_vote, (True, ZERO)), (out.resolve, ())]
    for fn, args in moves:
        e = revert(fn, did, *args)
        assert (e.error, e.error_args) == ("WrongPhase", {"id": did, "phase": Phase.DRAWING})
    draw(c, did)
    assert state(c, did).phase == Phase.COMMIT
    assert revert(out.commit_vote, did, True, ZERO).error == "NotJuror"
    check_books(c)


@pytest.mark.parametrize("parts_seq", [[0, 0], [3, 0], [0, 3], [2, 1]])
def test_every_part_choice_keeps_the_ends_the_solver_posted(c: LocalChain,
                                                           parts_seq: list[int]) -> None:
    """Whichever parts are chosen, the final one-step range's end hashes are the start
    state, a posted mid or the disputed end state, at the matching steps (the three
    rotating hash words never lose one, not even when the request stores its block and
    the draw its seed in the third)."""
    job = new_job(c, attest=False)
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
    assert state(c, did).phase == Phase.DRAWING
    draw(c, did)
    nd = state(c, did)
    assert nd.phase == Phase.COMMIT and (nd.lo_hash, nd.hi_hash) == (known[nd.lo], known[nd.hi])
    assert nd.jury_seed == ZERO  # not stored: the seed is in JuryDrawn (its word holds the jury)


def test_uneven_ranges_and_plain_bisection(c: LocalChain) -> None:
    """A game deployed with fanout 2 is the classic bisection; ranges that do not
    divide evenly use p_j = lo + span * j // parts, and a short range uses every step."""
    c2 = deploy_game(c.anvil, PARAMS.model_copy(update={"dispute": PARAMS.dispute.model_copy(
        update={"fanout": 2})}))
    job = new_job(c2, k=10, attest=False)
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
    assert d.phase == Phase.DRAWING

    # fanout 4 over 10 steps: 2, 5, 7; then part [5, 7] has two parts, one mid
    job = new_job(c, k=10, attest=False)
    did = challenge(c, job)
    assert state(c, did).mid_steps == [12, 15, 17]
    hs = mids(c, did)
    c[SOLVER_I].dispute.post_mids(did, hs)
    c[CHAL].dispute.choose(did, 2, hs)
    d = state(c, did)
    assert (d.lo, d.hi, d.mid_steps) == (15, 17, [16])
    e = revert(c[SOLVER_I].dispute.post_mids, did, hs)
    assert e.error_args == {"given": 3, "expected": 1}


def test_single_step_segment_requests_the_jury_at_open(c: LocalChain) -> None:
    job = new_job(c, k=1, attest=False)
    did = challenge(c, job)
    d = state(c, did)
    assert (d.lo, d.hi, d.rounds, d.phase, d.mid_steps) == (SEG, SEG + 1, 0, Phase.DRAWING, [])
    e = revert(c[SOLVER_I].dispute.post_mids, did, [keccak(b"m")])
    assert (e.error, e.error_args["phase"]) == ("WrongPhase", Phase.DRAWING)
    assert revert(c[OUTSIDER].dispute.timeout, did).error == "WrongPhase"  # no clock runs
    draw(c, did)
    assert len(state(c, did).jury) == gp(c).jurySize


# --- chess clock ---------------------------------------------------------------------------


def test_chess_clock_runs_only_for_the_side_to_move(c: LocalChain) -> None:
    clock = gp(c).clock
    job = new_job(c, attest=False)
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
    assert (d.phase, d.verdict, d.solver_won, d.solver_clock_left) == (
        Phase.RESOLVED, Verdict.SOLVER_TIMED_OUT, False, 0)
    assert d.challenger_clock_left == clock - 25


def test_a_late_move_leaves_the_other_side_the_clock_extension(c: LocalChain) -> None:
    """Before (issue 11): no clock extension, so a side that had spent its clock lost
    to a move made in the other side's last second. Now, as in Optimism's
    FaultDisputeGame, the side to move always has at least ``clockExtension``."""
    clock, ext = gp(c).clock, gp(c).clockExtension
    assert 0 < ext < clock
    job = new_job(c, attest=False)
    did = challenge(c, job)
    t0 = c.timestamp()  # the challenge's block: the solver's clock starts there
    solver, chal = c[SOLVER_I].dispute, c[CHAL].dispute
    next_ts(c, t0 + clock - 2)  # the solver spends all but 2 s of its clock
    m1 = mids(c, did)
    solver.post_mids(did, m1)
    next_ts(c, t0 + clock + 5)
    r = chal.choose(did, 1, m1)
    # 2 s were left: the extension tops it up, and the solver can still answer after 2 s
    assert state(c, did).solver_clock_left == ext
    next_ts(c, ts_of(c, r) + ext - 1)
    r = solver.post_mids(did, mids(c, did))
    assert ev(c, r, "MidsPosted")[0]["solverClockLeft"] == 1
    # a clock with more than the extension left is untouched
    assert state(c, did).challenger_clock_left == clock - 7


# --- timeouts -------------------------------------------------------------------------------


def test_solver_out_of_time_condemns_the_round_without_a_jury(c: LocalChain) -> None:
    """The solver loses on time: the challenger's bond comes back at once, the solver's
    bond is split once, by finalize after the window, which pays the challenger there
    (its share and the jurors' share: no jury decided); the attestors keep their stake
    (nothing was proven)."""
    clock = gp(c).clock
    m, reg = c.reader.market, c.reader.registry
    job = new_job(c)
    did = challenge(c, job)
    out = c[OUTSIDER].dispute
    assert revert(out.timeout, did).error == "ClockNotExpired"
    before, escrow = worth(c), m.totalEscrow()
    c.advance(clock)
    e = revert(c[SOLVER_I].dispute.post_mids, did, mids(c, did))
    assert (e.error, e.error_args) == ("ClockExpired", {"id": did})
    d = state(c, did)
    assert d.solver_clock_left == 0 and d.challenger_clock_left == gp(c).clock
    r = out.timeout(did)
    assert ev(c, r, "TimedOut")[0]["loser"] == Side.SOLVER
    (res,) = ev(c, r, "DisputeResolved")
    assert (res["verdict"], res["slashedBond"]) == (Verdict.SOLVER_TIMED_OUT, 0)
    assert state(c, did).verdict == Verdict.SOLVER_TIMED_OUT
    assert diff(before, worth(c)) == {}  # nothing moves yet ...
    assert reg.locked_stake(addr(c, CHAL)) == 0  # ... but the challenge bond is free again
    assert reg.locked_stake(addr(c, SOLVER_I)) == job.bond
    assert [e["round"] for e in ev(c, r, "RoundCondemned", "market")] == [1]
    ri = m.round_info(job.id, 1)
    assert (ri.condemned, ri.sampled_invalid, ri.settled, ri.jury_wins, ri.timeout_wins) == (
        True, False, False, 0, 1)
    assert m.dispute_ref(did).verdict == Verdict.SOLVER_TIMED_OUT
    assert_window_kept_open(c, job, r)
    j = m.get_job(job.id)
    assert (j.status, j.open_disputes) == (JobStatus.COMMITTED, 0)
    assert not m.isDisputeLive(did)
    assert revert(out.timeout, did).error == "WrongPhase"
    assert ri.first_winner == did and not ri.settled
    e = revert(c[OUTSIDER].market.finalize, job.id)
    assert e.error == "WindowNotOver"
    check_books(c)

    rf = finalize(c, job)  # an outsider's finalize pays the challenger
    exp = expected_round(c, job, by_jury=False)
    assert exp.per_jury == 0 and exp.per_challenger == job.bond - exp.to_submitter > 0
    assert assert_paid_in_finalize(c, job, rf, did, exp) == {}  # no jurors: the game pays none
    moved = {addr(c, SOLVER_I): -job.bond, addr(c, SUBMITTER): exp.to_submitter,
             addr(c, CHAL): exp.per_challenger}
    assert diff(before, worth(c)) == moved and sum(moved.values()) == 0
    assert game_credits(c) == {}
    assert m.credits(addr(c, CHAL)) == exp.per_challenger
    assert not ev(c, rf, "AttestorSlashed", "market")
    j = m.get_job(job.id)
    assert (j.status, j.solver, j.bond, j.open_disputes, j.round) == (
        JobStatus.OPEN, ZERO_ADDR, 0, 0, 1)
    assert m.totalEscrow() == escrow == REWARD + BUDGET  # the escrow stays for the next solver
    assert reg.locked_stake(addr(c, SOLVER_I)) == 0
    check_books(c)
    withdraw_all(c)
    c[SOLVER_I].market.claim_job(job.id)  # reopened: claimable again, a new round
    assert m.get_job(job.id).round == 2


def test_challenger_out_of_time_burns_its_bond_and_bars_only_it(c: LocalChain) -> None:
    """A lost challenge binds only the challenger who lost it; its bond never reaches the
    solver (no jury decided: all of it is burned)."""
    clock = gp(c).clock
    m = c.reader.market
    cb = m.market_params().challenge_bond
    job = new_job(c)
    did = challenge(c, job)
    hs = mids(c, did)
    c[SOLVER_I].dispute.post_mids(did, hs)
    out = c[OUTSIDER].dispute
    assert revert(out.timeout, did).error == "ClockNotExpired"
    before, burned = worth(c), c.reader.dispute.total_burned()
    c.advance(clock)
    e = revert(c[CHAL].dispute.choose, did, 0, hs)
    assert (e.error, e.error_args) == ("ClockExpired", {"id": did})
    d = state(c, did)
    r = out.timeout(did)
    assert ev(c, r, "TimedOut")[0]["loser"] == Side.CHALLENGER
    (res,) = ev(c, r, "DisputeResolved")
    assert (res["verdict"], res["slashedBond"]) == (Verdict.VALID, cb)
    held = delay_share(cb)
    assert ev(c, r, "Burned")[0]["amount"] == cb - held
    assert state(c, did).challenger_clock_left == 0 and state(c, did).solver_won

    value, cred = expected_resolve(c, d, job, Verdict.VALID)
    # not a wei to the solver before its round is paid: half held, half burned
    assert value == {addr(c, CHAL): -cb, BURN: cb - held}
    assert diff(before, worth(c)) == value and game_credits(c) == cred == {}
    assert c.reader.dispute.total_burned() == burned + cb - held
    assert c.reader.dispute.delay_held(job.id, 1) == held
    assert ev(c, r, "ChallengerBarred", "market")[0]["challenger"] == addr(c, CHAL)
    j = m.get_job(job.id)
    assert (j.status, j.open_disputes) == (JobStatus.COMMITTED, 0)
    assert not m.round_info(job.id, 1).condemned
    assert_window_kept_open(c, job, r)
    assert m.is_barred(job.id, SEG, addr(c, CHAL))
    assert not m.is_barred(job.id, SEG, addr(c, CHAL2))
    assert not m.is_barred(job.id, SEG + 1, addr(c, CHAL))
    e = revert(challenge, c, job, CHAL)
    assert (e.error, e.error_args) == ("ChallengerBarredFrom", {"segment": SEG,
                                                                "challenger": addr(c, CHAL)})
    ri = m.round_info(job.id, 1)  # a lost challenge wins nothing and settles nothing
    assert (ri.condemned, ri.settled, ri.first_winner) == (False, False, 0)
    # no free uphold: anyone else may still dispute the same segment, and CHAL another one
    d2 = challenge(c, job, CHAL2)
    d3 = challenge(c, job, CHAL, SEG + 1)
    assert m.get_job(job.id).open_disputes == 2
    assert state(c, d2).segment == SEG and state(c, d3).segment == SEG + 1
    check_books(c)
    withdraw_all(c)


# --- jury -----------------------------------------------------------------------------------


def test_jury_is_drawn_after_the_lookahead_from_a_later_block_hash(c: LocalChain) -> None:
    """The seed is keccak(blockhash(Q + lookahead), id): unknown to both parties at their
    last move; the draw waits for that block, anyone may send it, and the jury is the
    documented stake-weighted sortition without the parties and the job's attestors."""
    out = c[OUTSIDER]
    out.registry.register(VERIFIER, "12D3KooWout", [], "{}")  # listed, but no stake
    assert not out.registry.is_verifier(addr(c, OUTSIDER))
    g, m = c.reader.dispute, c.reader.market
    p = gp(c)
    job = new_job(c)
    # the committee is the documented sortition too: stake as of the commit block
    jv = m.get_job(job.id)
    cseed = keccak(abi_encode(["bytes32", "string"], [jv.seed, "attest"]))
    assert job.committee == py_sortition(c, cseed, len(job.committee), jv.pool_len,
                                         jv.snapshot_block, [addr(c, SOLVER_I)])
    assert job.attestors == job.committee

    did = challenge(c, job)
    r = bisect(c, did)
    q_block, draw_block, pool_len = requested(c, r)
    assert draw_block == q_block + p.juryLookahead
    # enough blocks, not one fewer: the draw needs blockhash(draw_block) to exist
    c.mine(draw_block - int(c.w3.eth.block_number) - 1)
    e = revert(out.dispute.draw_jury, did)
    assert (e.error, e.error_args) == ("JuryNotReady", {"drawBlock": draw_block})
    c.mine(1)
    rd = out.dispute.draw_jury(did)
    assert rd["blockNumber"] == draw_block + 1
    d = state(c, did)
    (e,) = ev(c, rd, "JuryDrawn")
    seed = jury_seed(c, draw_block, did)
    assert e["jurySeed"] == seed and d.jury_seed == ZERO  # the seed is in the event only
    exclude: list[str] = [d.solver, d.challenger, *job.attestors]
    assert list(e["jury"]) == d.jury == py_sortition(c, seed, p.jurySize, pool_len, q_block,
                                                     exclude)
    assert list(e["jury"]) == c.reader.registry.sortition(seed, p.jurySize, pool_len, q_block,
                                                          exclude)
    assert len(d.jury) == len(set(d.jury)) == p.jurySize
    assert not {*exclude, out.address} & set(d.jury)
    assert d.commit_end == ts_of(c, rd) + p.commitWindow
    assert d.reveal_end == d.commit_end + p.revealWindow
    assert (e["commitEnd"], e["revealEnd"]) == (d.commit_end, d.reveal_end)
    assert (d.phase, d.draw_block) == (Phase.COMMIT, 0)
    for a in c.addresses:
        assert g.is_juror(did, a) == (a in d.jury)
    e = revert(out.dispute.draw_jury, did)
    assert (e.error, e.error_args) == ("WrongPhase", {"id": did, "phase": Phase.COMMIT})

    # the rule, for any seed: the same as the Python re-draw, nobody excluded ever drawn
    for i in range(12):
        s = keccak(b"seed%d" % i)
        jury = c.reader.registry.sortition(s, p.jurySize, pool_len, q_block, exclude)
        assert jury == py_sortition(c, s, p.jurySize, pool_len, q_block, exclude)
        assert len(jury) == p.jurySize and not {*exclude, out.address} & set(jury)


def test_stake_moved_after_the_request_cannot_sit_on_the_jury(c: LocalChain) -> None:
    """Stake, roles and registrations after the jury request (block Q) do not count: with
    every eligible verifier's stake moved after Q, and fresh sybils registered, nobody is
    drawn, and a jury below quorum ends the dispute Void at once."""
    g, reg, m = c.reader.dispute, c.reader.registry, c.reader.market
    job = new_job(c, attest=False)
    did = challenge(c, job)
    r = bisect(c, did)
    q_block, _, pool_len = requested(c, r)
    d = state(c, did)
    eligible = [a for a in reg.verifiers() if a not in (d.solver, d.challenger)]
    for a in eligible:
        c[idx(c, a)].stake(1)  # a wei more: its stake changed after Q
    c[OUTSIDER].registry.register(VERIFIER, "12D3KooWsybil", [], "{}")
    c[OUTSIDER].stake(VERIFIER_STAKE)  # a fresh verifier: beyond the snapshotted pool
    assert len(reg.verifiers()) == pool_len + 1
    # the same draw with a later snapshot would have seated them
    exclude: list[str] = [d.solver, d.challenger]
    later = int(c.w3.eth.block_number)
    assert len(reg.sortition(keccak(b"any"), 3, pool_len + 1, later, exclude)) == 3
    before = worth(c)
    rd = draw(c, did)
    (e,) = ev(c, rd, "JuryDrawn")
    assert list(e["jury"]) == [] == py_sortition(c, bytes(e["jurySeed"]), 3, pool_len,
                                                 q_block, exclude)
    (res,) = ev(c, rd, "DisputeResolved")
    assert (res["verdict"], res["slashedBond"]) == (Verdict.VOID, 0)
    d = state(c, did)
    assert (d.phase, d.verdict, d.jury) == (Phase.RESOLVED, Verdict.VOID, [])
    # Void: nobody wins or pays; the challenger is not barred and may try again
    assert diff(before, worth(c)) == {}
    assert reg.locked_stake(addr(c, CHAL)) == 0
    assert not m.is_barred(job.id, SEG, addr(c, CHAL))
    assert not m.round_info(job.id, 1).condemned
    assert m.dispute_ref(did).verdict == Verdict.VOID
    assert_window_kept_open(c, job, rd)
    assert int(g.call("disputeCount")) == did
    challenge(c, job)
    check_books(c)


def test_fewer_eligible_jurors_than_quorum_is_void(c: LocalChain) -> None:
    """One verifier left besides the parties: at most one juror, below the quorum of 2."""
    reg = c.reader.registry
    job = new_job(c, attest=False)
    keep = addr(c, VERIFIERS[0])
    for i in (CHAL2, *VERIFIERS[1:]):
        c[i].registry.update_node(SOLVER, f"12D3KooWdev{i}", [], "{}")  # no longer verifiers
    did = challenge(c, job)
    r = bisect(c, did)
    _, _, pool_len = requested(c, r)
    assert pool_len == len(reg.verifiers())  # the pool is append-only; eligibility is checked
    rd = draw(c, did)
    (e,) = ev(c, rd, "JuryDrawn")
    assert set(e["jury"]) <= {keep} and gp(c).quorum == 2
    assert ev(c, rd, "DisputeResolved")[0]["verdict"] == Verdict.VOID
    assert state(c, did).phase == Phase.RESOLVED
    assert reg.locked_stake(addr(c, CHAL)) == 0
    check_books(c)


def test_a_forgotten_seed_block_rearms_the_request(c: LocalChain) -> None:
    """Nobody drew while blockhash(Q + lookahead) was readable (256 blocks): the draw asks
    again from the current block instead of drawing from a zero hash."""
    job = new_job(c, attest=False)
    did = challenge(c, job)
    _, draw_block, _ = requested(c, bisect(c, did))
    c.mine(draw_block + 257 - int(c.w3.eth.block_number))
    r = c[OUTSIDER].dispute.draw_jury(did)
    assert not ev(c, r, "JuryDrawn")
    q2, draw2, _ = requested(c, r)
    assert q2 == r["blockNumber"] and draw2 == q2 + gp(c).juryLookahead
    d = state(c, did)
    assert (d.phase, d.draw_block, d.jury) == (Phase.DRAWING, draw2, [])
    assert revert(c[OUTSIDER].dispute.draw_jury, did).error == "JuryNotReady"
    rd = draw(c, did)
    assert ev(c, rd, "JuryDrawn")[0]["jurySeed"] == jury_seed(c, draw2, did)
    assert len(state(c, did).jury) == gp(c).jurySize


def test_commit_reveal_rules(c: LocalChain) -> None:
    job = new_job(c, attest=False)
    did = challenge(c, job)
    to_jury(c, did)
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
    # one reveal is below the quorum of 2: Void; the silent two pay the one who revealed
    value, cred = expected_resolve(c, d, job, Verdict.VOID, majority=[j0], losers=[j1, j2])
    assert diff(before, worth(c)) == value and game_credits(c) == cred
    assert {e["juror"] for e in ev(c, r, "JurorSlashed")} == {j1, j2}
    assert (state(c, did).phase, state(c, did).verdict) == (Phase.RESOLVED, Verdict.VOID)
    for fn, args in ((g2.commit_vote, (True, salt(j2))), (g1.reveal_vote, (True, salt(j1))),
                     (out.resolve, ()), (out.draw_jury, ())):
        e = revert(fn, did, *args)
        assert (e.error, e.error_args) == ("WrongPhase", {"id": did, "phase": Phase.RESOLVED})
    withdraw_all(c)


def test_a_juror_on_two_live_juries_keeps_both_commitments(c: LocalChain) -> None:
    """A commitment lives in its juror's own word (its low 176 bits, rewritten dispute after
    dispute); while that word holds a dispute still in its reveal stage, a second jury's
    commitment is kept whole per dispute. Both open, neither commits twice."""
    job = new_job(c, attest=False)
    a = challenge(c, job, CHAL, 1)
    b = challenge(c, job, CHAL2, 2)
    to_jury(c, a)
    to_jury(c, b)
    da, db = state(c, a), state(c, b)
    common = [j for j in db.jury if j in da.jury]
    for j in db.jury:  # b first: its commitments take the jurors' own words
        c[idx(c, j)].dispute.commit_vote(b, True, salt(j))
    for j in da.jury:  # a common juror's word holds b, still in its jury stage
        c[idx(c, j)].dispute.commit_vote(a, True, salt(j))
    # (the draws follow block hashes: on anvil's chain they share a juror; on another EVM
    # they may not, and then only the two games below are checked)
    j = common[0] if common else db.jury[0]
    g = c[idx(c, j)].dispute
    assert revert(g.commit_vote, b, True, salt(j)).error == "AlreadyCommitted"
    full_b = vote_commitment(b, j, True, salt(j))
    assert c.reader.dispute.call("voteOf", b, j).commitment == bytes(10) + full_b[10:]
    if common:
        assert revert(g.commit_vote, a, True, salt(j)).error == "AlreadyCommitted"
        full_a = vote_commitment(a, j, True, salt(j))
        assert c.reader.dispute.call("voteOf", a, j).commitment == full_a
    mine_at(c, max(da.commit_end, db.commit_end))
    assert revert(g.reveal_vote, b, False, salt(j)).error == "BadReveal"
    if common:
        assert revert(g.reveal_vote, a, False, salt(j)).error == "BadReveal"
    for did, d in ((a, da), (b, db)):
        for juror in d.jury:
            c[idx(c, juror)].dispute.reveal_vote(did, True, salt(juror))
        assert state(c, did).phase == Phase.RESOLVED and state(c, did).verdict == Verdict.VALID


# --- settlement -------------------------------------------------------------------------------


@pytest.mark.parametrize(("reward", "sampled"), [
    pytest.param(REWARD, True, id="sampled"),
    pytest.param(3 * REWARD, False, id="unsampled-bigger-bond"),
])
def test_majority_invalid_condemns_the_round_and_finalize_settles_it(
        c: LocalChain, reward: int, sampled: bool) -> None:
    """The jury proves the step invalid: minority jurors lose a cut that scales with the
    bonds at stake; the round is condemned and, after the window, finalize splits the
    solver's bond once and pays right there: the submitter share, the challenger share
    (plus the attestors' slashes, only when the segment was one they vouched for:
    sampled) and the jurors' share to the dispute's majority jurors, through the game."""
    m, reg = c.reader.market, c.reader.registry
    segments = 12  # sampleCount 7 < 12: some segments are not sampled
    job = new_job(c, segments=segments, reward=reward)
    sample = m.sampled_segments(job.id)
    seg = next(s for s in range(segments) if (s in sample) == sampled)
    did = challenge(c, job, CHAL, seg)
    to_jury(c, did, lower=False)
    d = state(c, did)
    assert not set(job.attestors) & set(d.jury)
    escrow, before = m.totalEscrow(), worth(c)
    r = run_jury(c, did, [False, False, True])
    (res,) = ev(c, r, "DisputeResolved")
    assert (res["verdict"], res["validVotes"], res["invalidVotes"], res["slashedBond"]) == (
        Verdict.INVALID, 1, 2, 0)
    value, cred = expected_resolve(c, d, job, Verdict.INVALID, majority=d.jury[:2],
                                   losers=d.jury[2:])
    assert diff(before, worth(c)) == value and game_credits(c) == cred
    cut = juror_cut(c, job)
    assert [(e["juror"], e["amount"]) for e in ev(c, r, "JurorSlashed")] == [(d.jury[2], cut)]
    assert reg.locked_stake(d.challenger) == 0 and reg.locked_stake(d.solver) == job.bond
    ri = m.round_info(job.id, 1)
    assert (ri.condemned, ri.sampled_invalid, ri.settled, ri.jury_wins) == (
        True, sampled, False, 1)
    j = m.get_job(job.id)
    assert (j.status, j.open_disputes) == (JobStatus.COMMITTED, 0)
    assert_window_kept_open(c, job, r)
    assert not m.isDisputeLive(did) and m.dispute_ref(did).settled
    assert ri.first_winner == did and not ri.settled
    check_books(c)

    atts = liable(c, job, seg)  # the sampled segment's seat only: the others checked theirs
    assert len(atts) == (1 if sampled else 0)
    assert ri.liable_seats == (1 << job.committee.index(atts[0]) if sampled else 0)
    before, game_before = worth(c), game_credits(c)
    rf = finalize(c, job)
    exp = expected_round(c, job, by_jury=True, attestors=atts)
    assert exp.per_jury > 0 and exp.per_challenger > 0
    assert [(e["attestor"], e["amount"]) for e in ev(c, rf, "AttestorSlashed", "market")] == [
        (a, exp.attestor_cut) for a in atts]
    jury_cred = assert_paid_in_finalize(c, job, rf, did, exp)
    assert majority_invalid(state(c, did)) == d.jury[:2]  # the minority juror gets none
    assert set(jury_cred) == set(d.jury[:2]) and sum(jury_cred.values()) == exp.per_jury
    assert game_credits(c) == game_before  # the jurors' share is credited by the market
    moved: Counter[str] = Counter({d.solver: -job.bond, addr(c, SUBMITTER): exp.to_submitter,
                                   d.challenger: exp.per_challenger})
    moved.update({a: -exp.attestor_cut for a in atts})
    moved[BURN] += exp.attestor_cut * len(atts)  # burned: no party of the round gets them
    moved.update(jury_cred)
    assert diff(before, worth(c)) == nonzero(moved)
    assert sum(moved.values()) == 0  # the whole bond paid out, the attestor slashes burned
    j = m.get_job(job.id)
    assert (j.status, j.bond, j.open_disputes, j.trace_root, j.round) == (
        JobStatus.OPEN, 0, 0, ZERO, 1)
    assert m.totalEscrow() == escrow
    assert reg.locked_stake(d.solver) == 0
    check_books(c)
    withdraw_all(c)


def test_majority_valid_pays_the_jury_burns_the_rest_and_the_job_pays_out(
        c: LocalChain) -> None:
    m = c.reader.market
    cb = m.market_params().challenge_bond
    job = new_job(c)
    did = challenge(c, job)
    to_jury(c, did)
    d = state(c, did)
    before, burned = worth(c), c.reader.dispute.total_burned()
    r = run_jury(c, did, [True, HIDE, True])  # j1 committed but never revealed
    (res,) = ev(c, r, "DisputeResolved")
    assert (res["verdict"], res["validVotes"], res["invalidVotes"], res["slashedBond"]) == (
        Verdict.VALID, 2, 0, cb)
    value, cred = expected_resolve(c, d, job, Verdict.VALID, majority=[d.jury[0], d.jury[2]],
                                   losers=[d.jury[1]])
    assert diff(before, worth(c)) == value and game_credits(c) == cred
    assert d.solver not in value  # a losing challenger's bond never reaches the solver
    to_jury_share = cb * gp(c).jurorShareOfChallengerBondBps // BPS
    assert c.reader.dispute.total_burned() == burned + value[BURN] == (
        burned + cb - to_jury_share - delay_share(cb - to_jury_share))
    assert [e["juror"] for e in ev(c, r, "JurorSlashed")] == [d.jury[1]]
    assert state(c, did).solver_won and state(c, did).verdict == Verdict.VALID
    assert m.is_barred(job.id, SEG, addr(c, CHAL))
    assert revert(challenge, c, job, CHAL).error == "ChallengerBarredFrom"
    snap = c.snapshot()
    challenge(c, job, CHAL2)  # another verifier may still dispute it
    c.revert(snap)
    assert m.get_job(job.id).status == JobStatus.COMMITTED
    ri = m.round_info(job.id, 1)  # the solver won: nothing condemned, nobody to pay
    assert (ri.condemned, ri.settled, ri.first_winner, ri.jury_wins) == (False, False, 0, 0)
    check_books(c)
    withdraw_all(c)
    rf = finalize(c, job)  # no live dispute left: a clean round, the job pays out
    (fe,) = ev(c, rf, "JobFinalized", "market")
    assert (fe["reward"], fe["attestations"]) == (REWARD, 3)
    per = BUDGET // m.market_params().attestors_per_job
    assert m.credits(d.solver) == REWARD
    assert all(m.credits(a) == per for a in job.attestors)
    assert m.credits(addr(c, SUBMITTER)) == BUDGET - 3 * per
    # a clean round is never "settled" as a condemned one: a lost challenge is paid nothing
    assert not ev(c, rf, "RewardPaid", "market") and not ev(c, rf, "RoundSettled", "market")
    ri = m.round_info(job.id, 1)
    assert (ri.condemned, ri.settled, ri.first_winner) == (False, False, 0)
    assert m.credits(addr(c, CHAL)) == 0 and not ev(c, rf, "Credited")
    check_books(c)
    withdraw_all(c)


@pytest.mark.parametrize(("ballots", "verdict"), [
    pytest.param([True, False, None], Verdict.VOID, id="tie-1-1"),
    pytest.param([False, None, HIDE], Verdict.VOID, id="one-reveal-below-quorum"),
    pytest.param([HIDE, HIDE, HIDE], Verdict.VOID, id="no-reveals"),
    pytest.param([None, None, None], Verdict.VOID, id="no-commits"),
    pytest.param([True, True, True], Verdict.VALID, id="unanimous-valid"),
    pytest.param([False, HIDE, False], Verdict.INVALID, id="two-invalid-one-silent"),
])
def test_ties_and_silence_decide_nothing(c: LocalChain, ballots: list[Ballot],
                                         verdict: Verdict) -> None:
    """Below quorum or a tie is Void: silent jurors pay the ones who revealed (burned when
    nobody did), the challenger gets its bond back and is not barred, the round is not
    condemned. Silence never decides for either side."""
    m, reg = c.reader.market, c.reader.registry
    job = new_job(c)
    did = challenge(c, job)
    to_jury(c, did)
    d = state(c, did)
    before = worth(c)
    r = run_jury(c, did, ballots)
    revealed = [j for j, b in zip(d.jury, ballots, strict=True) if isinstance(b, bool)]
    if verdict == Verdict.VOID:
        majority = revealed
    else:
        majority = [j for j, b in zip(d.jury, ballots, strict=True)
                    if b is (verdict == Verdict.VALID)]
    losers = [j for j in d.jury if j not in majority]
    value, cred = expected_resolve(c, d, job, verdict, majority=majority, losers=losers)
    assert diff(before, worth(c)) == value and game_credits(c) == cred
    assert ev(c, r, "DisputeResolved")[0]["verdict"] == verdict
    assert sorted(e["juror"] for e in ev(c, r, "JurorSlashed")) == sorted(losers)
    assert all(e["amount"] == juror_cut(c, job) for e in ev(c, r, "JurorSlashed"))
    assert m.is_barred(job.id, SEG, addr(c, CHAL)) == (verdict == Verdict.VALID)
    assert m.round_info(job.id, 1).condemned == (verdict == Verdict.INVALID)
    assert reg.locked_stake(addr(c, CHAL)) == 0
    if not majority:
        assert value[BURN] == juror_cut(c, job) * len(losers)
    assert_window_kept_open(c, job, r)
    check_books(c)
    withdraw_all(c)


def test_one_settlement_per_round_pays_those_who_proved_it(c: LocalChain) -> None:
    """The puppet attacks: a second challenge that the solver lets time out, and a third
    whose challenger lets its own clock run out, neither stops the honest dispute nor
    takes its reward. Challenges stay open past the window while a dispute is live;
    finalize waits for every dispute of the round; the bond is split once and paid in
    that finalize to the one winner, the earliest-opened dispute the solver lost (the
    honest one): the puppet's timeout win is paid nothing (before: the puppet's timeout
    reopened the job, mooted the honest dispute and took the challenger share)."""
    m, reg = c.reader.market, c.reader.registry
    g = c.reader.dispute
    job = new_job(c)
    third = next(i for i in VERIFIERS if addr(c, i) not in job.committee)
    end = m.get_job(job.id).window_end
    mine_at(c, end - 5)
    a = challenge(c, job, CHAL, 1)
    mine_at(c, end + 1)  # the window is over, but a dispute is live: challenges stay open
    b = challenge(c, job, CHAL2, 2)
    cc = challenge(c, job, third, 3)
    assert m.get_job(job.id).open_disputes == 3
    assert revert(c[OUTSIDER].market.finalize, job.id).error_args == {"openDisputes": 3}
    c[SOLVER_I].dispute.post_mids(cc, mids(c, cc))  # cc's challenger then never moves
    to_jury(c, a)
    da = state(c, a)
    before, burned = worth(c), g.total_burned()
    ra = run_jury(c, a, [False, False, False])
    assert ev(c, ra, "DisputeResolved")[0]["verdict"] == Verdict.INVALID
    assert m.get_job(job.id).status == JobStatus.COMMITTED  # the others are still live
    assert m.isDisputeLive(b) and m.isDisputeLive(cc)
    assert_window_kept_open(c, job, ra)  # the ended dispute gave the window its grace back
    assert revert(c[OUTSIDER].market.finalize, job.id).error == "WindowNotOver"
    mine_at(c, m.get_job(job.id).window_end)
    assert revert(c[OUTSIDER].market.finalize, job.id).error_args == {"openDisputes": 2}
    rb = c[OUTSIDER].dispute.timeout(b)  # the solver's puppet lets the solver time out
    assert ev(c, rb, "DisputeResolved")[0]["verdict"] == Verdict.SOLVER_TIMED_OUT
    rc = c[OUTSIDER].dispute.timeout(cc)
    assert ev(c, rc, "DisputeResolved")[0]["verdict"] == Verdict.VALID
    assert_window_kept_open(c, job, rc)
    assert m.get_job(job.id).window_end == ts_of(c, rc) + m.market_params().dispute_grace
    cb = m.market_params().challenge_bond
    va, _ = expected_resolve(c, da, job, Verdict.INVALID, majority=da.jury)
    exp_moves = Counter(va)
    # cc: no jury; half held for the (condemned) round's solver, half burned
    exp_moves.update({addr(c, third): -cb, BURN: cb - delay_share(cb)})
    assert diff(before, worth(c)) == nonzero(exp_moves)
    assert g.total_burned() == burned + cb - delay_share(cb)
    assert all(reg.locked_stake(addr(c, i)) == 0 for i in (CHAL, CHAL2, third))
    ri = m.round_info(job.id, 1)
    assert (ri.condemned, ri.sampled_invalid, ri.jury_wins, ri.timeout_wins) == (
        True, True, 1, 1)
    check_books(c)

    assert a < b < cc and ri.first_winner == a  # opened first, by the honest challenger

    atts = liable(c, job, 1)  # a's segment: b's was not judged by a jury
    assert len(atts) == 1
    before = worth(c)
    rf = finalize(c, job)
    exp = expected_round(c, job, by_jury=True, attestors=atts)
    jury_cred = assert_paid_in_finalize(c, job, rf, a, exp)
    assert [e["attestor"] for e in ev(c, rf, "AttestorSlashed", "market")] == atts
    assert set(jury_cred) == set(da.jury)  # a's jury was unanimous: all three are paid
    moved: Counter[str] = Counter({addr(c, SOLVER_I): -job.bond,
                                   addr(c, SUBMITTER): exp.to_submitter,
                                   addr(c, CHAL): exp.per_challenger})
    for at in atts:
        moved[at] -= exp.attestor_cut
        moved[BURN] += exp.attestor_cut
    moved.update(jury_cred)
    assert diff(before, worth(c)) == nonzero(moved)
    assert sum(moved.values()) == 0  # the whole bond paid out, the attestor slashes burned
    # the puppet's timeout win and the lost challenge are paid nothing (a seat on a's jury
    # is paid as any juror's)
    assert m.credits(addr(c, CHAL2)) == jury_cred.get(addr(c, CHAL2), 0)
    assert m.credits(addr(c, third)) == jury_cred.get(addr(c, third), 0)
    check_books(c)
    withdraw_all(c)
