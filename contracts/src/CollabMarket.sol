// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {ReentrancyGuardTransient} from "@openzeppelin/contracts/utils/ReentrancyGuardTransient.sol";
import {ICollabMarket} from "./interfaces/ICollabMarket.sol";
import {IJobMarket} from "./interfaces/IJobMarket.sol";
import {INodeRegistry} from "./interfaces/INodeRegistry.sol";
import {CaseId, CollabId, JobId} from "./interfaces/Ids.sol";
import {IOuterJury} from "./interfaces/IOuterJury.sol";

/// @title CollabMarket
/// @notice Collaborative (DiLoCo) jobs over the JobMarket. See {ICollabMarket}.
/// @dev This contract is the submitter of every sub-job. The market credits it (never pays it
///      directly); every credit arises inside one of its own calls (`finalize`, `reclaim`,
///      `cancel` of a reserved job are submitter-only), so `settleRound` attributes each by
///      the change of `market.credits(this)` around the call and withdraws them at once.
contract CollabMarket is ICollabMarket, ReentrancyGuardTransient {
    using SafeERC20 for IERC20;

    uint256 internal constant BPS = 10_000;
    uint256 internal constant MAX_DURATION = 365 days;
    uint256 internal constant MAX_AMOUNT = type(uint96).max;
    uint256 internal constant MAX_SLOTS = 64;
    uint8 internal constant MAX_DEPTH = 4;

    uint8 internal constant RELEASE_LEFT = 0;
    uint8 internal constant RELEASE_DROPPED = 1;
    uint8 internal constant RELEASE_THROUGHPUT = 2;
    uint8 internal constant RELEASE_JOB_OVER = 3;
    uint8 internal constant RELEASE_EXCLUDED = 4;
    uint8 internal constant DROP_MISSED = 0;
    uint8 internal constant DROP_CONDEMNED = 1;
    uint8 internal constant DROP_UNCLAIMED = 2;
    uint8 internal constant PAID = 3;
    uint8 internal constant ROLLBACK_CONDEMNED = 0;
    uint8 internal constant ROLLBACK_INVALID = 1;

    IERC20 internal immutable _token;
    INodeRegistry internal immutable _registry;
    IJobMarket internal immutable _market;
    IOuterJury internal immutable _jury;

    uint256 internal immutable _outerWindow;
    uint256 internal immutable _outerBond;
    uint256 internal immutable _slotBond;
    uint256 internal immutable _maxSlots;
    uint256 internal immutable _maxRounds;
    uint256 internal immutable _maxRoundRetries;
    uint256 internal immutable _toleranceBps;

    uint256 public override collabCount;
    // INVARIANT: token.balanceOf(this) == totalPools + totalCredits + totalBonds.
    uint256 public totalPools;
    uint256 public totalCredits;
    uint256 public totalBonds;

    struct CollabRec {
        CollabStatus status;
        RoundPhase phase;
        address submitter;
        uint32 minWorkers;
        uint32 maxWorkers;
        uint32 stepsPerSegment;
        uint32 rounds;
        uint32 round;
        uint32 retries;
        uint8 depth; // D: speculative rounds allowed past `round`
        uint32 ahead; // speculative rounds running: round + 1 .. round + ahead
        uint32 orphans; // sub-jobs of rolled-back rounds not settled yet: their escrow is out
        uint64 innerSteps;
        uint64 roundDuration;
        uint128 reward;
        uint128 verificationBudget;
        uint128 subReward;
        uint128 subBudget;
        uint256 pool;
        bytes32 specHash;
        bytes32 datasetHash;
        bytes32 initStateHash;
        bytes32 outerHash;
    }

    struct RoundRec {
        uint64 start;
        uint64 deadline;
        uint32 attempt;
        uint64 postedMask;
        uint64 acceptedMask;
        bool settled;
        bool accepted;
        OuterVerdict lastVerdict;
        ChallengePhase cPhase;
        address poster;
        uint64 postedAt;
        uint64 windowEnd;
        uint32 postNonce; // posts so far: bars are per post
        address challenger;
        uint256 juryCase; // the OuterJury case of the live (or last) challenge
        bytes32 outerHash;
        bytes32 nextInitHash;
    }

    mapping(uint256 => CollabRec) internal _collabs;
    mapping(uint256 => mapping(uint256 => address)) internal _slots; // job => slot => holder
    mapping(uint256 => mapping(uint32 => RoundRec)) internal _rounds;
    mapping(uint256 => mapping(uint32 => mapping(uint256 => uint256))) internal _subJobs; // job => round => slot => market id
    /// @dev market job id => collabJobId << 64 | round << 32 | slot
    mapping(uint256 => uint256) internal _subJobOf;
    mapping(address => uint64) internal _delivered;
    /// @dev job => worker => a sub-job of it was condemned: it never holds a slot again.
    mapping(uint256 => mapping(address => bool)) internal _excluded;
    mapping(address => uint64) internal _claimed;
    mapping(address => uint256) internal _credits;
    /// @dev keccak256(jobId, round, postNonce, challenger) => already challenged this post
    mapping(bytes32 => bool) internal _challenged;

    /// @dev What settleRound accumulates over a round's sub-jobs.
    struct Tally {
        uint256 poolGain;
        uint256 pot;
        uint32 accepted;
        uint64 mask;
        address[] workers; // accepted, one entry per accepted sub-job
        address[] nodes; // distinct accepted nodes
        address[] dropped; // workers dropped this round: no pot share, no record
        uint256 nDropped;
        uint256[] steps;
        uint256[] elapsed;
        uint256 nNodes;
        uint256 jobId;
        uint32 round;
        uint64 start;
        uint64 innerSteps;
        uint256 pipeForfeit; // pipeline bonds of condemned slots
    }

    constructor(
        IERC20 token_,
        INodeRegistry registry_,
        IJobMarket market_,
        IOuterJury jury_,
        Params memory params_
    ) {
        if (
            address(token_) == address(0) || address(registry_) == address(0) || address(market_) == address(0)
                || address(jury_) == address(0)
        ) {
            revert ZeroAddress();
        }
        if (
            params_.outerWindow < 2 || params_.outerWindow > MAX_DURATION || params_.outerBond > MAX_AMOUNT
                || params_.maxSlots == 0 || params_.maxSlots > MAX_SLOTS
                || params_.maxRounds == 0 || params_.maxRounds > 100_000 || params_.maxRoundRetries > 100
                || params_.throughputToleranceBps > BPS || params_.slotBond > MAX_AMOUNT
        ) revert InvalidParams();
        _token = token_;
        _registry = registry_;
        _market = market_;
        _jury = jury_;
        _outerWindow = params_.outerWindow;
        _outerBond = params_.outerBond;
        _slotBond = params_.slotBond;
        _maxSlots = params_.maxSlots;
        _maxRounds = params_.maxRounds;
        _maxRoundRetries = params_.maxRoundRetries;
        _toleranceBps = params_.throughputToleranceBps;
    }

    // --- submitter ---

    function postCollabJob(CollabTerms calldata t) external nonReentrant returns (uint256 jobId) {
        if (t.reward == 0) revert ZeroReward();
        if (t.specHash == 0 || t.datasetHash == 0 || t.initStateHash == 0 || t.outerInitHash == 0) revert ZeroHash();
        if (t.reward > MAX_AMOUNT / 100) revert AmountTooLarge(t.reward, MAX_AMOUNT / 100);
        if (t.verificationBudget > MAX_AMOUNT) revert AmountTooLarge(t.verificationBudget, MAX_AMOUNT);
        if (t.minWorkers == 0 || t.minWorkers > t.maxWorkers || t.maxWorkers > _maxSlots) {
            revert InvalidWorkers(t.minWorkers, t.maxWorkers);
        }
        uint256 k = t.stepsPerSegment;
        if (t.innerSteps == 0 || k == 0 || t.innerSteps % k != 0 || t.innerSteps / k > type(uint32).max) {
            revert InvalidSteps(t.innerSteps, t.stepsPerSegment);
        }
        if (t.rounds == 0 || t.rounds > _maxRounds) revert InvalidRounds(t.rounds);
        if (t.pipelineDepth > MAX_DEPTH) revert InvalidDepth(t.pipelineDepth);
        if (t.roundDuration == 0 || t.roundDuration > MAX_DURATION) revert InvalidDuration(t.roundDuration);
        // The required rate H * 1000 / roundDuration must fit a uint64 claim.
        if (uint256(t.innerSteps) * 1000 > type(uint64).max) revert InvalidSteps(t.innerSteps, t.stepsPerSegment);
        uint256 subJobs = uint256(t.rounds) * t.maxWorkers;
        uint256 subReward = t.reward / subJobs;
        if (subReward == 0) revert SubJobTooSmall(subReward);
        jobId = ++collabCount;
        CollabRec storage c = _collabs[jobId];
        c.status = CollabStatus.Open;
        c.submitter = msg.sender;
        c.minWorkers = t.minWorkers;
        c.maxWorkers = t.maxWorkers;
        c.stepsPerSegment = t.stepsPerSegment;
        c.rounds = t.rounds;
        c.depth = t.pipelineDepth;
        c.innerSteps = t.innerSteps;
        c.roundDuration = t.roundDuration;
        c.reward = uint128(t.reward);
        c.verificationBudget = uint128(t.verificationBudget);
        c.subReward = uint128(subReward);
        c.subBudget = uint128(t.verificationBudget / subJobs);
        c.specHash = t.specHash;
        c.datasetHash = t.datasetHash;
        c.initStateHash = t.initStateHash;
        c.outerHash = t.outerInitHash;
        uint256 escrow = t.reward + t.verificationBudget;
        c.pool = escrow;
        totalPools += escrow;
        _token.safeTransferFrom(msg.sender, address(this), escrow);
        emit CollabPosted(jobId, msg.sender, t.specHash, t.reward, t.verificationBudget, t.maxWorkers, t.rounds);
    }

    // --- workers ---

    function claimSlot(uint256 jobId, uint32 count, uint64 claimedRate) external {
        CollabRec storage c = _live(jobId);
        if (!_registry.isSolver(msg.sender)) revert NotRegisteredSolver(msg.sender);
        // INVARIANT: a worker proven wrong in a job (its sub-job condemned) is out of it.
        if (_excluded[jobId][msg.sender]) revert ExcludedWorker(jobId, msg.sender);
        if (count == 0) revert ZeroCount();
        uint256 required = _required(c);
        uint32 held;
        uint32 free;
        uint32 n = c.maxWorkers;
        for (uint32 i; i < n; ++i) {
            address h = _slots[jobId][i];
            if (h == msg.sender) ++held;
            else if (h == address(0)) ++free;
        }
        if (free < count) revert NotEnoughFreeSlots(count, free); // so count <= 64 below
        // The claim is the node's whole rate: it must cover every slot it would hold.
        uint256 needed = uint256(held + count) * required;
        if (claimedRate < needed) revert ThroughputTooLow(claimedRate, needed);
        uint32 cap = _cap(msg.sender, claimedRate, required);
        if (held + count > cap) revert SlotCapExceeded(held + count, cap);
        _claimed[msg.sender] = claimedRate;
        uint32 taken;
        for (uint32 i; taken < count; ++i) {
            if (_slots[jobId][i] != address(0)) continue;
            _slots[jobId][i] = msg.sender;
            ++taken;
            emit SlotClaimed(jobId, i, msg.sender, claimedRate);
        }
        // INVARIANT: every held slot is backed by a slot bond: back to its holder when the slot
        // is released, lost to the round's accepted workers when its sub-job goes unclaimed.
        _takeBond(_bondOf(c) * count);
    }

    function leaveSlot(uint256 jobId, uint32 slot) external {
        CollabRec storage c = _collab(jobId);
        if (_slots[jobId][slot] != msg.sender) revert NotSlotHolder(slot, msg.sender);
        // INVARIANT: a slot whose sub-job is live stays with its worker until the round
        // settles, so leaving cannot dodge the forfeit of an unclaimed sub-job (nor, pipelined,
        // of its pipeline bond: no slot is left while rounds run ahead).
        if (
            c.ahead != 0
                || (c.phase == RoundPhase.Running && _rounds[jobId][c.round].postedMask & (uint64(1) << slot) != 0)
        ) {
            revert WrongRoundPhase(jobId, c.phase);
        }
        _release(jobId, slot, msg.sender, RELEASE_LEFT, 0);
    }

    // --- rounds ---

    function startRound(uint256 jobId) external nonReentrant {
        CollabRec storage c = _live(jobId);
        uint32 r = c.round;
        bytes32 init = c.initStateHash;
        bool spec = c.phase != RoundPhase.Idle;
        if (spec) {
            // Pipelined: the next round after the newest started one, on its predecessor's post.
            if (c.depth == 0) revert WrongRoundPhase(jobId, c.phase);
            r += c.ahead + 1;
            // Never more than D ahead of the last finalized round, nor past the last round.
            if (c.ahead >= c.depth || r >= c.rounds) revert PipelineFull(r);
            init = _rounds[jobId][r - 1].nextInitHash;
            if (init == 0) revert NothingPosted(jobId, r - 1);
            // Slots change only while no sub-job is in flight: with the base settled and
            // nothing ahead (settlement releases the slots of the sub-jobs it drops).
            if (c.ahead == 0 && c.phase == RoundPhase.Outer) _enforceThroughput(jobId, c);
        } else {
            _enforceThroughput(jobId, c);
        }
        uint32 n = c.maxWorkers;
        uint32 held;
        for (uint32 i; i < n; ++i) {
            if (_holds(jobId, i)) ++held;
        }
        if (held < c.minWorkers) revert TooFewWorkers(held, c.minWorkers);
        uint256 need = (uint256(c.subReward) + c.subBudget) * held;
        if (c.pool < need) {
            // The base round decides, once the orphans' escrow is back.
            if (spec || c.orphans != 0) revert PipelineUnfunded();
            return _fail(jobId, c); // retries spent what later rounds needed
        }
        c.pool -= need;
        totalPools -= need;
        _token.forceApprove(address(_market), need);

        RoundRec storage rr = _rounds[jobId][r];
        rr.attempt = spec ? 0 : c.retries;
        rr.start = uint64(block.timestamp);
        rr.deadline = uint64(block.timestamp + c.roundDuration);
        rr.acceptedMask = 0;
        rr.settled = false;
        (uint64 mask, uint256[] memory ids) = _postSubJobs(jobId, c, r, init);
        rr.postedMask = mask;
        if (spec) {
            c.ahead += 1;
        } else {
            c.phase = RoundPhase.Running;
            c.status = CollabStatus.Running;
        }
        emit RoundStarted(jobId, r, rr.attempt, rr.deadline, ids);
    }

    function settleRound(uint256 jobId) external nonReentrant {
        CollabRec storage c = _live(jobId);
        if (c.phase != RoundPhase.Running) revert WrongRoundPhase(jobId, c.phase);
        uint32 r = c.round;
        RoundRec storage rr = _rounds[jobId][r];
        // INVARIANT: a live challenge of any candidate in flight (base or speculative) is decided
        // first: its verdict and this settlement may roll back the same rounds.
        _holdFor(jobId, r, r + c.ahead);
        uint32 n = c.maxWorkers;
        Tally memory t;
        t.workers = new address[](n);
        t.nodes = new address[](n);
        t.steps = new uint256[](n);
        t.elapsed = new uint256[](n);
        t.dropped = new address[](n);
        t.jobId = jobId;
        t.round = r;
        t.start = rr.start;
        t.innerSteps = c.innerSteps;
        for (uint32 i; i < n; ++i) {
            if (rr.postedMask & (uint64(1) << i) == 0) continue;
            _settleOne(rr, i, t);
        }
        // INVARIANT: every credit the market gave this contract came from the calls above.
        uint256 owed = _market.credits(address(this));
        if (owed != 0) {
            uint256 got = _market.withdraw();
            // Whatever is not escrow coming back is a slash share: the others' to share.
            t.pot += got - t.poolGain;
        }
        c.pool += t.poolGain;
        totalPools += t.poolGain;
        if (rr.poster != address(0) && t.mask != rr.postedMask) {
            // The candidate included a dropped (condemned) delta: withdrawn, its poster did
            // nothing wrong; every round built on it is rolled back.
            _withdrawPost(jobId, c, r, rr);
            t.pipeForfeit = _rollback(jobId, c, r, ROLLBACK_CONDEMNED, t.pipeForfeit);
        }
        t.pot += t.pipeForfeit;
        // The pot goes to the accepted sub-jobs of workers not dropped this round: a squatter
        // that works one slot and idles another recovers nothing of the idle slot's bond.
        uint256 sharers;
        for (uint256 w; w < t.accepted; ++w) {
            if (!_droppedIn(t, t.workers[w])) ++sharers;
        }
        uint256 each = sharers == 0 ? 0 : t.pot / sharers;
        for (uint256 w; w < t.accepted; ++w) {
            if (!_droppedIn(t, t.workers[w])) _credit(t.workers[w], each);
        }
        _credit(c.submitter, t.pot - each * sharers);
        for (uint256 d; d < t.nNodes; ++d) {
            if (_droppedIn(t, t.nodes[d])) continue; // its record stays cleared
            uint256 el = t.elapsed[d] == 0 ? 1 : t.elapsed[d];
            uint256 rate = t.steps[d] * 1000 / el;
            if (rate > type(uint64).max) rate = type(uint64).max;
            if (rate == 0) rate = 1; // 0 means "no record"
            _delivered[t.nodes[d]] = uint64(rate);
            emit DeliveredRecorded(t.nodes[d], uint64(rate));
        }
        rr.acceptedMask = t.mask;
        rr.settled = true;
        emit RoundSettled(jobId, r, t.mask, t.accepted, t.pot, each);
        if (t.accepted >= c.minWorkers) {
            c.phase = RoundPhase.Outer;
        } else if (c.retries < _maxRoundRetries) {
            c.retries += 1;
            c.phase = RoundPhase.Idle;
            emit RoundRetried(jobId, r, c.retries);
        } else {
            _fail(jobId, c);
        }
    }

    // --- outer state ---

    function postOuter(uint256 jobId, uint32 round, bytes32 outerHash, bytes32 nextInitHash) external nonReentrant {
        CollabRec storage c = _live(jobId);
        RoundRec storage rr = _rounds[jobId][round];
        if (c.depth == 0 || (round == c.round && c.phase == RoundPhase.Outer)) _outerRound(jobId, round);
        else _requireCandidate(jobId, round, c, rr);
        if (rr.poster != address(0)) revert AlreadyPosted(jobId, round);
        if (outerHash == 0 || nextInitHash == 0) revert ZeroHash();
        rr.poster = msg.sender;
        rr.postedAt = uint64(block.timestamp);
        rr.windowEnd = uint64(block.timestamp + _outerWindow);
        rr.outerHash = outerHash;
        rr.nextInitHash = nextInitHash;
        rr.postNonce += 1;
        _takeBond(_outerBond + _pipeBond(c));
        emit OuterPosted(jobId, round, msg.sender, outerHash, nextInitHash, rr.windowEnd);
    }

    function challengeOuter(uint256 jobId, uint32 round) external nonReentrant {
        // Any candidate in flight, speculative ones too, within its window from its post.
        RoundRec storage rr = _posted(jobId, round);
        if (rr.cPhase != ChallengePhase.None) revert ChallengeLive(jobId, round);
        if (block.timestamp >= rr.windowEnd) revert OuterWindowClosed(rr.windowEnd);
        if (msg.sender == rr.poster) revert PosterCannotChallenge();
        bytes32 key = keccak256(abi.encode(jobId, round, rr.postNonce, msg.sender));
        // INVARIANT: one challenge per address per post: a Void cannot be replayed forever.
        if (_challenged[key]) revert AlreadyChallenged(msg.sender);
        _challenged[key] = true;
        rr.challenger = msg.sender;
        rr.cPhase = ChallengePhase.Live;
        _takeBond(_outerBond);
        uint256 caseId = CaseId.unwrap(_jury.open(CollabId.wrap(jobId), round, rr.poster, msg.sender));
        rr.juryCase = caseId;
        emit OuterChallenged(jobId, round, msg.sender, caseId);
    }

    function resolveOuter(uint256 jobId, uint32 round) external nonReentrant {
        RoundRec storage rr = _posted(jobId, round);
        if (rr.cPhase != ChallengePhase.Live) revert NoChallenge(jobId, round);
        uint256 held = _token.balanceOf(address(this));
        (IOuterJury.Verdict v, uint32 validVotes, uint32 invalidVotes, address[] memory majority,) =
            _jury.tally(CaseId.wrap(rr.juryCase));
        // INVARIANT: credit exactly what arrived: the jurors' slashed stake forwarded by the
        // tally is owed from now on (counted with the bonds until _resolve pays it out).
        uint256 slashed = _token.balanceOf(address(this)) - held;
        totalBonds += slashed;
        _resolve(jobId, round, rr, OuterVerdict(uint8(v)), validVotes, invalidVotes, majority, slashed);
    }

    function acceptOuter(uint256 jobId, uint32 round) external nonReentrant {
        CollabRec storage c = _collabs[jobId];
        // INVARIANT: a round finalizes settled, as the base: in order.
        if (round != c.round) revert WrongRound(round, c.round);
        RoundRec storage rr = _posted(jobId, round);
        if (rr.cPhase != ChallengePhase.None) revert ChallengeLive(jobId, round);
        if (block.timestamp < rr.windowEnd) revert OuterWindowOpen(rr.windowEnd);
        if (c.phase != RoundPhase.Outer) revert WrongRoundPhase(jobId, c.phase);
        rr.accepted = true;
        uint256 bond = _outerBond + _pipeBond(c);
        totalBonds -= bond;
        _credit(rr.poster, bond);
        c.outerHash = rr.outerHash;
        c.initStateHash = rr.nextInitHash;
        emit OuterAccepted(jobId, round, rr.outerHash, rr.nextInitHash);
        c.round = round + 1;
        c.retries = 0;
        c.phase = RoundPhase.Idle;
        if (c.ahead != 0) {
            // The next round already runs, on this very post (any other would have rolled it back).
            // Its candidate, if posted, was challengeable from its post: its window is not
            // extended (windows of consecutive rounds overlap).
            c.ahead -= 1;
            c.phase = RoundPhase.Running;
        }
        if (c.round == c.rounds) {
            c.status = CollabStatus.Finished;
            uint256 refund = _drainPool(jobId, c);
            emit CollabFinished(jobId, rr.outerHash, refund);
        }
    }

    function settleOrphan(uint256 id) external nonReentrant {
        (uint256 jobId, uint32 q, uint32 slot) = _unpackSubJob(_subJobOf[id]);
        CollabRec storage c = _collabs[jobId];
        // An orphan: its round was rolled back and not restarted, or restarted without it;
        // and still open in the market (settled once: a second call is NotOrphan too).
        IJobMarket.JobStatus st = _jobFields(id).status;
        if (
            jobId == 0 || st == IJobMarket.JobStatus.Finalized || st == IJobMarket.JobStatus.Cancelled
                || (q <= c.round + c.ahead && _subJobs[jobId][q][slot] == id
                    && _rounds[jobId][q].postedMask & (uint64(1) << slot) != 0)
        ) revert NotOrphan(id);
        (uint8 outcome,,) = _closeSubJob(id, 0);
        c.orphans -= 1; // only a rolled-back sub-job is still open here
        if (outcome == DROP_CONDEMNED) _exclude(jobId, _market.reservedSolverOf(JobId.wrap(id)));
        // Escrow, unpaid budget and slash shares: the pool's (the submitter's once it is over).
        uint256 got = _market.credits(address(this)) == 0 ? 0 : _market.withdraw();
        if (c.status <= CollabStatus.Running) {
            c.pool += got;
            totalPools += got;
        } else {
            _credit(c.submitter, got);
        }
        emit OrphanSettled(jobId, id, outcome == PAID);
    }

    function withdraw() external nonReentrant returns (uint256 amount) {
        amount = _credits[msg.sender];
        if (amount == 0) revert NothingToWithdraw();
        _credits[msg.sender] = 0;
        totalCredits -= amount;
        _token.safeTransfer(msg.sender, amount);
        emit Withdrawn(msg.sender, amount);
    }

    // --- views ---

    function params() external view returns (Params memory) {
        return Params({
            outerWindow: _outerWindow,
            outerBond: _outerBond,
            maxSlots: _maxSlots,
            maxRounds: _maxRounds,
            maxRoundRetries: _maxRoundRetries,
            throughputToleranceBps: _toleranceBps,
            slotBond: _slotBond
        });
    }

    function getCollab(uint256 jobId) external view returns (Collab memory v) {
        CollabRec storage c = _collabs[jobId];
        v.status = c.status;
        v.phase = c.phase;
        v.submitter = c.submitter;
        v.specHash = c.specHash;
        v.datasetHash = c.datasetHash;
        v.reward = c.reward;
        v.verificationBudget = c.verificationBudget;
        v.subReward = c.subReward;
        v.subBudget = c.subBudget;
        v.pool = c.pool;
        v.minWorkers = c.minWorkers;
        v.maxWorkers = c.maxWorkers;
        v.innerSteps = c.innerSteps;
        v.stepsPerSegment = c.stepsPerSegment;
        v.rounds = c.rounds;
        v.roundDuration = c.roundDuration;
        v.round = c.round;
        v.retries = c.retries;
        v.initStateHash = c.initStateHash;
        v.outerHash = c.outerHash;
        v.pipelineDepth = c.depth;
        v.ahead = c.ahead;
    }

    function slotHolders(uint256 jobId) external view returns (address[] memory holders) {
        uint32 n = _collabs[jobId].maxWorkers;
        holders = new address[](n);
        for (uint32 i; i < n; ++i) {
            holders[i] = _slots[jobId][i];
        }
    }

    function getRound(uint256 jobId, uint32 round) external view returns (RoundView memory v) {
        RoundRec storage rr = _rounds[jobId][round];
        uint32 n = _collabs[jobId].maxWorkers;
        v.start = rr.start;
        v.deadline = rr.deadline;
        v.attempt = rr.attempt;
        v.subJobs = new uint256[](n);
        for (uint32 i; i < n; ++i) {
            if (rr.postedMask & (uint64(1) << i) != 0) v.subJobs[i] = _subJobs[jobId][round][i];
        }
        v.acceptedMask = rr.acceptedMask;
        v.settled = rr.settled;
        v.outerHash = rr.outerHash;
        v.nextInitHash = rr.nextInitHash;
        v.poster = rr.poster;
        v.postedAt = rr.postedAt;
        v.windowEnd = rr.windowEnd;
        v.accepted = rr.accepted;
        v.challengePhase = rr.cPhase;
        v.challenger = rr.challenger;
        v.juryCase = rr.juryCase;
        v.lastVerdict = rr.lastVerdict;
    }

    function subJobOf(uint256 marketJobId) external view returns (uint256 collabJobId, uint32 round, uint32 slot) {
        return _unpackSubJob(_subJobOf[marketJobId]);
    }

    /// @inheritdoc ICollabMarket
    /// @dev While any is open its escrow is out of the pool, and speculative rounds wait.
    function orphansOf(uint256 jobId) external view returns (uint32) {
        return _collabs[jobId].orphans;
    }

    function isExcluded(uint256 jobId, address node) external view returns (bool) {
        return _excluded[jobId][node];
    }

    function deliveredOf(address node) external view returns (uint64) {
        return _delivered[node];
    }

    function claimedOf(address node) external view returns (uint64) {
        return _claimed[node];
    }

    function credits(address account) external view returns (uint256) {
        return _credits[account];
    }

    function totalOwed() external view returns (uint256) {
        return totalPools + totalCredits + totalBonds;
    }

    // --- internals ---

    function _collab(uint256 jobId) internal view returns (CollabRec storage c) {
        c = _collabs[jobId];
        if (c.status == CollabStatus.None) revert UnknownCollab(jobId);
    }

    function _live(uint256 jobId) internal view returns (CollabRec storage c) {
        c = _collab(jobId);
        if (c.status != CollabStatus.Open && c.status != CollabStatus.Running) revert CollabNotLive(jobId, c.status);
    }

    /// @dev The current round, settled and waiting for its outer state.
    function _outerRound(uint256 jobId, uint32 round) internal view returns (RoundRec storage) {
        CollabRec storage c = _live(jobId);
        if (round != c.round) revert WrongRound(round, c.round);
        // Pipelined, the base round's candidate is challenged while the round still runs.
        if (c.phase != RoundPhase.Outer && (c.depth == 0 || c.phase != RoundPhase.Running)) {
            revert WrongRoundPhase(jobId, c.phase);
        }
        return _rounds[jobId][round];
    }

    /// @dev A candidate's round: started and unsettled (the base Running, or speculative),
    ///      every posted sub-job Committed, so the candidate is over all of them. (The base
    ///      only while Running: when Idle nothing runs ahead either.)
    function _requireCandidate(uint256 jobId, uint32 round, CollabRec storage c, RoundRec storage rr)
        internal
        view
    {
        if (round > c.round + c.ahead || round < c.round + (c.phase == RoundPhase.Running ? 0 : 1)) {
            revert WrongRound(round, c.round);
        }
        for (uint32 i; i < c.maxWorkers; ++i) {
            if (rr.postedMask & (uint64(1) << i) == 0) continue;
            uint256 id = _subJobs[jobId][round][i];
            if (_jobFields(id).status != IJobMarket.JobStatus.Committed) revert SubJobNotCommitted(id);
        }
    }

    /// @dev A market sub-job's (collab job, round, slot), one word: `_subJobOf`'s layout.
    function _packSubJob(uint256 jobId, uint32 round, uint32 slot) internal pure returns (uint256) {
        return (jobId << 64) | (uint256(round) << 32) | slot;
    }

    function _unpackSubJob(uint256 p) internal pure returns (uint256 jobId, uint32 round, uint32 slot) {
        return (p >> 64, uint32(p >> 32), uint32(p));
    }

    /// @dev A posted round in flight: the base (as `_outerRound`) or a speculative one.
    function _posted(uint256 jobId, uint32 round) internal view returns (RoundRec storage rr) {
        CollabRec storage c = _live(jobId);
        if (round <= c.round || round > c.round + c.ahead) rr = _outerRound(jobId, round);
        else rr = _rounds[jobId][round]; // c.round < round <= c.round + ahead: live, D > 0
        if (rr.poster == address(0)) revert NothingPosted(jobId, round);
    }

    /// @dev Revert while a challenge of any round from..to is live.
    function _holdFor(uint256 jobId, uint32 from, uint32 to) internal view {
        for (uint32 q = from; q <= to; ++q) {
            if (_rounds[jobId][q].cPhase != ChallengePhase.None) revert ChallengeLive(jobId, q);
        }
    }

    /// @dev Per-slot rate a round needs, in milli-steps per second, rounded up.
    function _required(CollabRec storage c) internal view returns (uint256) {
        return (uint256(c.innerSteps) * 1000 + c.roundDuration - 1) / c.roundDuration;
    }

    /// @dev Slots a node may hold in a job: one without a delivered record (no accepted inner
    ///      run since it was last dropped), since its claimed rate is only its word; else capped
    ///      by what it delivered when that fell short of its claim.
    function _cap(address node, uint256 claimedRate, uint256 required) internal view returns (uint32) {
        uint256 d = _delivered[node];
        if (d == 0) return 1;
        if (d * BPS >= claimedRate * (BPS - _toleranceBps)) return type(uint32).max;
        uint256 cap = d / required;
        return cap == 0 ? 1 : (cap > MAX_SLOTS ? uint32(MAX_SLOTS) : uint32(cap));
    }

    /// @dev Before a round: excluded nodes lose their slots (bonds back: those slots were not
    ///      the ones dropped); nodes over their cap keep their lowest slots only.
    function _enforceThroughput(uint256 jobId, CollabRec storage c) internal {
        uint32 n = c.maxWorkers;
        uint256 required = _required(c);
        address[] memory seen = new address[](n);
        uint32[] memory kept = new uint32[](n);
        uint256 m;
        for (uint32 i; i < n; ++i) {
            address h = _slots[jobId][i];
            if (h == address(0)) continue;
            if (_excluded[jobId][h]) {
                _release(jobId, i, h, RELEASE_EXCLUDED, 0);
                continue;
            }
            uint256 s;
            while (s < m && seen[s] != h) ++s;
            if (s == m) seen[m++] = h;
            if (kept[s] < _cap(h, _claimed[h], required)) {
                ++kept[s];
            } else {
                _release(jobId, i, h, RELEASE_THROUGHPUT, 0);
            }
        }
    }

    /// @dev One reserved sub-job per held slot, for the round's S_0.
    function _postSubJobs(uint256 jobId, CollabRec storage c, uint32 r, bytes32 init)
        internal
        returns (uint64 mask, uint256[] memory ids)
    {
        uint32 n = c.maxWorkers;
        IJobMarket.JobTerms memory terms = IJobMarket.JobTerms({
            specHash: c.specHash,
            datasetHash: c.datasetHash,
            reward: c.subReward,
            verificationBudget: c.subBudget,
            solveDuration: c.roundDuration,
            totalSteps: c.innerSteps,
            stepsPerSegment: c.stepsPerSegment,
            initStateHash: init,
            sampleCount: 0 // a reserved job's sample is the market's own rule
        });
        ids = new uint256[](n);
        for (uint32 i; i < n; ++i) {
            if (!_holds(jobId, i)) continue;
            address h = _slots[jobId][i];
            uint256 id = JobId.unwrap(_market.postReservedJob(terms, h));
            ids[i] = id;
            mask |= uint64(1) << i;
            _subJobs[jobId][r][i] = id;
            _subJobOf[id] = _packSubJob(jobId, r, i);
            emit SubJobPosted(jobId, r, i, id, h);
        }
    }

    /// @dev One sub-job of the round being settled, through the market.
    function _settleOne(RoundRec storage rr, uint32 slot, Tally memory t) internal {
        uint256 jobId = t.jobId;
        uint256 id = _subJobs[jobId][t.round][slot];
        address worker = _market.reservedSolverOf(JobId.wrap(id));
        (uint8 dropReason, uint64 committedAt, uint256 back) = _closeSubJob(id, rr.deadline);
        // Escrow and unpaid budget back to the pool; any other credit is a slash share (the pot).
        t.poolGain += back;
        if (dropReason == PAID) return _accept(slot, id, worker, committedAt, t);
        // INVARIANT: a dropped worker loses its slot (it held it all round: leaveSlot waits
        // for the settlement) and its delivered record, so it holds one slot per job until it
        // delivers again (its extra slots go at each job's next startRound). A missed
        // deadline, claimed or not, also forfeits the slot bond to the pot the round's other
        // accepted workers share; a condemned run's worker (its sub-job bond slashed by the
        // market, its slot bond back) is out of the job. Before, a claimed-and-missed sub-job
        // cost only the market's missed-deadline share: cheaper than leaving it unclaimed.
        // Pipelined, the pipeline bond P is lost only by a condemned run (it refills the pool
        // for the rounds rolled back), never by a miss (a miss cannot invalidate a candidate).
        uint256 lost;
        if (dropReason != DROP_CONDEMNED) {
            lost = _slotBond;
            t.pot += lost;
        } else {
            lost = _pipeBond(_collabs[jobId]);
            t.pipeForfeit += lost;
        }
        _release(jobId, slot, worker, RELEASE_DROPPED, lost);
        emit SubJobDropped(jobId, t.round, slot, id, worker, dropReason);
        _delivered[worker] = 0;
        if (!_droppedIn(t, worker)) t.dropped[t.nDropped++] = worker;
        if (dropReason == DROP_CONDEMNED) _exclude(jobId, worker);
    }

    /// @dev Bring a sub-job to its end through the market: PAID (finalized clean, the worker
    ///      paid) or the DROP_ reason (cancelled). `back`: what the market credited this contract
    ///      for escrow and unpaid budget. An unclaimed one is cancelled past `roundDeadline`
    ///      (an orphan's is 0: at once; a finalized orphan is not settled twice).
    function _closeSubJob(uint256 id, uint64 roundDeadline)
        internal
        returns (uint8 outcome, uint64 committedAt, uint256 back)
    {
        JobFields memory j = _jobFields(id);
        uint256 pre = _market.credits(address(this));
        if (j.status == IJobMarket.JobStatus.Committed) {
            if (block.timestamp < j.windowEnd || j.openDisputes != 0) revert RoundNotSettled(id);
            _market.finalize(JobId.wrap(id));
            if (_jobFields(id).status == IJobMarket.JobStatus.Finalized) {
                return (PAID, j.committedAt, _market.credits(address(this)) - pre);
            }
            outcome = DROP_CONDEMNED; // the market slashed the bond; our share is in the pot
        } else if (j.status == IJobMarket.JobStatus.Claimed) {
            if (block.timestamp <= j.deadline) revert RoundNotSettled(id);
            _market.reclaim(JobId.wrap(id));
            outcome = DROP_MISSED;
        } else if (j.status == IJobMarket.JobStatus.Open) {
            if (block.timestamp <= roundDeadline) revert RoundNotSettled(id);
            outcome = DROP_UNCLAIMED;
        } else if (j.status == IJobMarket.JobStatus.Finalized && roundDeadline != 0) {
            return (PAID, j.committedAt, 0);
        } else {
            revert RoundNotSettled(id); // Cancelled: never, only this contract cancels
        }
        pre = _market.credits(address(this));
        _market.cancel(JobId.wrap(id));
        back = _market.credits(address(this)) - pre;
    }

    function _exclude(uint256 jobId, address worker) internal {
        if (_excluded[jobId][worker]) return;
        _excluded[jobId][worker] = true;
        emit WorkerExcluded(jobId, worker);
    }

    function _droppedIn(Tally memory t, address worker) internal pure returns (bool) {
        for (uint256 i; i < t.nDropped; ++i) {
            if (t.dropped[i] == worker) return true;
        }
        return false;
    }

    /// @dev The few fields of `market.getJob` settlement reads. IJobMarket.Job is all static
    ///      types, so field i is word i of the return data; read without decoding 26 fields.
    struct JobFields {
        IJobMarket.JobStatus status;
        uint64 deadline;
        uint64 committedAt;
        uint64 windowEnd;
        uint32 openDisputes;
    }

    function _jobFields(uint256 id) internal view returns (JobFields memory f) {
        (bool ok, bytes memory ret) = address(_market).staticcall(abi.encodeCall(IJobMarket.getJob, (JobId.wrap(id))));
        if (!ok || ret.length < 20 * 32) revert RoundNotSettled(id);
        uint256 status;
        uint256 deadline;
        uint256 committedAt;
        uint256 windowEnd;
        uint256 openDisputes;
        assembly ("memory-safe") {
            let p := add(ret, 32)
            status := mload(p)
            deadline := mload(add(p, 320)) // word 10
            committedAt := mload(add(p, 352)) // word 11
            windowEnd := mload(add(p, 384)) // word 12
            openDisputes := mload(add(p, 608)) // word 19
        }
        f.status = IJobMarket.JobStatus(status);
        f.deadline = uint64(deadline);
        f.committedAt = uint64(committedAt);
        f.windowEnd = uint64(windowEnd);
        f.openDisputes = uint32(openDisputes);
    }

    function _accept(uint32 slot, uint256 id, address worker, uint64 committedAt, Tally memory t) internal {
        uint256 elapsed = committedAt - t.start;
        t.workers[t.accepted++] = worker;
        t.mask |= uint64(1) << slot;
        uint256 s;
        while (s < t.nNodes && t.nodes[s] != worker) ++s;
        if (s == t.nNodes) t.nodes[t.nNodes++] = worker;
        t.steps[s] += t.innerSteps;
        if (elapsed > t.elapsed[s]) t.elapsed[s] = elapsed;
        emit SubJobAccepted(t.jobId, t.round, slot, id, worker);
    }

    /// @dev Settle a challenge of the posted outer state. `slashed`: the silent and minority
    ///      jurors' stake the tally forwarded, already counted in totalBonds; it goes to the
    ///      majority with their share of the losing bond.
    function _resolve(
        uint256 jobId,
        uint32 round,
        RoundRec storage rr,
        OuterVerdict verdict,
        uint32 validVotes,
        uint32 invalidVotes,
        address[] memory majority,
        uint256 slashed
    ) internal {
        uint256 bond = _outerBond;
        address poster = rr.poster;
        address challenger = rr.challenger;
        rr.cPhase = ChallengePhase.None;
        rr.challenger = address(0);
        rr.lastVerdict = verdict;
        if (verdict == OuterVerdict.Valid) {
            // The challenger's bond: half to the majority jurors, the rest to the poster.
            totalBonds -= bond + slashed;
            _credit(poster, bond + slashed - _payMajority(majority, bond / 2 + slashed));
        } else if (verdict == OuterVerdict.Invalid) {
            // The poster's bond: half to the majority jurors, the rest to the challenger,
            // whose own bond comes back. The post is removed: anyone may post again.
            // Pipelined: the poster's pipeline bond first refills the pool for the rounds built
            // on the post, the rest to the challenger.
            // Speculative, only the rounds after it are rolled back: once no later challenge is
            // live (decided first, as for a settlement), so no verdict lands on a rolled-back round.
            CollabRec storage c = _collabs[jobId];
            _holdFor(jobId, round + 1, c.round + c.ahead);
            uint256 pipe = _pipeBond(c);
            totalBonds -= 2 * bond + pipe + slashed;
            pipe = _rollback(jobId, c, round, ROLLBACK_INVALID, pipe);
            _credit(challenger, 2 * bond + pipe + slashed - _payMajority(majority, bond / 2 + slashed));
            _clearPost(rr);
            emit OuterResolved(jobId, round, verdict, validVotes, invalidVotes, 0);
            return;
        } else {
            // Void: the challenger's bond back; the silent jurors' stake to those who revealed
            // (none revealed: the tally burned it, slashed is 0).
            totalBonds -= bond + slashed;
            _credit(challenger, bond + slashed - _payMajority(majority, slashed));
        }
        // Whatever the verdict, the post stays open to others for a while.
        uint256 minEnd = block.timestamp + _outerWindow / 2;
        if (rr.windowEnd < minEnd) rr.windowEnd = uint64(minEnd);
        emit OuterResolved(jobId, round, verdict, validVotes, invalidVotes, rr.windowEnd);
    }

    /// @dev Split `amount` over `majority` (dust to the first); returns what was paid.
    function _payMajority(address[] memory majority, uint256 amount) internal returns (uint256) {
        uint256 n = majority.length;
        if (n == 0) return 0;
        uint256 each = amount / n;
        _credit(majority[0], amount - each * (n - 1));
        for (uint256 i = 1; i < n; ++i) {
            _credit(majority[i], each);
        }
        return amount;
    }

    function _takeBond(uint256 bond) internal {
        totalBonds += bond;
        if (bond != 0) _token.safeTransferFrom(msg.sender, address(this), bond);
    }

    /// @dev Free a slot: its bond back to the holder but `lost`, which the caller books.
    function _release(uint256 jobId, uint32 slot, address holder, uint8 reason, uint256 lost) internal {
        _slots[jobId][slot] = address(0);
        uint256 bond = _bondOf(_collabs[jobId]);
        totalBonds -= bond;
        _credit(holder, bond - lost);
        emit SlotReleased(jobId, slot, holder, reason);
    }

    /// @dev A slot that gets a sub-job: held, by a worker not excluded.
    function _holds(uint256 jobId, uint32 slot) internal view returns (bool) {
        address h = _slots[jobId][slot];
        return h != address(0) && !_excluded[jobId][h];
    }

    /// @dev P: the most compute one invalid candidate can waste (D rounds of every slot).
    function _pipeBond(CollabRec storage c) internal view returns (uint256) {
        return uint256(c.depth) * c.maxWorkers * c.subReward;
    }

    function _bondOf(CollabRec storage c) internal view returns (uint256) {
        return _slotBond + _pipeBond(c);
    }

    /// @dev Remove a post through no fault of its poster: its bond back.
    function _withdrawPost(uint256 jobId, CollabRec storage c, uint32 round, RoundRec storage rr) internal {
        address poster = rr.poster;
        uint256 bond = _outerBond + _pipeBond(c);
        totalBonds -= bond;
        _credit(poster, bond);
        _clearPost(rr);
        emit OuterWithdrawn(jobId, round, poster);
    }

    function _clearPost(RoundRec storage rr) internal {
        rr.poster = address(0);
        rr.outerHash = 0;
        rr.nextInitHash = 0;
        rr.postedAt = 0;
        rr.windowEnd = 0;
    }

    /// @dev Round `after_`'s candidate is invalid: roll back rounds after_ + 1 .. base + ahead
    ///      (their sub-jobs orphaned, their posts withdrawn: no challenge of them is live, the
    ///      callers hold for it). Of `forfeit` (the culprit's pipeline bond, already out of
    ///      totalBonds), subReward per orphaned sub-job goes to the pool; returns the rest.
    function _rollback(uint256 jobId, CollabRec storage c, uint32 after_, uint8 reason, uint256 forfeit)
        internal
        returns (uint256)
    {
        uint32 first = after_ + 1;
        uint32 n = c.round + c.ahead - after_;
        if (n == 0) return forfeit;
        uint256 orphans;
        for (uint32 q = first; q < first + n; ++q) {
            RoundRec storage rr = _rounds[jobId][q];
            for (uint64 m = rr.postedMask; m != 0; m &= m - 1) ++orphans;
            if (rr.poster != address(0)) _withdrawPost(jobId, c, q, rr);
            rr.postedMask = 0; // its sub-jobs are orphans from now on
        }
        c.ahead -= n;
        c.orphans += uint32(orphans);
        uint256 refund = orphans * c.subReward;
        if (refund > forfeit) refund = forfeit;
        c.pool += refund;
        totalPools += refund;
        emit RoundsRolledBack(jobId, first, first + n - 1, reason, refund);
        return forfeit - refund;
    }

    function _fail(uint256 jobId, CollabRec storage c) internal {
        c.status = CollabStatus.Failed;
        c.phase = RoundPhase.Idle;
        uint256 refund = _drainPool(jobId, c);
        emit CollabFailed(jobId, c.round, refund);
    }

    /// @dev The job is over: the unspent pool to the submitter, every slot bond to its holder.
    function _drainPool(uint256 jobId, CollabRec storage c) internal returns (uint256 refund) {
        refund = c.pool;
        c.pool = 0;
        totalPools -= refund;
        _credit(c.submitter, refund);
        for (uint32 i; i < c.maxWorkers; ++i) {
            address h = _slots[jobId][i];
            if (h != address(0)) _release(jobId, i, h, RELEASE_JOB_OVER, 0);
        }
    }

    function _credit(address account, uint256 amount) internal {
        if (amount == 0) return;
        _credits[account] += amount;
        totalCredits += amount;
        emit Credited(account, amount);
    }
}
