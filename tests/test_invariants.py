"""Stateful property test: random actions by several accounts against anvil.

After every step: (1) the token balance of registry + market + dispute game +
availability game equals the sum of what they say they owe; (2) every account's and contract's token
balance, the burn address's included, equals what the Transfer events since the
example began add up to (nothing moves without an event), and the token supply is
where it was (burned tokens sit at the burn address, none are minted or lost);
(3) every credit in the market and the game equals what its Credited / Withdrawn
events add up to; (4) the game's ``totalBurned`` is the sum of its ``Burned``
events (its ``totalOwed`` counts the delay compensation it holds, and a held
compensation goes only to the solver of a paid round, or is burned for a settled
condemned one); (5) each condemned round's finalize pays exactly one winner (``RewardPaid``):
the earliest-opened dispute of the round the solver lost (``Challenged``,
``DisputeResolved``), with a jurors' share only when a jury decided it, or, when none
was lost, the first requester whose availability request expired (dispute id 0). Each example
starts from the same snapshot; reverting it is what makes ~3,000 actions fit in
about a minute.

Block hashes (anvil draws each block's prevrandao at random) seed the committees
and juries, so a replayed example meets other committees, verdicts and job states.
Hypothesis replays prefixes of earlier examples even while generating, and raises
FlakyStrategyDefinition when the same choices draw differently. So no rule has a
precondition (a rule with nothing to act on idles), and every rule draws its
choices from fixed ranges and maps them onto the test's own model (built from
events) by index: what is drawn never depends on chain state.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any, TypeVar

from eth_utils import keccak
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from devnet.params import TOKEN
from devnet.testing import LocalChain, fake_trace, job_terms
from node.chain.bound import batch_call
from node.chain.contracts import SOLVER, VERIFIER, JobStatus, Phase, Side, Verdict
from node.chain.events import EventWatcher
from node.chain.ids import DisputeId
from node.errors import ContractRevert
from node.proof import MerkleTree, TraceLeaf

ACTORS = range(1, 8)  # dev accounts 1..7 play; 0 deployed everything
SEGMENTS, K = 6, 4  # k = 4 < fanout: one bisection round, then a jury
MAX_DURATION = 300
WINDOW = 60  # DevnetParams().market.verification_window, asserted in the test
BURN = "0x000000000000000000000000000000000000dEaD"
MAX_EXAMPLES, STEPS = int(os.environ.get("POLNET_INVARIANT_EXAMPLES", 60)), 40
STATS: Counter[str] = Counter()
PICK = st.integers(0, 2**16)  # an index into a model list, taken modulo its length

T = TypeVar("T")


def nth(items: Sequence[T], pick: int) -> T:
    return items[pick % len(items)]


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
        self.contracts = {"registry": r.registry, "market": r.market, "dispute": r.dispute,
                          "availability": r.availability}
        self.watcher = EventWatcher(c.w3, [r.token, r.registry, r.market, r.dispute,
                                           r.availability],
                                    start_block=c.w3.eth.block_number + 1)
        self.holders = [*c.addresses, *(b.address for b in self.contracts.values()), BURN]
        balances = self._balances()
        self.balances = dict(zip(self.holders, balances[:-1], strict=True))
        self.elsewhere = balances[-1] - sum(balances[:-1])  # supply held by nobody we watch
        self.burned_before = int(r.dispute.total_burned())
        self.juror_bps = r.market.market_params().juror_share_bps
        self.burned = 0  # sum of Burned events
        self.credits: dict[tuple[str, str], int] = defaultdict(int)
        self.traces: dict[int, tuple[list[TraceLeaf], MerkleTree]] = {}
        self.votes: dict[tuple[int, str], tuple[bool, bytes]] = {}
        self.revealed: set[tuple[int, str]] = set()  # reveals tried (each juror once)
        self.registered = {1, 2, 3, 4, 5, 6}  # see the head start below
        self.unbonding: set[int] = set()
        self.status: dict[int, JobStatus] = {}
        self.solver: dict[int, str] = {}
        self.submitter: dict[int, str] = {}
        self.rounds: dict[int, int] = {}
        self.committee: dict[tuple[int, int], list[str]] = {}
        self.attested: dict[tuple[int, int], set[str]] = defaultdict(set)
        # disputes: id -> (job, round, challenger); verdicts; those resolved in the game
        self.disputes: dict[int, tuple[int, int, str]] = {}
        self.verdict: dict[int, Verdict] = {}
        self.over: set[int] = set()
        self.paid: list[tuple[int, str, int, int]] = []  # RewardPaid of the tx being read
        # availability requests: id -> (job, round); pending ones; the first requester
        # whose request expired, per (job, round) (paid when no dispute was lost)
        self.requests: dict[int, tuple[int, int, int]] = {}  # id -> (job, round, segment)
        self.pending: set[int] = set()
        self.withheld: dict[tuple[int, int], str] = {}
        # delay compensation held per (job, round) (issue 30); condemned rounds settled
        self.held: set[tuple[int, int]] = set()
        self.settled: set[tuple[int, int]] = set()

    # --- helpers -------------------------------------------------------------------

    def _balances(self) -> list[int]:
        tok = self.c.reader.token
        calls: list[Any] = [(tok, "balanceOf", (h,)) for h in self.holders]
        return [int(b) for b in batch_call(self.c.w3, [*calls, (tok, "totalSupply", ())])]

    def act(self, name: str, fn: Any, *args: Any) -> Any:
        STATS["actions"] += 1
        try:
            out = fn(*args)
        except ContractRevert as e:
            STATS[f"{name}!{e.error}"] += 1
            return None
        STATS[name] += 1
        return out

    def idx(self, address: str) -> int:
        return self.c.addresses.index(address)

    def in_state(self, *states: JobStatus) -> list[int]:
        return sorted(j for j, s in self.status.items() if s in states)

    def live_disputes(self) -> list[int]:
        return sorted(d for d, (job, rnd, _) in self.disputes.items() if d not in self.over
                      and self.status.get(job) == JobStatus.COMMITTED
                      and self.rounds.get(job) == rnd)

    def idle(self, pick: int = 0) -> None:
        """Nothing for this rule to act on: every other time, the natural next move of
        some job instead (chosen from ``pick`` alone, so nothing more is drawn)."""
        STATS["idle"] += 1
        if pick % 2 == 0:
            self.progress(pick >> 1, (pick >> 1) % 6, (pick >> 4) % 6)

    def travel(self, seconds: int, blocks: int = 1) -> None:
        STATS["actions"] += 1
        STATS["time_travel"] += 1
        self.c.advance(seconds, blocks)

    @initialize(solver=st.sampled_from([1, 2, 3]), committed=st.integers(0, 3))
    def a_job_in_flight(self, solver: int, committed: int) -> None:
        """Every example starts with a job posted by 7 and claimed (mostly committed too),
        so the walk reaches attestations and disputes early."""
        self.act("postJob", self.c[7].post_job,
                 job_terms(reward=50 * TOKEN, budget=9 * TOKEN + 7, duration=MAX_DURATION,
                           segments=SEGMENTS, k=K))
        self._poll()
        job = max(self.status)
        self.act("claimJob", self.c[solver].market.claim_job, job)
        self._poll()
        if committed:
            self.commit_as(job, solver)

    # --- registry ------------------------------------------------------------------

    @rule(pick=PICK, roles=st.sampled_from([SOLVER, VERIFIER, 3]))
    def register(self, pick: int, roles: int) -> None:
        left = [i for i in ACTORS if i not in self.registered]
        if not left:
            return self.idle(pick)
        who = nth(left, pick)
        self.act("register", self.c[who].registry.register, roles, f"peer{who}", [], "{}")

    @rule(who=st.sampled_from(ACTORS), amount=st.integers(1, 400))
    def stake(self, who: int, amount: int) -> None:
        if amount > 390:  # now and then a change of roles instead
            roles = (SOLVER, VERIFIER, SOLVER | VERIFIER)[amount % 3]
            self.act("updateNode", self.c[who].registry.update_node, roles, f"peer{who}", [])
            return
        self.act("stake", self.c[who].stake, amount * TOKEN)

    @rule(who=st.sampled_from(ACTORS), amount=st.integers(1, 200))
    def request_unbond(self, who: int, amount: int) -> None:
        self.act("requestUnbond", self.c[who].registry.request_unbond, amount * TOKEN)

    @rule(pick=PICK, wait=st.integers(0, 9))
    def withdraw_unbonded(self, pick: int, wait: int) -> None:
        if not self.unbonding:
            return self.idle(pick)
        who = nth(sorted(self.unbonding), pick)
        if wait == 0:  # past the unbonding delay (900 s)
            self.travel(901)
        self.act("withdrawUnbonded", self.c[who].registry.withdraw_unbonded)

    # --- market --------------------------------------------------------------------
    # Rules pick jobs in the state they act on (tracked from events), so random walks
    # get far; wrong actors, timing and amounts still produce plenty of reverts.

    @rule(who=st.sampled_from(ACTORS), reward=st.integers(1, 150), budget=st.integers(0, 40),
          duration=st.integers(30, MAX_DURATION))
    def post(self, who: int, reward: int, budget: int, duration: int) -> None:
        if len(self.in_state(JobStatus.OPEN)) >= 3:  # enough open jobs already
            return self.idle(reward)
        terms = job_terms(reward=reward * TOKEN, budget=budget * TOKEN + 7, duration=duration,
                          segments=SEGMENTS, k=K, spec=keccak(b"spec%d" % reward))
        self.act("postJob", self.c[who].post_job, terms)

    @rule(who=st.sampled_from(ACTORS), pick=PICK)
    def claim(self, who: int, pick: int) -> None:
        if not self.in_state(JobStatus.OPEN):
            return self.idle(pick)
        job = nth(self.in_state(JobStatus.OPEN), pick)
        self.act("claimJob", self.c[who].market.claim_job, job)

    @rule(pick=PICK, by_solver=st.integers(0, 5), forged=st.integers(0, 7))
    def commit(self, pick: int, by_solver: int, forged: int) -> None:
        if not self.in_state(JobStatus.CLAIMED):
            return self.idle(pick)
        job_id = nth(self.in_state(JobStatus.CLAIMED), pick)
        self.commit_as(job_id, self.idx(self.solver[job_id]) if by_solver else 1, forged == 0)

    def commit_as(self, job_id: int, who: int, forged: bool = False) -> None:
        """Commit a made-up trace; ``forged``: one that starts from other weights."""
        tag = f"{job_id}-{self.rounds[job_id]}-"
        init = keccak(b"not-s0") if forged else None
        leaves, tree = (fake_trace(job_id, SEGMENTS, K, tag, init) if init else
                        fake_trace(job_id, SEGMENTS, K, tag))
        if self.act("commitResult", self.c[who].market.commit_trace, job_id, leaves,
                    tree) is not None:
            self.traces[job_id] = (leaves, tree)

    @rule(pick=PICK, mine=st.booleans())
    def fix_seed(self, pick: int, mine: bool) -> None:
        if not self.in_state(JobStatus.COMMITTED):
            return self.idle(pick)
        job = nth(self.in_state(JobStatus.COMMITTED), pick)
        if mine:
            self.c.mine(3)
        self.act("fixSeed", self.c[1].market.fix_seed, job)

    @rule(who=st.sampled_from(ACTORS), pick=PICK, seat=PICK, member=st.integers(0, 3),
          mine=st.booleans())
    def attest(self, who: int, pick: int, seat: int, member: int, mine: bool) -> None:
        if not self.in_state(JobStatus.COMMITTED):
            return self.idle(pick)
        job = nth(self.in_state(JobStatus.COMMITTED), pick)
        if mine:  # past the sampling block
            self.c.mine(3)
        committee = self.committee.get((job, self.rounds[job]), [])
        if member and committee:  # mostly a committee member; others revert NotInCommittee
            who = self.idx(nth(committee, seat))
        self.act("attest", self.c[who].market.attest, job)

    @rule(pick=PICK, wait=st.integers(0, 2))
    def finalize(self, pick: int, wait: int) -> None:
        if not self.in_state(JobStatus.COMMITTED):
            return self.idle(pick)
        job = nth(self.in_state(JobStatus.COMMITTED), pick)
        if wait == 1:  # past the verification window, or the walk rarely gets there
            self.travel(WINDOW + 1)
        self.act("finalize", self.c[2].market.finalize, job)

    @rule(pick=PICK, wait=st.integers(0, 2))
    def reclaim(self, pick: int, wait: int) -> None:
        if not self.in_state(JobStatus.CLAIMED):
            return self.idle(pick)
        job = nth(self.in_state(JobStatus.CLAIMED), pick)
        if wait == 1:
            self.travel(MAX_DURATION + 1)
        self.act("reclaim", self.c[3].market.reclaim, job)

    @rule(pick=PICK, by_submitter=st.integers(0, 3), claimed=st.integers(0, 3))
    def cancel(self, pick: int, by_submitter: int, claimed: int) -> None:
        """Mostly an open job (a claimed one reverts InvalidStatus)."""
        jobs = self.in_state(JobStatus.OPEN)
        if not claimed or not jobs:
            jobs = self.in_state(JobStatus.OPEN, JobStatus.CLAIMED)
        if not jobs:
            return self.idle(pick)
        job = nth(jobs, pick)
        who = self.idx(self.submitter[job]) if by_submitter else 7
        self.act("cancel", self.c[who].market.cancel, job)

    def owed_to(self, contract: str) -> list[int]:
        return [i for i in ACTORS if self.credits[(contract, self.c.addresses[i])] > 0]

    @rule(pick=PICK, anyone=st.integers(0, 4), who=st.sampled_from(ACTORS))
    def withdraw(self, pick: int, anyone: int, who: int) -> None:
        if anyone and self.owed_to("JobMarket"):  # mostly someone with a credit
            who = nth(self.owed_to("JobMarket"), pick)
        self.act("withdraw", self.c[who].market.withdraw)

    @rule(pick=PICK, choice=st.integers(0, 5), actor=st.integers(0, 5))
    def progress(self, pick: int, choice: int, actor: int) -> None:
        """The natural next move of some job, by a fitting actor. Hypothesis enables a
        random subset of rules per example (swarm testing); this one rule can carry a
        job through its whole life on its own."""
        jobs = self.in_state(JobStatus.OPEN, JobStatus.CLAIMED, JobStatus.COMMITTED)
        if not jobs:  # every job settled: a new one
            terms = job_terms(reward=(1 + pick % 100) * TOKEN, budget=7, duration=MAX_DURATION,
                              segments=SEGMENTS, k=K)
            self.act("postJob", self.c[1 + actor].post_job, terms)
            return
        job = nth(jobs, pick)
        state = self.status[job]
        if state == JobStatus.OPEN:
            self.act("claimJob", self.c[1 + actor % 3].market.claim_job, job)
        elif state == JobStatus.CLAIMED and choice == 0:
            self.travel(MAX_DURATION + 1)
            self.act("reclaim", self.c[7].market.reclaim, job)
        elif state == JobStatus.CLAIMED:
            self.commit_as(job, self.idx(self.solver[job]))
        else:
            key = (job, self.rounds[job])
            solver = self.idx(self.solver[job])
            others = [i for i in (1, 2, 3, 4, 5, 6) if i != solver]
            live = [d for d in self.live_disputes() if self.disputes[d][0] == job]
            if live and choice != 3:  # play a dispute of the job on, mostly to its end:
                # jurors all valid (choice 0, 2), all invalid (1, 4), or the solver
                # sits on its clock (5)
                self.advance_dispute(nth(live, pick), 12, actor, choice, 1,
                                     1 if choice == 5 else 5)
            elif choice <= 2:  # the next committee member attests (drawn on the way)
                if key not in self.committee:
                    self.c.mine(3)
                    self.act("fixSeed", self.c[7].market.fix_seed, job)
                    self._poll()
                waiting = [a for a in self.committee.get(key, [])
                           if a not in self.attested[key]]
                who = self.idx(nth(waiting, actor)) if waiting else nth(others, actor)
                self.act("attest", self.c[who].market.attest, job)
            elif choice == 3 and job in self.traces:
                self.challenge_as(job, nth(others, actor), actor % SEGMENTS, 12)
            else:
                self.travel(WINDOW + 1)
                self.act("finalize", self.c[7].market.finalize, job)

    @rule(pick=PICK, choice=st.integers(0, 5), actor=st.integers(0, 5))
    def progress_too(self, pick: int, choice: int, actor: int) -> None:
        """:meth:`progress` under a second name: hypothesis picks evenly among the
        enabled rules (and enables a random subset per example), so the natural next
        move is played about twice as often as any other rule."""
        self.progress(pick, choice, actor)

    # --- disputes ------------------------------------------------------------------

    @rule(who=st.sampled_from(ACTORS), pick=PICK, seg=st.integers(0, SEGMENTS - 1),
          follow=st.integers(0, 12))
    def challenge(self, who: int, pick: int, seg: int, follow: int) -> None:
        """A challenge, and ``follow`` moves of its dispute right away (its clocks run
        while the other rules play)."""
        jobs = [j for j in self.in_state(JobStatus.COMMITTED) if j in self.traces]
        if not jobs:
            return self.idle(pick)
        job = nth(jobs, pick)
        self.challenge_as(job, who, seg, follow)

    def challenge_as(self, job: int, who: int, seg: int, follow: int = 0) -> None:
        leaves, tree = self.traces[job]
        did = self.act("challenge", self.c[who].market.challenge, job, seg, leaves[seg],
                       tree.proof(seg), leaves[seg + 1], tree.proof(seg + 1))
        if did is not None and follow:
            self.advance_dispute(did, follow, seg + who, seg * who, who, follow)

    @rule(pick=PICK, moves=st.integers(1, 12), part=st.integers(0, 7), votes=PICK,
          silent=PICK, stall=st.integers(0, 5))
    def dispute_move(self, pick: int, moves: int, part: int, votes: int, silent: int,
                     stall: int) -> None:
        if not self.live_disputes():
            return self.idle(pick)
        self.advance_dispute(nth(self.live_disputes(), pick), moves, part, votes, silent,
                             stall)

    def advance_dispute(self, did: int, moves: int, part: int, votes: int, silent: int,
                        stall: int) -> None:
        """Up to ``moves`` next moves of a live dispute, each by whoever is to move (the
        live state says who; every choice comes from the drawn integers): mids, a
        part, the jury draw, commits and reveals, and the waits between them. Jurors
        mostly agree (``votes`` % 3: all valid, all invalid, or bit i + 2 says juror i
        votes valid); a third of the time bit i + 2 of ``silent`` keeps juror i from
        committing; with ``stall`` == 0 the uncommitted try to reveal anyway."""
        game = self.c.reader.dispute
        quiet = silent >> 2 if silent % 3 == 0 else 0

        def vote(i: int) -> bool:
            return (True, False, bool(votes >> (i + 2) & 1))[votes % 3]
        for _ in range(moves):
            d = game.get_dispute(DisputeId(did))
            hs = [keccak(b"mid%d" % t) for t in d.mid_steps]
            if d.phase == Phase.BISECTION and (d.solver_clock_left == 0
                                               or d.challenger_clock_left == 0):
                self.act("timeout", self.c[7].dispute.timeout, did)  # a clock ran out
            elif d.phase == Phase.BISECTION and d.turn == Side.SOLVER:
                if stall == 1:  # the solver sits on its clock
                    return
                self.act("postMids", self.c[self.idx(d.solver)].dispute.post_mids, did, hs)
            elif d.phase == Phase.BISECTION:
                if stall == 2:  # the challenger sits on its clock
                    return
                if self.act("choose", self.c[self.idx(d.challenger)].dispute.choose, did,
                            part % (len(hs) + 1 + (part == 7)), hs) is None:
                    return  # NoSuchPart (or ClockExpired)
            elif d.phase == Phase.DRAWING:
                if stall != 3:  # else too early: JuryNotReady
                    self.c.mine(max(1, d.draw_block - self.c.w3.eth.block_number + 1))
                self.act("drawJury", self.c[7].dispute.draw_jury, did)
            elif d.phase == Phase.COMMIT:
                todo = [i for i, v in enumerate(d.votes) if v.commitment == bytes(32)
                        and not quiet >> i & 1]
                if not todo:
                    self.travel(max(1, d.commit_end - self.c.timestamp()))
                    continue
                i = todo[0]
                who, valid, salt = d.jury[i], vote(i), keccak(b"salt%d" % did)
                self.votes[(did, who)] = (valid, salt)
                self.act("commitVote", self.c[self.idx(who)].dispute.commit_vote, did, valid,
                         salt)
            elif d.phase == Phase.REVEAL:
                todo = [i for i, v in enumerate(d.votes) if not v.revealed
                        and (v.commitment != bytes(32) or stall == 0)
                        and (did, d.jury[i]) not in self.revealed]
                if not todo:
                    self.travel(max(1, d.reveal_end - self.c.timestamp()))
                    self.act("resolve", self.c[4].dispute.resolve, did)
                    continue
                who = d.jury[todo[0]]
                self.revealed.add((did, who))
                valid, salt = self.votes.get((did, who), (True, bytes(32)))
                self.act("revealVote", self.c[self.idx(who)].dispute.reveal_vote, did, valid,
                         salt)
            else:
                self.act("resolve", self.c[4].dispute.resolve, did)  # WrongPhase
                return

    @rule(pick=PICK)
    def dispute_end(self, pick: int) -> None:
        if not self.live_disputes():
            return self.idle(pick)
        did = nth(self.live_disputes(), pick)
        d = self.c[4].dispute
        self.act("timeout", d.timeout, did)
        self.act("resolve", d.resolve, did)

    @rule(pick=PICK, anyone=st.integers(0, 4), who=st.sampled_from(ACTORS))
    def dispute_withdraw(self, pick: int, anyone: int, who: int) -> None:
        if not self.disputes:
            return self.idle(who)
        # mostly someone the game owes (with more rules it was drawn 3 times in 2,209
        # actions, never by a creditor)
        if anyone and self.owed_to("DisputeGame"):
            who = nth(self.owed_to("DisputeGame"), pick)
        self.act("disputeWithdraw", self.c[who].dispute.withdraw)

    @rule(pick=PICK, who=st.sampled_from(ACTORS))
    def settle_delay(self, pick: int, who: int) -> None:
        """Anyone settles a round's held delay compensation (reverts RoundNotSettled
        while the round is open)."""
        if not self.held:
            return self.idle(pick)
        job, rnd = nth(sorted(self.held), pick)
        self.act("settleDelay", self.c[who].dispute.settle_delay, job, rnd)

    # --- data availability -----------------------------------------------------------

    @rule(who=st.sampled_from(ACTORS), pick=PICK, seg=st.integers(0, SEGMENTS),
          lapse=st.integers(0, 3))
    def request(self, who: int, pick: int, seg: int, lapse: int) -> None:
        """An availability request (now and then on a segment out of range); now and then
        the solver lets it run out and it is expired at once (left to the `expire` rule
        alone, a run of 2,166 actions expired none)."""
        if not self.in_state(JobStatus.COMMITTED):
            return self.idle(pick)
        job = nth(self.in_state(JobStatus.COMMITTED), pick)
        c = self.c[who]
        c.token.ensure_allowance(c.availability.address, 5 * TOKEN)
        rid = self.act("request", c.availability.request, job, seg)
        if rid is not None and lapse == 0:  # past the answer window (60 s)
            self.travel(61)
            self.act("expire", self.c[2].availability.expire, rid)

    @rule(pick=PICK, seg=st.integers(0, SEGMENTS - 1), who=st.sampled_from(ACTORS))
    def publish(self, pick: int, seg: int, who: int) -> None:
        """Anyone holding the trace publishes a segment's leaves (answering a request on
        it, or as evidence); a pending request's segment is picked first."""
        jobs = [j for j in self.in_state(JobStatus.COMMITTED) if j in self.traces]
        if not jobs:
            return self.idle(pick)
        wanted = sorted(self.pending)
        if wanted and pick % 2 == 0:
            job, _, seg = self.requests[nth(wanted, pick >> 1)]
            if job not in self.traces:
                return self.idle(pick)
        else:
            job = nth(jobs, pick)
        leaves, tree = self.traces[job]
        self.act("publish", self.c[who].availability.publish, job, seg, leaves[seg],
                 tree.proof(seg), leaves[seg + 1], tree.proof(seg + 1))

    @rule(pick=PICK, wait=st.integers(0, 2))
    def expire(self, pick: int, wait: int) -> None:
        if not self.pending:
            return self.idle(pick)
        rid = nth(sorted(self.pending), pick)
        if wait == 1:  # past the answer window (60 s)
            self.travel(61)
        self.act("expire", self.c[2].availability.expire, rid)

    # --- time ----------------------------------------------------------------------

    @rule(seconds=st.sampled_from([1, 5, 10, 20, 30, 61, 400]), blocks=st.integers(1, 4))
    def time_travel(self, seconds: int, blocks: int) -> None:
        self.travel(seconds, blocks)

    # --- invariants ----------------------------------------------------------------

    def _track(self, ev: Any) -> None:
        """Job states, solvers, committees and disputes, as the events tell them."""
        a = ev.args
        if ev.contract == "NodeRegistry":
            i = self.c.addresses.index(a["node"]) if a.get("node") in self.c.addresses else -1
            if ev.event == "NodeRegistered":
                self.registered.add(i)
            elif ev.event == "UnbondRequested":
                self.unbonding.add(i)
            elif ev.event == "UnbondWithdrawn":
                self.unbonding.discard(i)
        elif ev.contract == "JobMarket":
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
            elif ev.event == "CommitteeDrawn":
                self.committee[(a["jobId"], a["round"])] = list(a["committee"])
            elif ev.event == "Attested":
                self.attested[(a["jobId"], a["round"])].add(a["verifier"])
            elif ev.event == "Challenged":
                self.disputes[a["disputeId"]] = (a["jobId"], a["round"], a["challenger"])
            elif ev.event == "DisputeResolved":
                self.verdict[a["disputeId"]] = Verdict(a["verdict"])
            elif ev.event == "RewardPaid":
                self.paid.append((a["disputeId"], a["challenger"], a["amount"], a["juryAmount"]))
            elif ev.event == "RoundSettled":
                STATS["roundSettled"] += 1
                self.settled.add((a["jobId"], a["round"]))
                self._check_settlement(a)
            elif ev.event == "AttestorSlashed":
                STATS["attestorSlashed"] += 1
        elif ev.contract == "Availability":
            if ev.event == "Requested":
                self.requests[a["requestId"]] = (a["jobId"], a["round"], a["segment"])
                self.pending.add(a["requestId"])
            elif ev.event == "Answered":
                self.pending.discard(a["requestId"])
            elif ev.event == "Expired":
                self.pending.discard(a["requestId"])
                job, rnd, _ = self.requests[a["requestId"]]
                self.withheld.setdefault((job, rnd), a["challenger"])
        elif ev.contract == "DisputeGame":
            if ev.event == "DisputeResolved":
                self.over.add(a["id"])
                STATS[f"verdict:{Verdict(a['verdict']).name}"] += 1
            elif ev.event == "Burned":
                self.burned += a["amount"]
            elif ev.event == "DelayCompensationHeld":
                self.held.add((a["jobId"], a["round"]))
            elif ev.event == "DelayCompensationSettled":
                key = (a["jobId"], a["round"])
                self.held.discard(key)
                STATS["delaySettled"] += 1
                if a["paid"]:  # only to the solver of a round that was paid
                    assert self.status.get(key[0]) == JobStatus.FINALIZED
                    assert self.rounds[key[0]] == key[1] and a["solver"] == self.solver[key[0]]
                else:  # burned only for a condemned round, once it settled
                    assert key in self.settled, "held compensation burned for an open round"

    def _check_settlement(self, a: Any) -> None:
        """A condemned round pays one winner, in the same finalize: the earliest-opened
        dispute of the round the solver lost, its jurors only when a jury decided it."""
        lost = sorted(d for d, (job, rnd, _) in self.disputes.items()
                      if (job, rnd) == (a["jobId"], a["round"])
                      and self.verdict.get(d) in (Verdict.INVALID, Verdict.SOLVER_TIMED_OUT))
        if not lost:  # condemned by an unanswered availability request alone
            who = self.withheld.get((a["jobId"], a["round"]))
            assert who, f"round {a['jobId']}/{a['round']} settled with nothing lost"
            assert self.paid == [(0, who, a["perChallenger"], 0)] and a["perJury"] == 0, \
                "paid someone other than the first requester left unanswered"
            STATS["rewardPaid"] += 1
            STATS["withheldSettled"] += 1
            self.paid.clear()
            return
        first = lost[0]
        jury = self.verdict[first] == Verdict.INVALID
        assert self.paid == [(first, self.disputes[first][2], a["perChallenger"],
                              a["perJury"])], "paid someone other than the first winner"
        want = a["slashedBond"] * self.juror_bps // 10_000 if jury else 0
        assert a["perJury"] == want, "jurors' share wrong (or paid for a clock win)"
        STATS["rewardPaid"] += 1
        self.paid.clear()

    def _poll(self) -> None:
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

    def teardown(self) -> None:
        """Every credit the walk left, in the market and the game, is withdrawable in full,
        and the books still balance after (so each example exercises both withdraws,
        whatever subset of rules hypothesis enabled: the walk itself is not reproducible,
        block timestamps seed the draws)."""
        self._poll()
        for who in self.owed_to("JobMarket"):
            self.act("withdraw", self.c[who].market.withdraw)
        for who in self.owed_to("DisputeGame"):
            self.act("disputeWithdraw", self.c[who].dispute.withdraw)
        self.conservation_and_events()
        assert not self.owed_to("JobMarket") and not self.owed_to("DisputeGame"), \
            "a credit survived its owner's withdraw"

    @invariant()
    def conservation_and_events(self) -> None:
        self._poll()
        r = self.c.reader
        tok = r.token
        calls: list[Any] = [(tok, "balanceOf", (h,)) for h in self.holders]
        calls += [(tok, "totalSupply", ())]
        calls += [(b, "totalOwed", ()) for b in self.contracts.values()]
        calls += [(r.dispute, "totalBurned", ())]
        credit_keys = [(name, self.c.addresses[i]) for name in ("JobMarket", "DisputeGame")
                       for i in ACTORS]
        binding = {"JobMarket": r.market, "DisputeGame": r.dispute}
        calls += [(binding[n], "credits", (a,)) for n, a in credit_keys]
        out = batch_call(self.c.w3, calls)
        n = len(self.holders)
        actual = dict(zip(self.holders, out[:n], strict=True))
        books = len(self.contracts)
        supply, owed = out[n], sum(out[n + 1:n + 1 + books])
        burned = out[n + 1 + books]
        held = sum(actual[b.address] for b in self.contracts.values())
        assert held == owed, f"contracts hold {held} but owe {owed}"
        assert actual == self.balances, "a token balance moved without a Transfer event"
        assert supply == sum(actual.values()) + self.elsewhere, "tokens appeared or vanished"
        assert burned == self.burned_before + self.burned, "totalBurned != sum of Burned"
        credits = dict(zip(credit_keys, out[n + 2 + books:], strict=True))
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
                 "finalize", "withdraw", "cancel", "reclaim", "challenge", "drawJury",
                 "commitVote", "revealVote", "roundSettled", "rewardPaid", "disputeWithdraw",
                 "request", "publish", "expire"):
        assert STATS[must] > 0, f"no successful {must} in {STATS['actions']} actions"
