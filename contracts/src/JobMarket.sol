// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";
import {ReentrancyGuardTransient} from "@openzeppelin/contracts/utils/ReentrancyGuardTransient.sol";
import {IJobMarket} from "./interfaces/IJobMarket.sol";
import {INodeRegistry} from "./interfaces/INodeRegistry.sol";
import {IDisputeGame} from "./interfaces/IDisputeGame.sol";
import {TraceLib} from "./libraries/TraceLib.sol";
import {SegmentSampler} from "./libraries/SegmentSampler.sol";

/// @title JobMarket
/// @notice Escrowed training jobs with sampled verification. See {IJobMarket}.
/// @dev The owner wires the dispute game once (`setDisputeGame`).
contract JobMarket is IJobMarket, Ownable, ReentrancyGuardTransient {
    using SafeERC20 for IERC20;

    uint256 internal constant BPS = 10_000;

    IERC20 internal immutable _token;
    INodeRegistry internal immutable _registry;
    address public override disputeGame;

    // Params, as immutables (read on every hot path; `params()` rebuilds the struct)
    uint256 internal immutable _bondFactorBps;
    uint256 internal immutable _verificationWindow;
    uint256 internal immutable _sampleLookahead;
    uint256 internal immutable _sampleCount;
    uint256 internal immutable _missedDeadlineSlashBps;
    uint256 internal immutable _challengeBond;
    uint256 internal immutable _attestorSlashBps;
    uint256 internal immutable _maxAttestorsPerSegment;

    uint256 public override jobCount;
    uint256 public override totalEscrow; // reward + budget of jobs not Finalized / Cancelled
    uint256 public override totalCredits; // credited, not yet withdrawn
    mapping(address => uint256) public override credits;

    mapping(uint256 => Job) internal _jobs;
    /// @dev Packed storage of a DisputeRef (1 word); the challenger is the game's
    ///      (`IDisputeGame.challengerOf`), not stored twice. `disputeRef` rebuilds the struct.
    struct DisputeRec {
        uint64 jobId; // the game rejects ids beyond uint64
        uint32 segment; // < segmentCount (uint32)
        uint32 round;
        bool settled;
    }

    mapping(uint256 => DisputeRec) internal _disputes;

    // per (job, round)
    mapping(uint256 => mapping(uint32 => address[])) internal _roundAttestors; // one entry per attestation
    mapping(uint256 => mapping(uint32 => mapping(uint256 => address[]))) internal _segmentAttestors;
    mapping(uint256 => mapping(uint32 => mapping(uint256 => mapping(address => bool)))) internal _attested;
    mapping(uint256 => mapping(uint32 => mapping(uint256 => bool))) internal _upheld;

    constructor(IERC20 token_, INodeRegistry registry_, Params memory params_) Ownable(msg.sender) {
        if (address(token_) == address(0) || address(registry_) == address(0)) revert ZeroAddress();
        if (
            params_.sampleLookahead == 0 || params_.sampleCount == 0 || params_.verificationWindow == 0
                || params_.missedDeadlineSlashBps > BPS || params_.attestorSlashBps > BPS
                || params_.maxAttestorsPerSegment == 0 || params_.sampleLookahead > 128
        ) revert InvalidParams();
        _token = token_;
        _registry = registry_;
        _bondFactorBps = params_.bondFactorBps;
        _verificationWindow = params_.verificationWindow;
        _sampleLookahead = params_.sampleLookahead;
        _sampleCount = params_.sampleCount;
        _missedDeadlineSlashBps = params_.missedDeadlineSlashBps;
        _challengeBond = params_.challengeBond;
        _attestorSlashBps = params_.attestorSlashBps;
        _maxAttestorsPerSegment = params_.maxAttestorsPerSegment;
    }

    /// @notice Wire the dispute game. Once, by the owner.
    function setDisputeGame(address game) external onlyOwner {
        // INVARIANT: the settlement authority is fixed once set.
        if (disputeGame != address(0)) revert AlreadySet();
        if (game == address(0)) revert ZeroAddress();
        disputeGame = game;
        emit DisputeGameSet(game);
    }

    // --- submitter ---

    function postJob(
        bytes32 specHash,
        bytes32 datasetHash,
        uint256 reward,
        uint256 verificationBudget,
        uint64 solveDuration
    ) external nonReentrant returns (uint256 jobId) {
        if (reward == 0) revert ZeroReward();
        if (solveDuration == 0) revert ZeroDuration();
        if (specHash == bytes32(0) || datasetHash == bytes32(0)) revert ZeroHash();
        jobId = ++jobCount;
        Job storage j = _jobs[jobId];
        j.status = JobStatus.Open;
        j.submitter = msg.sender;
        j.specHash = specHash;
        j.datasetHash = datasetHash;
        j.reward = reward;
        j.verificationBudget = verificationBudget;
        j.solveDuration = solveDuration;
        j.postedAt = uint64(block.timestamp);
        uint256 escrow = reward + verificationBudget;
        totalEscrow += escrow;
        _token.safeTransferFrom(msg.sender, address(this), escrow);
        emit JobPosted(jobId, msg.sender, specHash, datasetHash, reward, verificationBudget, solveDuration);
    }

    function cancel(uint256 jobId) external nonReentrant {
        Job storage j = _job(jobId);
        if (msg.sender != j.submitter) revert NotSubmitter(msg.sender);
        // INVARIANT: only an unclaimed job's escrow can go back to the submitter.
        _requireStatus(jobId, j, JobStatus.Open);
        j.status = JobStatus.Cancelled;
        uint256 refund = j.reward + j.verificationBudget;
        totalEscrow -= refund;
        _credit(j.submitter, refund);
        emit JobCancelled(jobId, refund);
    }

    // --- solver ---

    function claimJob(uint256 jobId) external nonReentrant {
        Job storage j = _job(jobId);
        _requireStatus(jobId, j, JobStatus.Open);
        if (!_registry.isSolver(msg.sender)) revert NotRegisteredSolver(msg.sender);
        uint256 bond = j.reward * _bondFactorBps / BPS;
        j.status = JobStatus.Claimed;
        j.solver = msg.sender;
        j.bond = bond;
        j.deadline = uint64(block.timestamp) + j.solveDuration;
        j.round += 1;
        // INVARIANT: a claimed job is always backed by the solver's locked bond.
        if (bond != 0) _registry.lock(msg.sender, bond);
        emit JobClaimed(jobId, msg.sender, j.round, bond, j.deadline);
    }

    function commitResult(
        uint256 jobId,
        bytes32 traceRoot,
        bytes32 finalStateHash,
        uint32 segmentCount,
        uint32 stepsPerSegment
    ) external {
        Job storage j = _job(jobId);
        _requireStatus(jobId, j, JobStatus.Claimed);
        if (msg.sender != j.solver) revert NotSolver(msg.sender);
        if (block.timestamp > j.deadline) revert DeadlinePassed(j.deadline);
        if (traceRoot == bytes32(0) || finalStateHash == bytes32(0) || segmentCount == 0 || stepsPerSegment == 0) {
            revert InvalidTrace();
        }
        j.status = JobStatus.Committed;
        j.traceRoot = traceRoot;
        j.finalStateHash = finalStateHash;
        j.segmentCount = segmentCount;
        j.stepsPerSegment = stepsPerSegment;
        j.committedAt = uint64(block.timestamp);
        j.windowEnd = uint64(block.timestamp + _verificationWindow);
        j.sampleBlock = uint64(block.number + _sampleLookahead);
        emit ResultCommitted(
            jobId, msg.sender, traceRoot, finalStateHash, segmentCount, stepsPerSegment, j.windowEnd, j.sampleBlock
        );
    }

    // --- anyone ---

    function fixSeed(uint256 jobId) external returns (bytes32 seed) {
        Job storage j = _job(jobId);
        _requireStatus(jobId, j, JobStatus.Committed);
        if (j.seed != bytes32(0)) revert SeedAlreadyFixed();
        // INVARIANT: the seed comes from a block mined after the commit.
        if (block.number <= j.sampleBlock) revert SampleBlockNotReached(j.sampleBlock);
        seed = _tryFixSeed(jobId, j);
        if (seed == bytes32(0)) {
            // Nobody fixed it while blockhash(sampleBlock) was readable: re-arm on a future block.
            uint64 old = j.sampleBlock;
            j.sampleBlock = uint64(block.number + _sampleLookahead);
            emit SeedRearmed(jobId, old, j.sampleBlock);
        }
    }

    function finalize(uint256 jobId) external nonReentrant {
        Job storage j = _job(jobId);
        _requireStatus(jobId, j, JobStatus.Committed);
        if (block.timestamp < j.windowEnd) revert WindowNotOver(j.windowEnd);
        // INVARIANT: no payout while a dispute of this round can still reopen the job.
        if (j.openDisputes != 0) revert DisputesOpen(j.openDisputes);
        j.status = JobStatus.Finalized;
        totalEscrow -= j.reward + j.verificationBudget;
        _credit(j.solver, j.reward);
        if (j.bond != 0) _registry.unlock(j.solver, j.bond);

        address[] storage atts = _roundAttestors[jobId][j.round];
        uint256 count = atts.length;
        uint256 per = count == 0 ? 0 : j.verificationBudget / count;
        for (uint256 i; i < count; ++i) {
            _credit(atts[i], per);
        }
        uint256 rest = j.verificationBudget - per * count;
        if (rest != 0) _credit(j.submitter, rest);
        emit JobFinalized(jobId, j.solver, j.reward, uint32(count), per);
    }

    function reclaim(uint256 jobId) external nonReentrant {
        Job storage j = _job(jobId);
        _requireStatus(jobId, j, JobStatus.Claimed);
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
        amount = credits[msg.sender];
        if (amount == 0) revert NothingToWithdraw();
        credits[msg.sender] = 0;
        totalCredits -= amount;
        _token.safeTransfer(msg.sender, amount);
        emit Withdrawn(msg.sender, amount);
    }

    // --- verifier ---

    function attest(uint256 jobId, uint256 segment) external {
        Job storage j = _job(jobId);
        _requireStatus(jobId, j, JobStatus.Committed);
        if (block.timestamp >= j.windowEnd) revert WindowClosed(j.windowEnd);
        if (!_registry.isVerifier(msg.sender)) revert NotVerifier(msg.sender);
        if (msg.sender == j.solver) revert SolverCannotAttest();
        if (segment >= j.segmentCount) revert SegmentOutOfRange(segment, j.segmentCount);
        bytes32 seed = j.seed;
        if (seed == bytes32(0)) {
            if (block.number <= j.sampleBlock) revert SeedNotFixed();
            seed = _tryFixSeed(jobId, j);
            if (seed == bytes32(0)) revert SeedNotFixed();
        }
        // INVARIANT: only sampled segments earn a share of the verification budget.
        if (!SegmentSampler.contains(seed, j.segmentCount, _sampleCount, segment)) {
            revert SegmentNotSampled(segment);
        }
        uint32 round = j.round;
        if (_attested[jobId][round][segment][msg.sender]) revert AlreadyAttested(segment);
        address[] storage segAtts = _segmentAttestors[jobId][round][segment];
        if (segAtts.length >= _maxAttestorsPerSegment) revert TooManyAttestors(segment);
        _attested[jobId][round][segment][msg.sender] = true;
        segAtts.push(msg.sender);
        _roundAttestors[jobId][round].push(msg.sender);
        j.attestations += 1;
        emit Attested(jobId, segment, msg.sender, round);
    }

    function challenge(
        uint256 jobId,
        uint256 segment,
        bytes32 startStateHash,
        uint256 startLossE9,
        bytes32[] calldata startProof,
        bytes32 endStateHash,
        uint256 endLossE9,
        bytes32[] calldata endProof
    ) external nonReentrant returns (uint256 disputeId) {
        Job storage j = _checkChallenge(jobId, segment);
        // INVARIANT: a dispute is only about states the solver committed to.
        _checkLeaf(j, jobId, segment, startStateHash, startLossE9, startProof);
        _checkLeaf(j, jobId, segment + 1, endStateHash, endLossE9, endProof);
        disputeId = _openDispute(jobId, j, segment, startStateHash, endStateHash);
    }

    // --- dispute game only ---

    function resolveDispute(uint256 jobId, uint256 disputeId, bool solverWon) external nonReentrant {
        // INVARIANT: only the dispute game settles disputes.
        if (msg.sender != disputeGame) revert Unauthorized(msg.sender);
        DisputeRec storage d = _disputes[disputeId];
        if (d.jobId != jobId || jobId == 0) revert UnknownDispute(disputeId);
        if (!_isLive(d)) revert DisputeNotLive(disputeId);
        Job storage j = _jobs[jobId];
        d.settled = true;
        j.openDisputes -= 1;
        emit DisputeResolved(jobId, disputeId, d.segment, solverWon);
        if (solverWon) {
            _upheld[jobId][d.round][d.segment] = true;
            emit SegmentUpheld(jobId, d.segment, d.round);
            return;
        }
        // Invalid step: attestors of the segment pay part of their stake to the challenger.
        uint256 cut = _registry.minVerifierStake() * _attestorSlashBps / BPS;
        if (cut != 0) {
            address[] memory atts = _segmentAttestors[jobId][d.round][d.segment];
            if (atts.length != 0) {
                address challenger = IDisputeGame(disputeGame).challengerOf(disputeId);
                uint256[] memory slashed = _registry.slashUnlockedBatch(atts, cut, address(this));
                uint256 total;
                for (uint256 i; i < atts.length; ++i) {
                    total += slashed[i];
                    emit AttestorSlashed(jobId, atts[i], slashed[i], challenger);
                }
                _credit(challenger, total);
            }
        }
        // The dispute game slashes the solver's bond (still locked in the registry) itself.
        _reopen(jobId, j);
    }

    // --- views ---

    function params() external view returns (Params memory) {
        return Params({
            bondFactorBps: _bondFactorBps,
            verificationWindow: _verificationWindow,
            sampleLookahead: _sampleLookahead,
            sampleCount: _sampleCount,
            missedDeadlineSlashBps: _missedDeadlineSlashBps,
            challengeBond: _challengeBond,
            attestorSlashBps: _attestorSlashBps,
            maxAttestorsPerSegment: _maxAttestorsPerSegment
        });
    }

    function getJob(uint256 jobId) external view returns (Job memory) {
        return _jobs[jobId];
    }

    function seedOf(uint256 jobId) external view returns (bytes32) {
        return _jobs[jobId].seed;
    }

    function sampledSegments(uint256 jobId) external view returns (uint256[] memory) {
        Job storage j = _jobs[jobId];
        bytes32 seed = j.seed;
        if (seed == bytes32(0) && j.status == JobStatus.Committed && block.number > j.sampleBlock) {
            seed = blockhash(j.sampleBlock);
        }
        if (seed == bytes32(0)) revert SeedNotFixed();
        return SegmentSampler.sample(seed, j.segmentCount, _sampleCount);
    }

    function attestorsOf(uint256 jobId, uint256 segment) external view returns (address[] memory) {
        return _segmentAttestors[jobId][_jobs[jobId].round][segment];
    }

    function hasAttested(uint256 jobId, uint256 segment, address verifier) external view returns (bool) {
        return _attested[jobId][_jobs[jobId].round][segment][verifier];
    }

    function isUpheld(uint256 jobId, uint256 segment) external view returns (bool) {
        return _upheld[jobId][_jobs[jobId].round][segment];
    }

    function disputeRef(uint256 disputeId) external view returns (DisputeRef memory) {
        DisputeRec storage d = _disputes[disputeId];
        address challenger = d.jobId == 0 ? address(0) : IDisputeGame(disputeGame).challengerOf(disputeId);
        return DisputeRef(d.jobId, d.segment, challenger, d.round, d.settled);
    }

    function settlementOf(uint256 jobId) external view returns (address submitter, uint256 bond) {
        Job storage j = _jobs[jobId];
        return (j.submitter, j.bond);
    }

    function isDisputeLive(uint256 disputeId) external view returns (bool) {
        return _isLive(_disputes[disputeId]);
    }

    function token() external view returns (address) {
        return address(_token);
    }

    function registry() external view returns (address) {
        return address(_registry);
    }

    function totalOwed() external view returns (uint256) {
        return totalEscrow + totalCredits;
    }

    // --- internals ---

    function _job(uint256 jobId) internal view returns (Job storage j) {
        j = _jobs[jobId];
        if (j.submitter == address(0)) revert UnknownJob(jobId);
    }

    function _requireStatus(uint256 jobId, Job storage j, JobStatus s) internal view {
        if (j.status != s) revert InvalidStatus(jobId, j.status);
    }

    function _isLive(DisputeRec storage d) internal view returns (bool) {
        if (d.jobId == 0 || d.settled) return false;
        Job storage j = _jobs[d.jobId];
        return j.status == JobStatus.Committed && j.round == d.round;
    }

    function _credit(address account, uint256 amount) internal {
        if (amount == 0) return;
        credits[account] += amount;
        totalCredits += amount;
        emit Credited(account, amount);
    }

    function _tryFixSeed(uint256 jobId, Job storage j) internal returns (bytes32 seed) {
        seed = blockhash(j.sampleBlock);
        if (seed != bytes32(0)) {
            j.seed = seed;
            emit SeedFixed(jobId, j.sampleBlock, seed);
        }
    }

    function _checkChallenge(uint256 jobId, uint256 segment) internal view returns (Job storage j) {
        j = _job(jobId);
        _requireStatus(jobId, j, JobStatus.Committed);
        if (block.timestamp >= j.windowEnd) revert WindowClosed(j.windowEnd);
        if (msg.sender == j.solver) revert SolverCannotChallenge();
        if (!_registry.isVerifier(msg.sender)) revert NotVerifier(msg.sender);
        if (segment >= j.segmentCount) revert SegmentOutOfRange(segment, j.segmentCount);
        // INVARIANT: a segment the solver already defended cannot be disputed again this round.
        if (_upheld[jobId][j.round][segment]) revert SegmentAlreadyUpheld(segment);
    }

    function _checkLeaf(
        Job storage j,
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

    function _openDispute(uint256 jobId, Job storage j, uint256 segment, bytes32 startHash, bytes32 endHash)
        internal
        returns (uint256 disputeId)
    {
        uint256 k = j.stepsPerSegment;
        uint256 bond = _challengeBond;
        if (bond != 0) _registry.lock(msg.sender, bond);
        j.openDisputes += 1;
        disputeId = IDisputeGame(disputeGame).open(
            jobId, segment, j.solver, msg.sender, segment * k, (segment + 1) * k, startHash, endHash
        );
        DisputeRec storage d = _disputes[disputeId];
        // INVARIANT: dispute ids are unique (the game never reuses one).
        if (d.jobId != 0) revert UnknownDispute(disputeId);
        uint32 round = j.round;
        _disputes[disputeId] = DisputeRec(uint64(jobId), uint32(segment), round, false);
        emit Challenged(jobId, disputeId, segment, msg.sender, round);
    }

    function _reopen(uint256 jobId, Job storage j) internal {
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
        j.segmentCount = 0;
        j.stepsPerSegment = 0;
        j.sampleBlock = 0;
        j.seed = bytes32(0);
        j.openDisputes = 0; // disputes of this round are moot (see DisputeGame.abortMoot)
        j.attestations = 0;
        emit JobReopened(jobId, former, round);
    }
}
