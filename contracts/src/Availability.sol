// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {ReentrancyGuardTransient} from "@openzeppelin/contracts/utils/ReentrancyGuardTransient.sol";
import {IAvailability} from "./interfaces/IAvailability.sol";
import {JobId} from "./interfaces/Ids.sol";
import {IJobMarket} from "./interfaces/IJobMarket.sol";
import {TraceLib} from "./libraries/TraceLib.sol";

/// @title Availability
/// @notice Data-availability challenges for the JobMarket. See {IAvailability}.
/// @dev A contract of its own (the market has little room under EIP-170); the market
///      authorises it once (`JobMarket.setAvailability`) and keeps the round's books:
///      a pending request counts as a live dispute, an unanswered one condemns the round.
contract Availability is IAvailability, ReentrancyGuardTransient {
    using SafeERC20 for IERC20;

    uint256 internal constant BPS = 10_000;
    uint256 internal constant MAX_DURATION = 365 days;
    // JobMarket.availabilityHook operations
    uint8 internal constant OP_OPEN = 0;
    uint8 internal constant OP_ANSWERED = 1;
    uint8 internal constant OP_LOST = 2;
    uint8 internal constant OP_PUBLISHED = 3;

    IERC20 internal immutable _token;
    IJobMarket internal immutable _market;
    uint256 internal immutable _bond;
    uint256 internal immutable _answerWindow;
    uint256 internal immutable _solverShareBps;
    /// @dev JobMarket's horizon (HORIZON_WINDOWS = 2 verification windows after commit): no
    ///      request after it, but on a sampled segment of a round without an attesting majority.
    uint256 internal immutable _horizon;

    uint256 public override requestCount;
    uint256 public override totalOwed;
    mapping(uint256 => Request) internal _requests;
    /// @dev keccak256(jobId, round, segment) => the segment's leaves are on chain
    mapping(bytes32 => bool) internal _published;
    /// @dev keccak256(jobId, round, segment) => its pending request, or 0
    mapping(bytes32 => uint256) internal _pending;

    constructor(IERC20 token_, IJobMarket market_, Params memory params_) {
        if (address(token_) == address(0) || address(market_) == address(0)) revert ZeroAddress();
        if (
            params_.answerWindow == 0 || params_.answerWindow > MAX_DURATION || params_.solverShareBps > BPS
                || params_.bond > type(uint96).max
        ) revert InvalidParams();
        _token = token_;
        _market = market_;
        _bond = params_.bond;
        _answerWindow = params_.answerWindow;
        _solverShareBps = params_.solverShareBps;
        _horizon = 2 * market_.params().verificationWindow;
    }

    function request(uint256 jobId, uint256 segment) external nonReentrant returns (uint256 requestId) {
        IJobMarket.Job memory j = _committed(jobId);
        if (msg.sender == j.solver) revert SolverCannotRequest();
        if (segment >= j.segmentCount) revert SegmentOutOfRange(segment, j.segmentCount);
        bytes32 key = _key(jobId, j.round, segment);
        // INVARIANT: a segment is answered once per round: re-requesting it could only delay.
        if (_published[key]) revert AlreadyPublished(jobId, segment);
        if (_pending[key] != 0) revert AlreadyRequested(_pending[key]);
        // Open while the round could still be paid without evidence being asked for: the
        // window, a live dispute or request, or no attestation majority (then it never closes,
        // so a round its committee would not vouch for can always be forced to show its data).
        // INVARIANT: delay is bounded: past the horizon a request can only ask for what the
        // round needs to be paid at all (a sampled segment, no attesting majority); the solver
        // that publishes its sample leaves nothing to ask. (The committee is read only when
        // it matters: an external call.)
        bool late = block.timestamp >= j.committedAt + _horizon;
        if (late || (block.timestamp >= j.windowEnd && j.openDisputes == 0)) {
            if (_quorum(jobId, j) || (late && !_sampled(jobId, segment))) revert RequestsClosed(jobId);
        }
        requestId = ++requestCount;
        uint64 deadline = uint64(block.timestamp + _answerWindow);
        _requests[requestId] = Request(jobId, j.round, uint32(segment), msg.sender, deadline, State.Pending);
        _pending[key] = requestId;
        totalOwed += _bond;
        // The market refuses a condemned round (AlreadyCondemned) and counts the request live.
        _market.availabilityHook(JobId.wrap(jobId), j.round, OP_OPEN, msg.sender);
        if (_bond != 0) _token.safeTransferFrom(msg.sender, address(this), _bond);
        emit Requested(requestId, jobId, j.round, segment, msg.sender, deadline);
    }

    function publish(uint256 jobId, uint256 segment, Leaf calldata start, Leaf calldata end) external nonReentrant {
        IJobMarket.Job memory j = _committed(jobId);
        if (segment >= j.segmentCount) revert SegmentOutOfRange(segment, j.segmentCount);
        bytes32 key = _key(jobId, j.round, segment);
        if (_published[key]) revert AlreadyPublished(jobId, segment);
        uint256 id = _pending[key];
        // INVARIANT: unasked leaves come from the solver alone: each extends the window, so
        // anyone else holding the trace could delay the settlement for free.
        if (id == 0 && msg.sender != j.solver) revert NotSolver(msg.sender);
        // INVARIANT: only leaves of the committed root count as evidence.
        _check(j, jobId, segment, start);
        _check(j, jobId, segment + 1, end);
        _published[key] = true;
        emit Published(jobId, j.round, segment, start, end);
        if (id == 0) {
            // Unasked evidence (a solver whose committee stays silent): others get time to dispute it.
            _market.availabilityHook(JobId.wrap(jobId), j.round, OP_PUBLISHED, address(0));
            return;
        }
        Request storage r = _requests[id];
        if (block.timestamp > r.deadline) revert AnswerTooLate(r.deadline);
        r.state = State.Answered;
        _pending[key] = 0;
        totalOwed -= _bond;
        _market.availabilityHook(JobId.wrap(jobId), j.round, OP_ANSWERED, r.challenger);
        // The requester of a segment that was there pays the solver for its trouble.
        uint256 toSolver = _bond * _solverShareBps / BPS;
        uint256 back = _bond - toSolver;
        if (toSolver != 0) _token.safeTransfer(j.solver, toSolver);
        if (back != 0) _token.safeTransfer(r.challenger, back);
        emit Answered(id, jobId, toSolver, back);
    }

    function expire(uint256 requestId) external nonReentrant {
        Request storage r = _requests[requestId];
        if (r.state == State.None) revert UnknownRequest(requestId);
        if (r.state != State.Pending) revert NotPending(requestId);
        if (block.timestamp <= r.deadline) revert NotExpired(r.deadline);
        r.state = State.Lost;
        _pending[_key(r.jobId, r.round, r.segment)] = 0;
        totalOwed -= _bond;
        // INVARIANT: withholding a named segment past its clock condemns the round.
        _market.availabilityHook(JobId.wrap(r.jobId), r.round, OP_LOST, r.challenger);
        if (_bond != 0) _token.safeTransfer(r.challenger, _bond);
        emit Expired(requestId, r.jobId, r.challenger, _bond);
    }

    // --- views ---

    function evidenced(uint256 jobId, uint32 round) external view returns (bool) {
        if (_market.seedOf(JobId.wrap(jobId)) == bytes32(0)) return false;
        uint256[] memory s = _market.sampledSegments(JobId.wrap(jobId));
        for (uint256 i; i < s.length; ++i) {
            if (!_published[_key(jobId, round, s[i])]) return false;
        }
        return true;
    }

    function isPublished(uint256 jobId, uint32 round, uint256 segment) external view returns (bool) {
        return _published[_key(jobId, round, segment)];
    }

    function pendingOf(uint256 jobId, uint32 round, uint256 segment) external view returns (uint256) {
        return _pending[_key(jobId, round, segment)];
    }

    function getRequest(uint256 requestId) external view returns (Request memory) {
        return _requests[requestId];
    }

    function params() external view returns (Params memory) {
        return Params(_bond, _answerWindow, _solverShareBps);
    }

    function token() external view returns (address) {
        return address(_token);
    }

    function market() external view returns (address) {
        return address(_market);
    }

    // --- internals ---

    function _committed(uint256 jobId) internal view returns (IJobMarket.Job memory j) {
        j = _market.getJob(JobId.wrap(jobId));
        if (j.status != IJobMarket.JobStatus.Committed) revert NotCommitted(jobId);
    }

    /// @dev The market's rule (JobMarket.finalize): a strict majority of the seats drawn attested.
    function _quorum(uint256 jobId, IJobMarket.Job memory j) internal view returns (bool) {
        return j.attestations * 2 > _market.committeeOf(JobId.wrap(jobId)).length;
    }

    function _sampled(uint256 jobId, uint256 segment) internal view returns (bool) {
        uint256[] memory s = _market.sampledSegments(JobId.wrap(jobId));
        for (uint256 i; i < s.length; ++i) {
            if (s[i] == segment) return true;
        }
        return false;
    }

    function _check(IJobMarket.Job memory j, uint256 jobId, uint256 index, Leaf calldata l) internal pure {
        if (!TraceLib.verifyLeaf(j.traceRoot, jobId, index, j.stepsPerSegment, l.stateHash, l.lossE9, l.proof)) {
            revert InvalidProof(index);
        }
    }

    function _key(uint256 jobId, uint32 round, uint256 segment) internal pure returns (bytes32) {
        return keccak256(abi.encode(jobId, round, segment));
    }
}
