// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";
import {ReentrancyGuardTransient} from "@openzeppelin/contracts/utils/ReentrancyGuardTransient.sol";
import {IJobMarket} from "./interfaces/IJobMarket.sol";
import {INodeRegistry} from "./interfaces/INodeRegistry.sol";
import {IDisputeGame} from "./interfaces/IDisputeGame.sol";
import {DisputeId, JobId} from "./interfaces/Ids.sol";
import {IAvailability} from "./interfaces/IAvailability.sol";
import {TraceLib} from "./libraries/TraceLib.sol";
import {SegmentSampler} from "./libraries/SegmentSampler.sol";

/// @title JobMarket
/// @notice Escrowed training jobs with sampled verification. See {IJobMarket}.
/// @dev The owner wires the dispute game once (`setDisputeGame`).
contract JobMarket is IJobMarket, Ownable, ReentrancyGuardTransient {
    using SafeERC20 for IERC20;

    uint256 internal constant BPS = 10_000;
    /// @dev Bounds on durations and amounts, so every packed uint40 time and uint96 amount fits
    ///      (2^96 wei is 79 billion POL; a bond is at most 100 x a reward <= MAX_AMOUNT / 100).
    uint256 internal constant MAX_DURATION = 365 days;
    uint256 internal constant MAX_AMOUNT = type(uint96).max;
    uint256 internal constant MAX_COMMITTEE = 16;
    uint256 internal constant ALL_SEATS = type(uint256).max;
    /// @dev Issue 30 ("delay is priced"): disputes (and, in Availability, requests) open only
    ///      until committedAt + HORIZON_WINDOWS windows, and ending disputes extend the window
    ///      no further, so no chain of griefers holds a round past it plus one game's clocks.
    uint256 internal constant HORIZON_WINDOWS = 2;
    /// @dev Most segments a job may buy sampled: a dispute's `SegmentSampler.indexOf` runs
    ///      about S * ln(S / (S - n)) draws (~7.7k at n = S = 1024; bench/assurance.py
    ///      measures its gas), so a large full replay cannot price a resolve out of a
    ///      block. (node/incentives.py MAX_JOB_SAMPLES)
    uint256 internal constant MAX_SAMPLES = 1024;
    /// @dev Where attestor slashes go: nobody holds its key.
    address internal constant BURN = 0x000000000000000000000000000000000000dEaD;

    IERC20 internal immutable _token;
    INodeRegistry internal immutable _registry;
    address public override disputeGame;
    address public override availability;

    // Params, as immutables (read on every hot path; `params()` rebuilds the struct)
    uint256 internal immutable _bondFactorBps;
    uint256 internal immutable _verificationWindow;
    uint256 internal immutable _sampleLookahead;
    uint256 internal immutable _sampleCount;
    uint256 internal immutable _reservedSampleCount;
    uint256 internal immutable _missedDeadlineSlashBps;
    uint256 internal immutable _challengeBond;
    uint256 internal immutable _attestorSlashBps;
    /// @dev What each committee seat locks in the registry: the attestor slash (fixed, as the
    ///      registry's minimum verifier stake is).
    uint256 internal immutable _seatCut;
    uint256 internal immutable _attestorsPerJob;
    uint256 internal immutable _disputeGrace;
    uint256 internal immutable _challengerShareBps;
    uint256 internal immutable _jurorShareBps;
    uint256 internal immutable _submitterShareBps;

    uint256 public override jobCount;
    /// @dev totalEscrow + 1 and totalCredits + 1 (reward + budget of jobs not Finalized /
    ///      Cancelled; credited, not yet withdrawn): never zero, so the write after the last
    ///      job settled or the last credit was withdrawn rewrites a dirty word (2.9k gas)
    ///      instead of starting a fresh one (20k). `totalEscrow` / `totalCredits` return
    ///      the real amounts. One word for both: a finalize moves both (one cold read, one
    ///      fresh write less); each stays below the tokens the market holds (< 2^128).
    uint128 internal _escrowPlusOne = 1;
    uint128 internal _creditsTotalPlusOne = 1;
    /// @dev Attestor slashes sent to BURN, ever (with the game's `totalBurned`: the burn
    ///      address's whole balance).
    uint256 public override totalBurned;
    /// @dev Credit + 1 once an account was ever credited: a drained account stays at 1, so
    ///      its next credit rewrites a dirty word (2.9k gas) instead of a zero one (22.1k),
    ///      the trick of OZ's ReentrancyGuard. The 1 is no token: `credits` and
    ///      `totalCredits` count real amounts only.
    mapping(address => uint256) internal _creditsPlusOne;

    /// @dev Packed storage of a Job: 11 words instead of the view's 16, grouped by the call
    ///      that writes them (each word a job writes for the first time costs 22.1k gas).
    ///      `getJob` rebuilds the struct; totalSteps is segmentCount * stepsPerSegment.
    struct JobRec {
        // posted
        JobStatus status;
        address submitter;
        uint32 sampleCount; // n (0 for a reserved job): in the posted word, no extra store
        // In the status word: an attest then reads no other word for it, a claim writes it
        // with the status.
        uint32 round; // number of claims so far
        uint128 reward;
        uint128 verificationBudget;
        bytes32 specHash;
        bytes32 datasetHash;
        bytes32 initStateHash;
        uint64 solveDuration;
        uint32 segmentCount;
        uint32 stepsPerSegment;
        uint32 openDisputes; // live disputes of the current round
        // The current round's `RoundInfo.condemned`, in the word finalize and challenge read
        // anyway (set with it by `_condemn`, cleared by `_reopen`).
        bool condemned;
        uint40 postedAt;
        // claimed
        address solver;
        uint40 deadline;
        uint96 bond;
        // committed
        uint40 committedAt;
        uint40 windowEnd;
        // The seed's block is snapshotBlock + _sampleLookahead (`_sampleBlock`), not stored:
        // this word then has room for poolLen, so a commit writes no other word of the job.
        uint40 snapshotBlock; // commit block: the committee is drawn from stake as of then
        uint32 poolLen; // sortition pool length at commit
        bytes32 traceRoot;
        bytes32 finalStateHash;
        bytes32 seed;
    }

    mapping(uint256 => JobRec) internal _jobs;
    // A dispute's job, segment, round, challenger and verdict are the game's
    // (`IDisputeGame.refOf`), not stored twice: `disputeRef` reads them there.

    // per (job, round)
    /// @dev The committee as a bit stream over words 0, 1, ...: seat i (address | ATTESTED,
    ///      SEAT_BITS wide) at bits [i * SEAT_BITS, (i + 1) * SEAT_BITS), so 3 seats take 2
    ///      words and attesting flips a bit in a word already written.
    mapping(uint256 => mapping(uint32 => mapping(uint256 => uint256))) internal _seats;
    uint256 internal constant ATTESTED = 1 << 160;
    uint256 internal constant SEAT_BITS = 161;
    uint256 internal constant SEAT_MASK = (1 << 161) - 1;
    mapping(uint256 => mapping(uint32 => RoundInfo)) internal _rounds;
    /// @dev keccak256(jobId, round, segment, challenger) => lost a dispute on it
    mapping(bytes32 => bool) internal _barred;
    /// @dev Reserved jobs only (`postReservedJob`): the one solver that may claim it. A
    ///      separate mapping, so an ordinary job's post writes no extra word.
    mapping(uint256 => address) internal _reservedSolver;
    /// @dev (job, round) => the first requester whose availability request went unanswered:
    ///      paid the challenger's share when no dispute of the round was lost.
    mapping(uint256 => mapping(uint32 => address)) internal _availWinner;

    constructor(IERC20 token_, INodeRegistry registry_, Params memory params_) Ownable(msg.sender) {
        if (address(token_) == address(0) || address(registry_) == address(0)) revert ZeroAddress();
        if (
            params_.sampleLookahead == 0 || params_.sampleCount == 0 || params_.reservedSampleCount == 0
                || params_.verificationWindow == 0
                || params_.verificationWindow > MAX_DURATION || params_.disputeGrace == 0
                || params_.disputeGrace > MAX_DURATION || params_.missedDeadlineSlashBps > BPS
                || params_.attestorSlashBps > BPS || params_.attestorsPerJob == 0
                || params_.attestorsPerJob > MAX_COMMITTEE || params_.sampleLookahead > 128
                || params_.bondFactorBps > 100 * BPS || params_.challengeBond > MAX_AMOUNT
                || params_.challengerShareBps + params_.jurorShareBps + params_.submitterShareBps != BPS
        ) revert InvalidParams();
        _token = token_;
        _registry = registry_;
        _bondFactorBps = params_.bondFactorBps;
        _verificationWindow = params_.verificationWindow;
        _sampleLookahead = params_.sampleLookahead;
        _sampleCount = params_.sampleCount;
        _reservedSampleCount = params_.reservedSampleCount;
        _missedDeadlineSlashBps = params_.missedDeadlineSlashBps;
        _challengeBond = params_.challengeBond;
        _attestorSlashBps = params_.attestorSlashBps;
        _seatCut = registry_.minVerifierStake() * params_.attestorSlashBps / BPS;
        _attestorsPerJob = params_.attestorsPerJob;
        _disputeGrace = params_.disputeGrace;
        _challengerShareBps = params_.challengerShareBps;
        _jurorShareBps = params_.jurorShareBps;
        _submitterShareBps = params_.submitterShareBps;
    }

    /// @notice Wire the dispute game. Once, by the owner.
    function setDisputeGame(address game) external onlyOwner {
        // INVARIANT: the settlement authority is fixed once set.
        if (disputeGame != address(0)) revert AlreadySet();
        if (game == address(0)) revert ZeroAddress();
        disputeGame = game;
        emit DisputeGameSet(game);
    }

    /// @notice Wire the availability game. Once, by the owner.
    function setAvailability(address a) external onlyOwner {
        if (availability != address(0)) revert AlreadySet();
        if (a == address(0)) revert ZeroAddress();
        availability = a;
        emit AvailabilitySet(a);
    }

    // --- submitter ---

    function postJob(JobTerms calldata t) external nonReentrant returns (JobId) {
        return JobId.wrap(_post(t, false));
    }

    function postReservedJob(JobTerms calldata t, address solver) external nonReentrant returns (JobId) {
        if (solver == address(0)) revert ZeroAddress();
        uint256 jobId = _post(t, true);
        // INVARIANT: a reserved job stays reserved for its life (reopened rounds included).
        _reservedSolver[jobId] = solver;
        emit JobReserved(jobId, solver);
        return JobId.wrap(jobId);
    }

    function _post(JobTerms calldata t, bool reserved) internal returns (uint256 jobId) {
        if (t.reward == 0) revert ZeroReward();
        if (t.solveDuration == 0) revert ZeroDuration();
        if (t.solveDuration > MAX_DURATION) revert DurationTooLong(t.solveDuration, MAX_DURATION);
        if (t.specHash == bytes32(0) || t.datasetHash == bytes32(0) || t.initStateHash == bytes32(0)) {
            revert ZeroHash();
        }
        // Checked one at a time so the sum and the bond cannot overflow.
        if (t.reward > MAX_AMOUNT / 100) revert AmountTooLarge(t.reward, MAX_AMOUNT / 100);
        if (t.verificationBudget > MAX_AMOUNT) revert AmountTooLarge(t.verificationBudget, MAX_AMOUNT);
        // INVARIANT: the trace's shape is the job's, not the solver's choice.
        uint256 k = t.stepsPerSegment;
        if (t.totalSteps == 0 || k == 0 || t.totalSteps % k != 0 || t.totalSteps / k > type(uint32).max) {
            revert InvalidTerms(t.totalSteps, t.stepsPerSegment);
        }
        uint256 segs = t.totalSteps / k;
        uint256 budget = t.verificationBudget;
        uint256 n;
        if (!reserved) {
            // INVARIANT: a submitter buys at least the floor the incentives derive and pays
            // the committee per segment replayed at the floor's rate.
            uint256 floor = segs < _sampleCount ? segs : _sampleCount;
            n = t.sampleCount == 0 ? floor : t.sampleCount;
            uint256 top = segs < MAX_SAMPLES ? segs : MAX_SAMPLES;
            if (n < floor || n > top) revert SampleCountOutOfRange(n, floor, top);
            // <= MAX_AMOUNT * MAX_SAMPLES < 2^106: fits the uint128 it is stored in.
            budget = budget * n / floor;
        }
        jobId = ++jobCount;
        JobRec storage j = _jobs[jobId];
        j.status = JobStatus.Open;
        j.submitter = msg.sender;
        j.sampleCount = uint32(n);
        j.specHash = t.specHash;
        j.datasetHash = t.datasetHash;
        j.reward = uint128(t.reward);
        j.verificationBudget = uint128(budget);
        j.solveDuration = t.solveDuration;
        j.postedAt = uint40(block.timestamp);
        j.segmentCount = uint32(segs);
        j.stepsPerSegment = t.stepsPerSegment;
        j.initStateHash = t.initStateHash;
        uint256 escrow = t.reward + budget;
        _escrowPlusOne += uint128(escrow); // < 2^107 (checked above)
        _token.safeTransferFrom(msg.sender, address(this), escrow);
        emit JobPosted(jobId, msg.sender, t.specHash, t.datasetHash, t.reward, budget, t.solveDuration);
        emit JobTermsFixed(jobId, t.totalSteps, t.stepsPerSegment, t.initStateHash);
    }

    function cancel(JobId job) external nonReentrant {
        uint256 jobId = JobId.unwrap(job);
        JobRec storage j = _job(jobId);
        _onlySubmitterIfReserved(jobId, j);
        if (msg.sender != j.submitter) revert NotSubmitter(msg.sender);
        // INVARIANT: only an unclaimed job's escrow can go back to the submitter.
        _requireStatus(jobId, j, JobStatus.Open);
        j.status = JobStatus.Cancelled;
        uint256 refund = j.reward + j.verificationBudget;
        _escrowPlusOne -= uint128(refund); // reward + budget, < 2^107
        _credit(j.submitter, refund);
        emit JobCancelled(jobId, refund);
    }

    // --- solver ---

    function claimJob(JobId job) external nonReentrant {
        uint256 jobId = JobId.unwrap(job);
        JobRec storage j = _job(jobId);
        _requireStatus(jobId, j, JobStatus.Open);
        if (_isReserved(j) && _reservedSolver[jobId] != msg.sender) revert NotReservedSolver(jobId, msg.sender);
        uint256 bond = j.reward * _bondFactorBps / BPS;
        // INVARIANT: a claimed job is always backed by the solver's locked bond (its role
        // checked and the bond locked in one registry call).
        if (!_registry.lockIfSolver(msg.sender, bond)) revert NotRegisteredSolver(msg.sender);
        j.status = JobStatus.Claimed;
        j.solver = msg.sender;
        j.bond = uint96(bond);
        j.deadline = uint40(block.timestamp + j.solveDuration);
        j.round += 1;
        emit JobClaimed(jobId, msg.sender, j.round, bond, j.deadline);
    }

    function commitResult(
        JobId job,
        bytes32 traceRoot,
        bytes32 finalStateHash,
        uint256 finalLossE9,
        bytes32[] calldata initProof,
        bytes32[] calldata finalProof
    ) external {
        uint256 jobId = JobId.unwrap(job);
        JobRec storage j = _job(jobId);
        _requireStatus(jobId, j, JobStatus.Claimed);
        if (msg.sender != j.solver) revert NotSolver(msg.sender);
        if (block.timestamp > j.deadline) revert DeadlinePassed(j.deadline);
        if (traceRoot == bytes32(0) || finalStateHash == bytes32(0)) revert InvalidTrace();
        uint32 segs = j.segmentCount;
        uint32 k = j.stepsPerSegment;
        // INVARIANT: the trace starts at the spec's S_0 and ends at the state paid for.
        if (!TraceLib.verifyLeaf(traceRoot, jobId, 0, k, j.initStateHash, 0, initProof)) revert InvalidProof(0);
        if (!TraceLib.verifyLeaf(traceRoot, jobId, segs, k, finalStateHash, finalLossE9, finalProof)) {
            revert InvalidProof(segs);
        }
        j.status = JobStatus.Committed;
        j.traceRoot = traceRoot;
        j.finalStateHash = finalStateHash;
        j.committedAt = uint40(block.timestamp);
        j.windowEnd = uint40(block.timestamp + _verificationWindow);
        _arm(j);
        emit ResultCommitted(jobId, msg.sender, traceRoot, finalStateHash, segs, k, j.windowEnd, uint64(_sampleBlock(j)));
    }

    // --- anyone ---

    function fixSeed(JobId job) external returns (bytes32 seed) {
        uint256 jobId = JobId.unwrap(job);
        JobRec storage j = _job(jobId);
        _requireStatus(jobId, j, JobStatus.Committed);
        if (j.seed != bytes32(0)) revert SeedAlreadyFixed();
        // INVARIANT: the seed comes from a block mined after the commit.
        uint256 sb = _sampleBlock(j);
        if (block.number <= sb) revert SampleBlockNotReached(uint64(sb));
        seed = _tryFixSeed(jobId, j);
        if (seed == bytes32(0)) {
            // Nobody fixed it while blockhash(sampleBlock) was readable: re-arm on a future block.
            uint64 old = uint64(sb);
            _arm(j); // a fresh tree snapshot too: the old one may be gone (`SnapshotLost`)
            emit SeedRearmed(jobId, old, uint64(_sampleBlock(j)));
        }
    }

    function finalize(JobId job) external nonReentrant {
        uint256 jobId = JobId.unwrap(job);
        JobRec storage j = _job(jobId);
        _requireStatus(jobId, j, JobStatus.Committed);
        _onlySubmitterIfReserved(jobId, j);
        if (block.timestamp < j.windowEnd) revert WindowNotOver(j.windowEnd);
        // INVARIANT: the bond is settled once, after every dispute of the round has ended.
        if (j.openDisputes != 0) revert DisputesOpen(j.openDisputes);
        uint32 round = j.round;
        if (j.condemned) return _settleCondemned(jobId, j, round, _rounds[jobId][round]);
        (address[] memory seats, uint256 attested) = _seatsOf(jobId);
        uint256 atts;
        for (uint256 a = attested; a != 0; a &= a - 1) ++atts;
        // INVARIANT: no payment without evidence: a majority of the committee drawn attested,
        // or every sampled segment's leaves are on chain (Availability) and undisputed.
        if (atts * 2 <= seats.length && !IAvailability(availability).evidenced(jobId, round)) {
            revert NoEvidence(uint32(atts), uint32(seats.length));
        }
        j.status = JobStatus.Finalized;
        // The whole escrow (reward + budget) becomes credits, split below: the totals' word
        // moves once, the accounts by `_creditAccount`.
        uint128 moved = j.reward + j.verificationBudget;
        _escrowPlusOne -= moved;
        _creditsTotalPlusOne += moved;
        _creditAccount(j.solver, j.reward);
        if (j.bond != 0) _registry.unlock(j.solver, j.bond);
        _closeSeats(jobId, seats, 0);

        uint256 per = j.verificationBudget / _attestorsPerJob;
        uint32 count;
        for (uint256 i; i < seats.length; ++i) {
            if ((attested >> i) & 1 == 0) continue;
            _creditAccount(seats[i], per);
            ++count;
        }
        uint256 paid = per * count;
        // Seats nobody filled or attested, and the division remainder, go back.
        _creditAccount(j.submitter, j.verificationBudget - paid);
        emit JobFinalized(jobId, j.solver, j.reward, count, per);
    }

    function reclaim(JobId job) external nonReentrant {
        uint256 jobId = JobId.unwrap(job);
        JobRec storage j = _job(jobId);
        _requireStatus(jobId, j, JobStatus.Claimed);
        _onlySubmitterIfReserved(jobId, j);
        if (block.timestamp <= j.deadline) revert DeadlineNotPassed(j.deadline);
        address solver = j.solver;
        uint256 penalty = j.bond * _missedDeadlineSlashBps / BPS;
        uint256 slashed;
        if (penalty != 0) slashed = _registry.slash(solver, penalty, address(this));
        uint256 rest = j.bond - penalty;
        if (rest != 0) _registry.unlock(solver, rest);
        if (slashed != 0) _credit(j.submitter, slashed);
        emit JobReclaimed(jobId, solver, slashed, rest);
        _reopen(jobId, j);
    }

    function withdraw() external nonReentrant returns (uint256 amount) {
        uint256 c = _creditsPlusOne[msg.sender];
        if (c <= 1) revert NothingToWithdraw();
        amount = c - 1;
        _creditsPlusOne[msg.sender] = 1;
        _creditsTotalPlusOne -= uint128(amount); // <= the total
        _token.safeTransfer(msg.sender, amount);
        emit Withdrawn(msg.sender, amount);
    }

    // --- verifier ---

    function attest(JobId job) external {
        uint256 jobId = JobId.unwrap(job);
        JobRec storage j = _job(jobId);
        _requireStatus(jobId, j, JobStatus.Committed);
        if (block.timestamp >= j.windowEnd) revert WindowClosed(j.windowEnd);
        uint32 round = j.round;
        mapping(uint256 => uint256) storage words = _seats[jobId][round];
        // Seats are written only by the draw that fixes the seed: a drawn committee spares the
        // seed's cold read (an empty one falls through to it, and the seed is then set).
        if (words[0] == 0 && j.seed == bytes32(0)) {
            if (block.number <= _sampleBlock(j) || _tryFixSeed(jobId, j) == bytes32(0)) revert SeedNotFixed();
        }
        uint256 i;
        uint256 e;
        for (; i < _attestorsPerJob; ++i) {
            e = _seat(words, i);
            if (e == 0 || address(uint160(e)) == msg.sender) break;
        }
        // INVARIANT: only the seed's stake-weighted committee attests, so sybils cannot crowd it.
        if (e == 0 || i == _attestorsPerJob) revert NotInCommittee(msg.sender);
        if (e & ATTESTED != 0) revert AlreadyAttested(msg.sender);
        uint256 bit = i * SEAT_BITS + 160;
        words[bit >> 8] |= uint256(1) << (bit & 255);
        emit Attested(jobId, msg.sender, round);
    }

    function challenge(
        JobId job,
        uint256 segment,
        bytes32 startStateHash,
        uint256 startLossE9,
        bytes32[] calldata startProof,
        bytes32 endStateHash,
        uint256 endLossE9,
        bytes32[] calldata endProof
    ) external nonReentrant returns (uint256 disputeId) {
        uint256 jobId = JobId.unwrap(job);
        JobRec storage j = _checkChallenge(jobId, segment);
        // INVARIANT: a dispute is only about states the solver committed to.
        _checkLeaf(j, jobId, segment, startStateHash, startLossE9, startProof);
        _checkLeaf(j, jobId, segment + 1, endStateHash, endLossE9, endProof);
        disputeId = _openDispute(jobId, j, segment, startStateHash, endStateHash);
    }

    // --- dispute game only ---

    function resolveDispute(
        JobId job,
        DisputeId dispute,
        uint256 segment,
        uint32 round,
        address challenger,
        Verdict verdict
    ) external nonReentrant {
        uint256 jobId = JobId.unwrap(job);
        uint256 disputeId = DisputeId.unwrap(dispute);
        // INVARIANT: only the dispute game settles disputes (once each: it resolves a
        // dispute once, with the job, segment, round and challenger the market opened it with).
        if (msg.sender != disputeGame) revert Unauthorized(msg.sender);
        JobRec storage j = _jobs[jobId];
        if (j.submitter == address(0)) revert UnknownDispute(disputeId);
        if (j.status != JobStatus.Committed || j.round != round) revert DisputeNotLive(disputeId);
        j.openDisputes -= 1;
        emit DisputeResolved(jobId, disputeId, segment, verdict);
        if (verdict == Verdict.Valid) {
            // INVARIANT: a lost challenge binds only the challenger who lost it.
            _barred[_barKey(jobId, round, segment, challenger)] = true;
            emit ChallengerBarred(jobId, segment, challenger, round);
        } else if (verdict == Verdict.Invalid || verdict == Verdict.SolverTimedOut) {
            RoundInfo storage r = _rounds[jobId][round];
            _condemn(jobId, j, round, r);
            if (r.firstWinner == 0 || disputeId < r.firstWinner) r.firstWinner = uint64(disputeId);
            if (verdict == Verdict.Invalid) {
                r.juryWins += 1;
                uint256 at = j.seed == 0 ? SegmentSampler.ABSENT : _sampleIndexOf(j, segment);
                if (at != SegmentSampler.ABSENT) {
                    r.sampledInvalid = true;
                    // INVARIANT: an attestor answers for its own share of the sample only
                    // (sample position modulo the seats drawn), so a seat checks n / seats.
                    uint256 seats = _committeeOf(jobId, false, ALL_SEATS).length;
                    if (seats != 0) r.liableSeats |= uint16(1 << (at % seats));
                }
            } else {
                r.timeoutWins += 1;
            }
        }
        // Whatever the verdict, others keep time to challenge (up to the horizon: a chain of
        // griefers' disputes cannot hold the round further).
        _extend(jobId, j, true);
    }

    // --- availability game only ---

    function availabilityHook(JobId job, uint32 round, uint8 op, address challenger) external nonReentrant {
        uint256 jobId = JobId.unwrap(job);
        // INVARIANT: only the availability game opens, answers and condemns by withholding.
        if (msg.sender != availability) revert Unauthorized(msg.sender);
        JobRec storage j = _job(jobId);
        _requireStatus(jobId, j, JobStatus.Committed);
        if (j.round != round) revert DisputeNotLive(0);
        RoundInfo storage r = _rounds[jobId][round];
        if (op == 0 || op == 3) {
            // A request, or unasked evidence: never on a condemned round (only delay).
            if (j.condemned) revert AlreadyCondemned(jobId, round);
            // A pending request holds the round like a dispute.
            if (op == 0) {
                j.openDisputes += 1;
                return;
            }
        } else {
            j.openDisputes -= 1;
            if (op == 2) {
                _condemn(jobId, j, round, r);
                if (_availWinner[jobId][round] == address(0)) _availWinner[jobId][round] = challenger;
            }
        }
        // What was published can be disputed, past the horizon too (so a solver cannot wait
        // it out to publish); a withheld round is condemned: no reason to extend past it.
        _extend(jobId, j, op == 2);
    }

    // --- views ---

    function params() external view returns (Params memory) {
        return Params({
            bondFactorBps: _bondFactorBps,
            verificationWindow: _verificationWindow,
            sampleLookahead: _sampleLookahead,
            sampleCount: _sampleCount,
            reservedSampleCount: _reservedSampleCount,
            missedDeadlineSlashBps: _missedDeadlineSlashBps,
            challengeBond: _challengeBond,
            attestorSlashBps: _attestorSlashBps,
            attestorsPerJob: _attestorsPerJob,
            disputeGrace: _disputeGrace,
            challengerShareBps: _challengerShareBps,
            jurorShareBps: _jurorShareBps,
            submitterShareBps: _submitterShareBps
        });
    }

    function getJob(JobId job) external view returns (Job memory v) {
        uint256 jobId = JobId.unwrap(job);
        JobRec storage j = _jobs[jobId];
        v.status = j.status;
        v.submitter = j.submitter;
        v.solver = j.solver;
        v.specHash = j.specHash;
        v.datasetHash = j.datasetHash;
        v.reward = j.reward;
        v.verificationBudget = j.verificationBudget;
        v.bond = j.bond;
        v.solveDuration = j.solveDuration;
        v.postedAt = j.postedAt;
        v.deadline = j.deadline;
        v.committedAt = j.committedAt;
        v.windowEnd = j.windowEnd;
        v.traceRoot = j.traceRoot;
        v.finalStateHash = j.finalStateHash;
        v.segmentCount = j.segmentCount;
        v.stepsPerSegment = j.stepsPerSegment;
        v.sampleBlock = uint64(_sampleBlock(j));
        v.seed = j.seed;
        v.openDisputes = j.openDisputes;
        v.round = j.round;
        v.attestations = uint32(_committeeOf(jobId, true, ALL_SEATS).length); // counted, never stored
        v.totalSteps = uint64(j.segmentCount) * j.stepsPerSegment;
        v.initStateHash = j.initStateHash;
        v.snapshotBlock = j.snapshotBlock;
        v.poolLen = j.poolLen;
        v.sampleCount = j.sampleCount;
    }

    function totalEscrow() public view returns (uint256) {
        return _escrowPlusOne - 1;
    }

    function totalCredits() public view returns (uint256) {
        return _creditsTotalPlusOne - 1;
    }

    function credits(address account) external view returns (uint256) {
        uint256 c = _creditsPlusOne[account];
        return c == 0 ? 0 : c - 1;
    }

    function seedOf(JobId job) external view returns (bytes32) {
        uint256 jobId = JobId.unwrap(job);
        return _jobs[jobId].seed;
    }

    function sampledSegments(JobId job) external view returns (uint256[] memory) {
        uint256 jobId = JobId.unwrap(job);
        JobRec storage j = _jobs[jobId];
        bytes32 seed = j.seed;
        if (seed == bytes32(0) && j.status == JobStatus.Committed && block.number > _sampleBlock(j)) {
            seed = blockhash(_sampleBlock(j));
        }
        if (seed == bytes32(0)) revert SeedNotFixed();
        if (_isReserved(j)) {
            return SegmentSampler.sampleWithFinal(seed, j.segmentCount, _reservedSampleCount);
        }
        return SegmentSampler.sample(seed, j.segmentCount, j.sampleCount);
    }

    /// @dev `segment`'s position in the job's sample (`sampledSegments`), or ABSENT.
    function _sampleIndexOf(JobRec storage j, uint256 segment) internal view returns (uint256) {
        if (_isReserved(j)) {
            return SegmentSampler.indexOfWithFinal(j.seed, j.segmentCount, _reservedSampleCount, segment);
        }
        return SegmentSampler.indexOf(j.seed, j.segmentCount, j.sampleCount, segment);
    }

    function committeeOf(JobId job) external view returns (address[] memory) {
        uint256 jobId = JobId.unwrap(job);
        return _committeeOf(jobId, false, ALL_SEATS);
    }

    function attestorsOf(JobId job) public view returns (address[] memory) {
        uint256 jobId = JobId.unwrap(job);
        return _committeeOf(jobId, true, ALL_SEATS);
    }

    function hasAttested(JobId job, address verifier) external view returns (bool) {
        uint256 jobId = JobId.unwrap(job);
        mapping(uint256 => uint256) storage words = _seats[jobId][_jobs[jobId].round];
        for (uint256 i; i < _attestorsPerJob; ++i) {
            uint256 e = _seat(words, i);
            if (e == 0) break;
            if (address(uint160(e)) == verifier) return e & ATTESTED != 0;
        }
        return false;
    }

    function isBarred(JobId job, uint256 segment, address challenger) external view returns (bool) {
        uint256 jobId = JobId.unwrap(job);
        return _barred[_barKey(jobId, _jobs[jobId].round, segment, challenger)];
    }

    function disputeRef(DisputeId dispute) public view returns (DisputeRef memory ref) {
        uint256 disputeId = DisputeId.unwrap(dispute);
        if (disputeGame == address(0)) return ref;
        (ref.jobId, ref.segment, ref.challenger, ref.round, ref.settled, ref.verdict) =
            IDisputeGame(disputeGame).refOf(DisputeId.wrap(disputeId));
    }

    function roundInfo(JobId job, uint32 round) external view returns (RoundInfo memory) {
        uint256 jobId = JobId.unwrap(job);
        return _rounds[jobId][round];
    }

    function settlementOf(JobId job) external view returns (address submitter, uint256 bond) {
        uint256 jobId = JobId.unwrap(job);
        JobRec storage j = _jobs[jobId];
        return (j.submitter, j.bond);
    }

    function isDisputeLive(DisputeId dispute) external view returns (bool) {
        uint256 disputeId = DisputeId.unwrap(dispute);
        DisputeRef memory d = disputeRef(DisputeId.wrap(disputeId));
        if (d.jobId == 0 || d.settled) return false;
        JobRec storage j = _jobs[d.jobId];
        return j.status == JobStatus.Committed && j.round == d.round;
    }

    function reservedSolverOf(JobId job) external view returns (address) {
        uint256 jobId = JobId.unwrap(job);
        return _reservedSolver[jobId];
    }

    function token() external view returns (address) {
        return address(_token);
    }

    function registry() external view returns (address) {
        return address(_registry);
    }

    function totalOwed() external view returns (uint256) {
        return totalEscrow() + totalCredits();
    }

    // --- internals ---

    function _job(uint256 jobId) internal view returns (JobRec storage j) {
        j = _jobs[jobId];
        if (j.submitter == address(0)) revert UnknownJob(jobId);
    }

    /// @dev A reserved job settles only through its submitter (who attributes the credits).
    function _onlySubmitterIfReserved(uint256 jobId, JobRec storage j) internal view {
        if (_isReserved(j) && msg.sender != j.submitter) revert OnlySubmitter(jobId, msg.sender);
    }

    /// @dev Posted reserved: only such a job has no sample count (`_post`; the constructor
    ///      bars a zero `sampleCount`), so the job's first word tells, not a cold mapping read.
    function _isReserved(JobRec storage j) internal view returns (bool) {
        return j.sampleCount == 0;
    }

    function _requireStatus(uint256 jobId, JobRec storage j, JobStatus s) internal view {
        if (j.status != s) revert InvalidStatus(jobId, j.status);
    }

    function _credit(address account, uint256 amount) internal {
        if (amount == 0) return;
        uint256 total = _creditsTotalPlusOne + amount;
        if (total > type(uint128).max) revert AmountTooLarge(amount, type(uint128).max);
        _creditsTotalPlusOne = uint128(total);
        _creditAccount(account, amount);
    }

    /// @dev `account`'s part of a credit whose total the caller has counted.
    function _creditAccount(address account, uint256 amount) internal {
        if (amount == 0) return;
        uint256 c = _creditsPlusOne[account];
        _creditsPlusOne[account] = (c == 0 ? 1 : c) + amount;
        emit Credited(account, amount);
    }

    /// @dev Seed block ahead, committee stake as of now (the registry's tree snapshot).
    function _arm(JobRec storage j) internal {
        j.snapshotBlock = uint40(block.number);
        j.poolLen = uint32(_registry.snapshot());
    }

    /// @dev The block whose hash seeds the sample: `_sampleLookahead` after the snapshot
    ///      (`_arm` sets both); 0 while not armed.
    function _sampleBlock(JobRec storage j) internal view returns (uint256) {
        uint256 s = j.snapshotBlock;
        return s == 0 ? 0 : s + _sampleLookahead;
    }

    function _tryFixSeed(uint256 jobId, JobRec storage j) internal returns (bytes32 seed) {
        uint256 sb = _sampleBlock(j);
        seed = blockhash(sb);
        if (seed == bytes32(0)) return seed;
        j.seed = seed;
        emit SeedFixed(jobId, uint64(sb), seed);
        // The committee: stake as of the commit block, drawn with a seed nobody knew then.
        address[] memory exclude = new address[](1);
        exclude[0] = j.solver;
        // INVARIANT: each seat's attestor slash is locked until the round settles, so no
        // claim or unbond after the draw can take it out of reach.
        address[] memory seats = _registry.drawSeats(
            keccak256(abi.encode(seed, "attest")), _attestorsPerJob, j.poolLen, j.snapshotBlock, exclude, _seatCut, 1
        );
        uint32 round = j.round;
        mapping(uint256 => uint256) storage words = _seats[jobId][round];
        uint256[] memory buf = new uint256[]((seats.length * SEAT_BITS + 255) >> 8);
        for (uint256 i; i < seats.length; ++i) {
            uint256 bit = i * SEAT_BITS;
            uint256 o = bit & 255;
            uint256 e = uint160(seats[i]);
            buf[bit >> 8] |= e << o;
            if (o + SEAT_BITS > 256) buf[(bit >> 8) + 1] |= e >> (256 - o);
        }
        for (uint256 w; w < buf.length; ++w) {
            words[w] = buf[w];
        }
        emit CommitteeDrawn(jobId, round, seats);
    }

    /// @dev A condemned round, all disputes over: split the bond once, reopen the job.
    function _settleCondemned(uint256 jobId, JobRec storage j, uint32 round, RoundInfo storage r) internal {
        uint256 slashed = j.bond == 0 ? 0 : _registry.slash(j.solver, j.bond, address(this));
        uint256 toSubmitter = slashed * _submitterShareBps / BPS;
        uint256 juryPot = slashed * _jurorShareBps / BPS;
        uint256 chPot = slashed - toSubmitter - juryPot;
        {
            // INVARIANT: an attestor's slash reaches no party of the round. Paid to the
            // winner, a solver could serve an attestor honest states, have its puppet
            // challenge that segment, withhold the state in the dispute (the jury then
            // finds it Invalid) and collect the slash: more than it lost on a small job.
            (address[] memory seats, uint256 attested) = _seatsOf(jobId);
            uint256 burned = _closeSeats(jobId, seats, r.liableSeats & attested);
            if (burned != 0) {
                totalBurned += burned;
                _token.safeTransfer(BURN, burned);
                emit AttestorSlashesBurned(jobId, round, burned);
            }
        }
        // One winner: the earliest-opened dispute the solver lost. Its jurors' share goes to
        // the challenger when the solver's clock decided it (no jurors).
        uint256 winner = r.firstWinner;
        // Empty unless a jury decided it (Invalid), which always has a majority; none when
        // only an unanswered availability request condemned the round (winner 0).
        address[] memory jurors;
        if (winner != 0) jurors = IDisputeGame(disputeGame).majorityOf(DisputeId.wrap(winner));
        uint256 perJury = jurors.length == 0 ? 0 : juryPot;
        uint256 perCh = chPot + juryPot - perJury;
        _credit(j.submitter, toSubmitter);
        // One winner, so it is paid here: O(1) however many disputes the round had.
        address challenger =
            winner != 0 ? IDisputeGame(disputeGame).challengerOf(DisputeId.wrap(winner)) : _availWinner[jobId][round];
        _credit(challenger, perCh);
        // The jurors' share split equally over the winner's majority jurors, division dust to
        // the first of them; credited here (the tokens stay in the market until withdrawn).
        if (perJury != 0) {
            uint256 n = jurors.length;
            uint256 per = perJury / n;
            _credit(jurors[0], perJury - per * (n - 1));
            for (uint256 i = 1; i < n; ++i) {
                _credit(jurors[i], per);
            }
        }
        emit RewardPaid(jobId, winner, challenger, perCh, perJury);
        // What was paid is in RoundSettled / RewardPaid, not stored (one fresh word less).
        r.settled = true;
        emit RoundSettled(jobId, round, slashed, toSubmitter, uint128(perCh), uint128(perJury));
        _reopen(jobId, j);
    }

    /// @dev The current round's seats in seat order, and which attested (bit i: seat i).
    function _seatsOf(uint256 jobId) internal view returns (address[] memory seats, uint256 attested) {
        mapping(uint256 => uint256) storage words = _seats[jobId][_jobs[jobId].round];
        seats = new address[](_attestorsPerJob);
        uint256 m;
        for (; m < _attestorsPerJob; ++m) {
            uint256 e = _seat(words, m);
            if (e == 0) break;
            seats[m] = address(uint160(e));
            if (e & ATTESTED != 0) attested |= uint256(1) << m;
        }
        assembly ("memory-safe") {
            mstore(seats, m)
        }
    }

    /// @dev Before _reopen: the current round's `seats` end. Those in `mask` (liable seats
    ///      that attested) lose their seat-locked slash (an honest seat whose own share
    ///      passed, or one that never attested, lost nothing to check); every other seat is
    ///      released. Returns the total taken (held by the market).
    function _closeSeats(uint256 jobId, address[] memory seats, uint256 mask) internal returns (uint256 total) {
        if (_seatCut == 0 || seats.length == 0) return 0;
        uint256[] memory taken = _registry.closeSeats(seats, _seatCut, mask, address(this));
        for (uint256 i; mask != 0 && i < seats.length; ++i) {
            if ((mask >> i) & 1 == 0) continue;
            total += taken[i];
            emit AttestorSlashed(jobId, seats[i], taken[i]);
        }
    }

    /// @dev Seat i of the bit stream (it may straddle two words); 0 past the last seat.
    ///      Callers stop at `_attestorsPerJob` (a draw seats no more): probing the seat after
    ///      a full committee would be a cold read of a word never written.
    function _seat(mapping(uint256 => uint256) storage words, uint256 i) internal view returns (uint256 e) {
        unchecked {
            uint256 bit = i * SEAT_BITS;
            uint256 w = bit >> 8;
            uint256 o = bit & 255;
            e = words[w] >> o;
            if (o + SEAT_BITS > 256) e |= words[w + 1] << (256 - o);
            e &= SEAT_MASK;
        }
    }

    /// @dev The current round's seats in seat order: those whose bit is set in `seatMask`
    ///      (ALL_SEATS: every one) and, with `attestedOnly`, that attested.
    function _committeeOf(uint256 jobId, bool attestedOnly, uint256 seatMask)
        internal
        view
        returns (address[] memory out)
    {
        mapping(uint256 => uint256) storage words = _seats[jobId][_jobs[jobId].round];
        out = new address[](_attestorsPerJob);
        uint256 m;
        for (uint256 i; i < _attestorsPerJob; ++i) {
            uint256 e = _seat(words, i);
            if (e == 0) break;
            if ((!attestedOnly || e & ATTESTED != 0) && (seatMask >> i) & 1 != 0) {
                out[m++] = address(uint160(e));
            }
        }
        assembly ("memory-safe") {
            mstore(out, m)
        }
    }

    function _barKey(uint256 jobId, uint32 round, uint256 segment, address challenger)
        internal
        pure
        returns (bytes32)
    {
        return keccak256(abi.encode(jobId, round, segment, challenger));
    }

    function _checkChallenge(uint256 jobId, uint256 segment) internal view returns (JobRec storage j) {
        j = _job(jobId);
        _requireStatus(jobId, j, JobStatus.Committed);
        // INVARIANT: a live dispute keeps the round open to others until the horizon; past
        // it only the window (extended by the solver's own publications) admits disputes.
        if (block.timestamp >= j.windowEnd && (j.openDisputes == 0 || block.timestamp >= _horizon(j))) {
            revert WindowClosed(j.windowEnd);
        }
        if (msg.sender == j.solver) revert SolverCannotChallenge();
        if (!_registry.isVerifier(msg.sender)) revert NotVerifier(msg.sender);
        if (segment >= j.segmentCount) revert SegmentOutOfRange(segment, j.segmentCount);
        if (_barred[_barKey(jobId, j.round, segment, msg.sender)]) revert ChallengerBarredFrom(segment, msg.sender);
        // INVARIANT: a condemned round takes no new disputes: opened after the condemning
        // one, none could be paid, and chaining them (free: the solver has no reason to
        // answer) would hold the settlement off forever.
        if (j.condemned) revert AlreadyCondemned(jobId, j.round);
    }

    function _checkLeaf(
        JobRec storage j,
        uint256 jobId,
        uint256 index,
        bytes32 stateHash,
        uint256 lossE9,
        bytes32[] calldata proof
    ) internal view {
        if (!TraceLib.verifyLeaf(j.traceRoot, jobId, index, j.stepsPerSegment, stateHash, lossE9, proof)) {
            revert InvalidProof(index);
        }
    }

    function _openDispute(uint256 jobId, JobRec storage j, uint256 segment, bytes32 startHash, bytes32 endHash)
        internal
        returns (uint256 disputeId)
    {
        uint256 k = j.stepsPerSegment;
        uint256 bond = _challengeBond;
        if (bond != 0) _registry.lock(msg.sender, bond);
        j.openDisputes += 1;
        uint32 round = j.round;
        // INVARIANT: dispute ids are unique (the game never reuses one: `_nextId++`).
        disputeId = DisputeId.unwrap(IDisputeGame(disputeGame).open(
            JobId.wrap(jobId), segment, round, j.solver, msg.sender, segment * k, (segment + 1) * k, startHash, endHash
        ));
        emit Challenged(jobId, disputeId, segment, msg.sender, round);
    }

    function _horizon(JobRec storage j) internal view returns (uint256) {
        return j.committedAt + HORIZON_WINDOWS * _verificationWindow;
    }

    /// @dev Leave others at least disputeGrace of window; `capped` (an ending dispute or a
    ///      lost request, not a publication to be checked): never past the horizon.
    function _extend(uint256 jobId, JobRec storage j, bool capped) internal {
        uint256 minEnd = block.timestamp + _disputeGrace;
        if (capped && minEnd > _horizon(j)) minEnd = _horizon(j);
        if (j.windowEnd < minEnd) {
            j.windowEnd = uint40(minEnd);
            emit WindowExtended(jobId, uint64(minEnd));
        }
    }

    function _condemn(uint256 jobId, JobRec storage j, uint32 round, RoundInfo storage r) internal {
        if (r.condemned) return;
        r.condemned = true;
        j.condemned = true;
        emit RoundCondemned(jobId, round);
    }

    function _reopen(uint256 jobId, JobRec storage j) internal {
        address former = j.solver;
        uint32 round = j.round;
        j.status = JobStatus.Open;
        j.solver = address(0);
        j.bond = 0;
        j.deadline = 0;
        j.committedAt = 0;
        j.windowEnd = 0;
        j.traceRoot = bytes32(0);
        j.finalStateHash = bytes32(0);
        j.seed = bytes32(0);
        j.snapshotBlock = 0;
        j.poolLen = 0;
        j.condemned = false;
        // INVARIANT: a job reopens only with no live dispute (finalize / reclaim check it).
        emit JobReopened(jobId, former, round);
    }
}
