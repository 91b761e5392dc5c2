// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @title IAvailability
/// @notice Data-availability challenges on committed rounds of the JobMarket: no payment
///         without evidence (docs/protocol.md, "Data availability").
/// @dev Anyone but the solver may `request` a segment of a Committed round, escrowing `bond`.
///      The solver (or anyone holding the data) must `publish` that segment's start and end
///      leaves with their Merkle proofs against the committed root within `answerWindow`;
///      the leaves then sit in the `Published` event, so the ordinary `JobMarket.challenge`
///      can be opened on them. Unanswered, `expire` condemns the round (settled by
///      `JobMarket.finalize` like a round the solver lost: bond split, job reopens) and
///      returns the bond. Answered, `solverShareBps` of the bond goes to the solver (the price
///      of a frivolous request) and the rest back to the challenger.
///      A request holds the round like a dispute (`openDisputes`), and each publication
///      leaves at least `disputeGrace` of window to dispute what was published.
///      Evidence: a round its committee did not attest by a majority is paid only once the
///      leaves of every sampled segment are published (`evidenced`); until then any
///      availability request stays open to anyone, so the round cannot hang.
///      Conservation: `token.balanceOf(this) == totalOwed()` (bonds of pending requests).
interface IAvailability {
    struct Params {
        uint256 bond; // escrowed (tokens, not stake) by a requester
        uint256 answerWindow; // seconds the solver has to publish a requested segment
        uint256 solverShareBps; // of the bond paid to the solver when it answers
    }

    enum State {
        None,
        Pending,
        Answered,
        Lost // unanswered: the round was condemned
    }

    struct Request {
        uint256 jobId;
        uint32 round;
        uint32 segment;
        address challenger;
        uint64 deadline;
        State state;
    }

    /// @notice One trace leaf: the state hash and loss at leaf `index` (step index * k).
    struct Leaf {
        bytes32 stateHash;
        uint256 lossE9;
        bytes32[] proof;
    }

    event Requested(
        uint256 indexed requestId,
        uint256 indexed jobId,
        uint32 round,
        uint256 segment,
        address indexed challenger,
        uint64 deadline
    );
    /// @notice Leaves `segment` and `segment + 1` of the round's trace, proven on chain.
    event Published(uint256 indexed jobId, uint32 round, uint256 indexed segment, Leaf start, Leaf end);
    event Answered(uint256 indexed requestId, uint256 indexed jobId, uint256 toSolver, uint256 toChallenger);
    event Expired(uint256 indexed requestId, uint256 indexed jobId, address indexed challenger, uint256 refund);

    error ZeroAddress();
    error InvalidParams();
    error NotCommitted(uint256 jobId);
    error SolverCannotRequest();
    error NotSolver(address caller);
    error SegmentOutOfRange(uint256 segment, uint32 segmentCount);
    error AlreadyPublished(uint256 jobId, uint256 segment);
    error AlreadyRequested(uint256 requestId);
    error RequestsClosed(uint256 jobId);
    error UnknownRequest(uint256 requestId);
    error NotPending(uint256 requestId);
    error AnswerTooLate(uint64 deadline);
    error NotExpired(uint64 deadline);
    error InvalidProof(uint256 leafIndex);

    /// @notice Name `segment` of the job's current round: its solver must publish it within
    ///         `answerWindow`. Open while the window is, or a dispute or request of the round is
    ///         live, or the round lacks an attestation majority; never on a published segment
    ///         or one already requested, nor on a condemned round. Escrows `bond` (approve it).
    function request(uint256 jobId, uint256 segment) external returns (uint256 requestId);

    /// @notice Publish leaves `segment` and `segment + 1` of the current round's trace, proven
    ///         against its root. Anyone may answer the segment's pending request (before its
    ///         deadline); without one, only the solver may publish (`NotSolver`): it adds
    ///         evidence and gives others `disputeGrace` to dispute it.
    function publish(uint256 jobId, uint256 segment, Leaf calldata start, Leaf calldata end) external;

    /// @notice A pending request past its deadline: the round is condemned, the bond returned.
    function expire(uint256 requestId) external;

    /// @notice Every sampled segment of the round is published (false before the seed is fixed).
    function evidenced(uint256 jobId, uint32 round) external view returns (bool);
    function isPublished(uint256 jobId, uint32 round, uint256 segment) external view returns (bool);
    /// @notice The pending request on a segment of a round, or 0.
    function pendingOf(uint256 jobId, uint32 round, uint256 segment) external view returns (uint256);
    function getRequest(uint256 requestId) external view returns (Request memory);
    function requestCount() external view returns (uint256);
    function params() external view returns (Params memory);
    /// @notice Bonds of pending requests: what the contract owes.
    function totalOwed() external view returns (uint256);
    function token() external view returns (address);
    function market() external view returns (address);
}
