"""Stateful property test: random actions by several accounts against anvil.

After every step: (1) the token balance of registry + market + dispute game equals
the sum of what they say they owe; (2) every account's and contract's token
balance equals what the Transfer events since deployment add up to (nothing moves
without an event); (3) every credit in the market and the game equals what its
Credited / Withdrawn events add up to. Each example starts from the same
snapshot; reverting it is what makes ~2,000 actions fit in about a minute.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from typing import Any

from eth_utils import keccak
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from devnet.params import TOKEN
from devnet.testing import LocalChain
from node.chain.bound import batch_call
from node.chain.contracts import SOLVER, VERIFIER, JobStatus, Phase, Side
from node.chain.events import EventWatcher
from node.errors import ContractRevert
from node.proof import MerkleTree, TraceLeaf, build_trace_tree

ACTORS = range(1, 8)  # dev accounts 1..7 play; 0 deployed everything
SEGMENTS, K = 6, 4
MAX_DURATION = 300
WINDOW = 60  # DevnetParams().market.verification_window, asserted in the test
MAX_EXAMPLES, STEPS = int(os.environ.get("POLNET_INVARIANT_EXAMPLES", 80)), 40
STATS: Counter[str] = Counter()


class Market(RuleBasedStateMachine):
    chain: LocalChain
    base: str  # snapshot every example starts from

    def __init__(self) -> None:
        super().__init__()
        c = type(self).chain
        c.revert(type(self).base)
        type(self).base = c.snapshot()
        self.c = c
        r = c.reader
        self.contracts = {"registry": r.registry, "market": r.market, "dispute": r.dispute}
        self.watcher = EventWatcher(c.w3, [r.token, r.registry, r.market, r.dispute],
                                    start_block=c.w3.eth.block_number + 1)
        self.holders = [c.addresses[i] for i in ACTORS] + [b.address for b in
                                                           self.contracts.values()]
        self.balances = dict(zip(self.holders, self._balances(), strict=True))
        self.credits: dict[tuple[str, str], int] = defaultdict(int)
        self.traces: dict[int, tuple[list[TraceLeaf], MerkleTree]] = {}
        self.votes: dict[tuple[int, str], tuple[bool, bytes]] = {}
        self.disputes: list[int] = []
        self.registered = {1, 2, 3, 4, 5, 6}  # see the head start below
        self.unbonding: set[int] = set()
        self.status: dict[int, JobStatus] = {}
        self.solver: dict[int, str] = {}
        self.submitter: dict[int, str] = {}
        self.rounds: dict[int, int] = {}

    # --- helpers -------------------------------------------------------------------

    def _balances(self) -> list[int]:
        tok = self.c.reader.token
        return [int(b) for b in batch_call(self.c.w3, [(tok, "balanceOf", (h,))
                                                       for h in self.holders])]

    def act(self, name: str, fn: Any, *args: Any) -> Any:
        STATS["actions"] += 1
        try:
            out = fn(*args)
        except ContractRevert as e:
            STATS[f"{name}!{e.error}"] += 1
            return None
        STATS[name] += 1
        return out

    # --- registry ------------------------------------------------------------------

    @precondition(lambda self: len(self.registered) < len(ACTORS))
    @rule(data=st.data(), roles=st.sampled_from([SOLVER, VERIFIER, 3]))
    def register(self, data: st.DataObject, roles: int) -> None:
        who = data.draw(st.sampled_from([i for i in ACTORS if i not in self.registered]))
        self.act("register", self.c[who].registry.register, roles, f"peer{who}", [], "{}")

    @rule(who=st.sampled_from(ACTORS), amount=st.integers(1, 400))
    def stake(self, who: int, amount: int) -> None:
        self.act("stake", self.c[who].stake, amount * TOKEN)

    @rule(who=st.sampled_from(ACTORS), amount=st.integers(1, 200))
    def request_unbond(self, who: int, amount: int) -> None:
        self.act("requestUnbond", self.c[who].registry.request_unbond, amount * TOKEN)

    @precondition(lambda self: bool(self.unbonding))
    @rule(data=st.data())
    def withdraw_unbonded(self, data: st.DataObject) -> None:
        who = data.draw(st.sampled_from(sorted(self.unbonding)))
        self.act("withdrawUnbonded", self.c[who].registry.withdraw_unbonded)

    # --- market --------------------------------------------------------------------
    # Rules pick jobs in the state they act on (tracked from events), so random walks
    # get far; wrong actors, timing and amounts still produce plenty of reverts.

    def in_state(self, *states: JobStatus) -> list[int]:
        return sorted(j for j, s in self.status.items() if s in states)

    @rule(who=st.sampled_from(ACTORS), reward=st.integers(1, 150), budget=st.integers(0, 40),
          duration=st.integers(30, MAX_DURATION))
    def post(self, who: int, reward: int, budget: int, duration: int) -> None:
        self.act("postJob", self.c[who].post_job, keccak(b"spec%d" % reward),
                 keccak(b"data"), reward * TOKEN, budget * TOKEN + 7, duration)

    @precondition(lambda self: self.in_state(JobStatus.OPEN))
    @rule(who=st.sampled_from(ACTORS), data=st.data())
    def claim(self, who: int, data: st.DataObject) -> None:
        job = data.draw(st.sampled_from(self.in_state(JobStatus.OPEN)))
        self.act("claimJob", self.c[who].market.claim_job, job)

    @precondition(lambda self: self.in_state(JobStatus.CLAIMED))
    @rule(data=st.data(), by_solver=st.integers(0, 5))
    def commit(self, data: st.DataObject, by_solver: int) -> None:
        job_id = data.draw(st.sampled_from(self.in_state(JobStatus.CLAIMED)))
        self.commit_as(job_id, self.c.addresses.index(self.solver[job_id]) if by_solver else 1)

    def commit_as(self, job_id: int, who: int) -> None:
        rnd = self.rounds[job_id]
        states = [keccak(b"%d-%d-%d" % (job_id, rnd, i)) for i in range(SEGMENTS + 1)]
        leaves, tree = build_trace_tree(job_id, K, states, [i * 10**9 for i in range(SEGMENTS)])
        if self.act("commitResult", self.c[who].market.commit_result, job_id, tree.root,
                    states[-1], SEGMENTS, K) is not None:
            self.traces[job_id] = (leaves, tree)

    @precondition(lambda self: self.in_state(JobStatus.COMMITTED))
    @rule(data=st.data())
    def fix_seed(self, data: st.DataObject) -> None:
        job = data.draw(st.sampled_from(self.in_state(JobStatus.COMMITTED)))
        self.act("fixSeed", self.c[1].market.fix_seed, job)

    @precondition(lambda self: self.in_state(JobStatus.COMMITTED))
    @rule(who=st.sampled_from(ACTORS), data=st.data(), pick=st.integers(0, 20),
          mine=st.booleans())
    def attest(self, who: int, data: st.DataObject, pick: int, mine: bool) -> None:
        job = data.draw(st.sampled_from(self.in_state(JobStatus.COMMITTED)))
        if mine:  # past the sampling block
            self.c.mine(3)
        try:
            sampled = self.c.reader.market.sampled_segments(job)
        except ContractRevert:
            sampled = [pick % SEGMENTS]
        self.act("attest", self.c[who].market.attest, job, sampled[pick % len(sampled)])

    def travel(self, seconds: int) -> None:
        STATS["actions"] += 1
        STATS["time_travel"] += 1
        self.c.advance(seconds)

    @precondition(lambda self: self.in_state(JobStatus.COMMITTED))
    @rule(data=st.data(), wait=st.integers(0, 2))
    def finalize(self, data: st.DataObject, wait: int) -> None:
        job = data.draw(st.sampled_from(self.in_state(JobStatus.COMMITTED)))
        if wait == 1:  # past the verification window, or the walk rarely gets there
            self.travel(WINDOW + 1)
        self.act("finalize", self.c[2].market.finalize, job)

    @precondition(lambda self: self.in_state(JobStatus.CLAIMED))
    @rule(data=st.data(), wait=st.integers(0, 2))
    def reclaim(self, data: st.DataObject, wait: int) -> None:
        job = data.draw(st.sampled_from(self.in_state(JobStatus.CLAIMED)))
        if wait == 1:
            self.travel(MAX_DURATION + 1)
        self.act("reclaim", self.c[3].market.reclaim, job)

    @precondition(lambda self: self.in_state(JobStatus.OPEN, JobStatus.CLAIMED))
    @rule(data=st.data(), by_submitter=st.integers(0, 3))
    def cancel(self, data: st.DataObject, by_submitter: int) -> None:
        job = data.draw(st.sampled_from(self.in_state(JobStatus.OPEN, JobStatus.CLAIMED)))
        who = self.c.addresses.index(self.submitter[job]) if by_submitter else 7
        self.act("cancel", self.c[who].market.cancel, job)

    def owed_to(self) -> list[int]:
        return [i for i in ACTORS if self.credits[("JobMarket", self.c.addresses[i])] > 0]

    @precondition(lambda self: self.owed_to())
    @rule(data=st.data(), anyone=st.integers(0, 4), who=st.sampled_from(ACTORS))
    def withdraw(self, data: st.DataObject, anyone: int, who: int) -> None:
        if anyone:  # mostly someone with a credit
            who = data.draw(st.sampled_from(self.owed_to()))
        self.act("withdraw", self.c[who].market.withdraw)

    @precondition(lambda self: self.in_state(JobStatus.OPEN, JobStatus.CLAIMED,
                                             JobStatus.COMMITTED))
    @rule(data=st.data(), choice=st.integers(0, 5), actor=st.integers(0, 5))
    def progress(self, data: st.DataObject, choice: int, actor: int) -> None:
        """The natural next move of some job, by a fitting actor. Hypothesis enables a
        random subset of rules per example (swarm testing); this one rule can carry a
        job through its whole life on its own."""
        job = data.draw(st.sampled_from(self.in_state(JobStatus.OPEN, JobStatus.CLAIMED,
                                                      JobStatus.COMMITTED)))
        state = self.status[job]
        if state == JobStatus.OPEN:
            self.act("claimJob", self.c[1 + actor % 3].market.claim_job, job)
        elif state == JobStatus.CLAIMED and choice == 0:
            self.travel(MAX_DURATION + 1)
            self.act("reclaim", self.c[7].market.reclaim, job)
        elif state == JobStatus.CLAIMED:
            self.commit_as(job, self.c.addresses.index(self.solver[job]))
        else:
            solver = self.c.addresses.index(self.solver[job])
            others = [i for i in (1, 2, 3, 4, 5, 6) if i != solver]
            verifier = others[actor % len(others)]
            if choice <= 2:
                self.c.mine(3)
                sampled = self.c.reader.market.sampled_segments(job)
                self.act("attest", self.c[verifier].market.attest, job,
                         sampled[actor % len(sampled)])
            elif choice == 3 and job in self.traces:
                self.challenge_as(job, verifier, actor % SEGMENTS)
            else:
                self.travel(WINDOW + 1)
                self.act("finalize", self.c[7].market.finalize, job)

    # --- disputes ------------------------------------------------------------------

    @precondition(lambda self: any(j in self.traces for j in self.in_state(JobStatus.COMMITTED)))
    @rule(who=st.sampled_from(ACTORS), data=st.data(), seg=st.integers(0, SEGMENTS - 1))
    def challenge(self, who: int, data: st.DataObject, seg: int) -> None:
        job = data.draw(st.sampled_from([j for j in self.in_state(JobStatus.COMMITTED)
                                         if j in self.traces]))
        self.challenge_as(job, who, seg)

    def challenge_as(self, job: int, who: int, seg: int) -> None:
        leaves, tree = self.traces[job]
        self.act("challenge", self.c[who].market.challenge, job, seg, leaves[seg],
                 tree.proof(seg), leaves[seg + 1], tree.proof(seg + 1))

    @precondition(lambda self: bool(self.disputes))
    @rule(data=st.data(), valid=st.booleans())
    def dispute_move(self, data: st.DataObject, valid: bool) -> None:
        did = data.draw(st.sampled_from(self.disputes))
        d = self.c.reader.dispute.get_dispute(did)
        idx = self.c.addresses.index
        hs = [keccak(b"mid%d" % t) for t in d.mid_steps]
        if d.phase == Phase.BISECTION and d.turn == Side.SOLVER:
            self.act("postMids", self.c[idx(d.solver)].dispute.post_mids, did, hs)
        elif d.phase == Phase.BISECTION:
            part = data.draw(st.integers(0, len(hs)))
            self.act("choose", self.c[idx(d.challenger)].dispute.choose, did, part, hs)
        elif d.phase == Phase.COMMIT and d.jury:
            juror = data.draw(st.sampled_from(d.jury))
            salt = keccak(b"salt%d" % did)
            self.votes[(did, juror)] = (valid, salt)
            self.act("commitVote", self.c[idx(juror)].dispute.commit_vote, did, valid, salt)
        elif d.phase == Phase.REVEAL and d.jury:
            juror = data.draw(st.sampled_from(d.jury))
            v, salt = self.votes.get((did, juror), (valid, bytes(32)))
            self.act("revealVote", self.c[idx(juror)].dispute.reveal_vote, did, v, salt)
        else:
            self.act("resolve", self.c[4].dispute.resolve, did)

    @precondition(lambda self: bool(self.disputes))
    @rule(data=st.data())
    def dispute_end(self, data: st.DataObject) -> None:
        did = data.draw(st.sampled_from(self.disputes))
        d = self.c[4].dispute
        self.act("timeout", d.timeout, did)
        self.act("abortMoot", d.abort_moot, did)

    @precondition(lambda self: bool(self.disputes))
    @rule(who=st.sampled_from(ACTORS))
    def dispute_withdraw(self, who: int) -> None:
        self.act("disputeWithdraw", self.c[who].dispute.withdraw)

    # --- time ----------------------------------------------------------------------

    @rule(seconds=st.sampled_from([1, 5, 10, 20, 30, 61, 400]), blocks=st.integers(1, 4))
    def time_travel(self, seconds: int, blocks: int) -> None:
        STATS["actions"] += 1
        STATS["time_travel"] += 1
        self.c.advance(seconds, blocks)

    # --- invariants ----------------------------------------------------------------

    def _track(self, ev: Any) -> None:
        """Job states, solvers and disputes, as the events tell them."""
        a = ev.args
        if ev.contract == "NodeRegistry":
            i = self.c.addresses.index(a["node"]) if a.get("node") in self.c.addresses else -1
            if ev.event == "NodeRegistered":
                self.registered.add(i)
            elif ev.event == "UnbondRequested":
                self.unbonding.add(i)
            elif ev.event == "UnbondWithdrawn":
                self.unbonding.discard(i)
        if ev.contract == "JobMarket":
            new = {"JobPosted": JobStatus.OPEN, "JobClaimed": JobStatus.CLAIMED,
                   "ResultCommitted": JobStatus.COMMITTED, "JobFinalized": JobStatus.FINALIZED,
                   "JobCancelled": JobStatus.CANCELLED, "JobReopened": JobStatus.OPEN,
                   "JobReclaimed": JobStatus.OPEN}.get(ev.event)
            if new is not None:
                self.status[a["jobId"]] = new
            if ev.event == "JobPosted":
                self.submitter[a["jobId"]] = a["submitter"]
            elif ev.event == "JobClaimed":
                self.solver[a["jobId"]], self.rounds[a["jobId"]] = a["solver"], a["round"]
            elif ev.event == "Challenged":
                self.disputes.append(a["disputeId"])

    @invariant()
    def conservation_and_events(self) -> None:
        r = self.c.reader
        tok = r.token
        for ev in self.watcher.poll():
            if ev.event == "Transfer":
                src, dst, value = ev.args["from"], ev.args["to"], ev.args["value"]
                if src in self.balances:
                    self.balances[src] -= value
                if dst in self.balances:
                    self.balances[dst] += value
            elif ev.event == "Credited":
                self.credits[(ev.contract, ev.args["account"])] += ev.args["amount"]
            elif ev.event == "Withdrawn" and ev.contract != "PolToken":
                self.credits[(ev.contract, ev.args["account"])] -= ev.args["amount"]
            self._track(ev)
        calls: list[Any] = [(tok, "balanceOf", (h,)) for h in self.holders]
        calls += [(b, "totalOwed", ()) for b in self.contracts.values()]
        credit_keys = [(name, a) for name in ("JobMarket", "DisputeGame")
                       for a in self.holders[:len(ACTORS)]]
        binding = {"JobMarket": r.market, "DisputeGame": r.dispute}
        calls += [(binding[n], "credits", (a,)) for n, a in credit_keys]
        out = batch_call(self.c.w3, calls)
        n = len(self.holders)
        actual = dict(zip(self.holders, out[:n], strict=True))
        owed = sum(out[n:n + 3])
        held = sum(actual[b.address] for b in self.contracts.values())
        assert held == owed, f"contracts hold {held} but owe {owed}"
        assert actual == self.balances, "a token balance moved without a Transfer event"
        credits = dict(zip(credit_keys, out[n + 3:], strict=True))
        assert credits == {k: self.credits[k] for k in credit_keys}, \
            "a credit changed without a Credited/Withdrawn event"


def test_random_actions_conserve_tokens(chain: LocalChain) -> None:
    from hypothesis.stateful import run_state_machine_as_test

    # A head start, so random walks reach claims and disputes: 1-3 solve and verify,
    # 4-6 verify, 7 starts unregistered. The rules still register and stake.
    for i in (1, 2, 3):
        chain.join(i, SOLVER | VERIFIER, 300 * TOKEN)
    for i in (4, 5, 6):
        chain.join(i, VERIFIER, 100 * TOKEN)
    assert chain.reader.market.market_params().verification_window == WINDOW
    Market.chain = chain
    Market.base = chain.snapshot()
    STATS.clear()
    run_state_machine_as_test(Market, settings=settings(
        max_examples=MAX_EXAMPLES, stateful_step_count=STEPS, derandomize=True, database=None,
        deadline=None, suppress_health_check=list(HealthCheck)))
    chain.revert(Market.base)
    print("\n" + ", ".join(f"{k}={v}" for k, v in sorted(STATS.items())))
    assert STATS["actions"] >= 2000, STATS["actions"]
    for must in ("register", "stake", "postJob", "claimJob", "commitResult", "attest",
                 "finalize", "withdraw", "cancel", "reclaim", "challenge"):
        assert STATS[must] > 0, f"no successful {must} in {STATS['actions']} actions"
