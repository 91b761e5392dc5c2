// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @title IJobMarket
/// @notice Training jobs: post -> claim -> commit -> verification window -> finalize,
///         or a dispute that reopens the job.
/// @dev Conservation: `token.balanceOf(market) == totalOwed()` ==
///      escrow of every unsettled job (reward + verification budget) + unpaid credits.
///      Pull payments: every payout is a credit; `withdraw()` pays it.
///
///      Lifecycle (`JobStatus`):
///      Open --claimJob--> Claimed --commitResult--> Committed --finalize--> Finalized
///      Open --cancel--> Cancelled
///      Claimed --reclaim (deadline missed)--> Open
///      Committed --resolveDispute(solverWon = false)--> Open
///      Each claim starts a new `round`; attestations, upheld segments and disputes
///      belong to the round they were made in and die with it.
///
///      Sampling: `commitResult` sets `sampleBlock = block.number + sampleLookahead`.
///      Once `block.number > sampleBlock`, `fixSeed` stores `seed = blockhash(sampleBlock)`
///      (`attest` fixes it implicitly). Fallback: if nobody fixed the seed while that
///      block hash was readable (256 blocks), `fixSeed` re-arms the sampling block to
///      `block.number + sampleLookahead` (event `SeedRearmed`) and the seed is fixed
///      from the new block later. On a chain that mines only on transactions (anvil
///      automine) blocks must be mined for the seed to become available.
interface IJobMarket {
    enum JobStatus {
        Open,
        Claimed,
        Committed,
        Finalized,
        Cancelled
    }

    /// @notice Deployment parameters, fixed for the market's life.
    struct Params {
        uint256 bondFactorBps; // solver bond = reward * bondFactorBps / 10000, locked from its stake
        uint256 verificationWindow; // seconds from commitResult during which attest / challenge are open
        uint256 sampleLookahead; // blocks between commit and the sampling block (>= 1)
        uint256 sampleCount; // n: segments sampled per job (min(n, segmentCount))
        uint256 missedDeadlineSlashBps; // share of the bond a solver loses to the submitter when it misses its deadline
        uint256 challengeBond; // locked from the challenger's stake per challenge
        uint256 attestorSlashBps; // of registry.minVerifierStake, taken from each attestor of a segment proven invalid
        uint256 maxAttestorsPerSegment; // cap on (paid) attestations per sampled segment
    }

    struct Job {
        JobStatus status;
        address submitter;
        address solver; // 0 while Open
        bytes32 specHash;
        bytes32 datasetHash;
        uint256 reward;
        uint256 verificationBudget;
        uint256 bond; // solver bond locked in the registry while Claimed / Committed
        uint64 solveDuration; // seconds a solver gets from claim to commit
        uint64 postedAt;
        uint64 deadline; // claim time + solveDuration
        uint64 committedAt;
        uint64 windowEnd; // committedAt + verificationWindow
        bytes32 traceRoot;
        bytes32 finalStateHash;
        uint32 segmentCount;
        uint32 stepsPerSegment; // k: leaf i commits the state after step i*k
        uint64 sampleBlock;
        bytes32 seed; // 0 until fixed
        uint32 openDisputes; // live disputes of the current round
        uint32 round; // number of claims so far
        uint32 attestations; // attestations in the current round
    }

    /// @notice The market's record of a dispute it opened.
    struct DisputeRef {
        uint256 jobId;
        uint256 segment;
        address challenger;
        uint32 round; // job round the dispute belongs to
        bool settled; // resolveDispute was called for it
    }

    // --- events ---
    event DisputeGameSet(address indexed disputeGame);
    event JobPosted(
        uint256 indexed jobId,
        address indexed submitter,
        bytes32 specHash,
        bytes32 datasetHash,
        uint256 reward,
        uint256 verificationBudget,
        uint64 solveDuration
    );
    event JobClaimed(uint256 indexed jobId, address indexed solver, uint32 round, uint256 bond, uint64 deadline);
    event ResultCommitted(
        uint256 indexed jobId,
        address indexed solver,
        bytes32 traceRoot,
        bytes32 finalStateHash,
        uint32 segmentCount,
        uint32 stepsPerSegment,
        uint64 windowEnd,
        uint64 sampleBlock
    );
    event SeedFixed(uint256 indexed jobId, uint64 sampleBlock, bytes32 seed);
    event SeedRearmed(uint256 indexed jobId, uint64 oldSampleBlock, uint64 newSampleBlock);
    event Attested(uint256 indexed jobId, uint256 indexed segment, address indexed verifier, uint32 round);
    event Challenged(
        uint256 indexed jobId, uint256 indexed disputeId, uint256 segment, address indexed challenger, uint32 round
    );
    event DisputeResolved(uint256 indexed jobId, uint256 indexed disputeId, uint256 segment, bool solverWon);
    event SegmentUpheld(uint256 indexed jobId, uint256 indexed segment, uint32 round);
    event AttestorSlashed(uint256 indexed jobId, address indexed attestor, uint256 amount, address indexed beneficiary);
    event JobReopened(uint256 indexed jobId, address indexed formerSolver, uint32 round);
    event JobReclaimed(uint256 indexed jobId, address indexed solver, uint256 slashed, uint256 unlocked);
    event JobFinalized(
        uint256 indexed jobId, address indexed solver, uint256 reward, uint32 attestations, uint256 perAttestation
    );
    event JobCancelled(uint256 indexed jobId, uint256 refund);
    event Credited(address indexed account, uint256 amount);
    event Withdrawn(address indexed account, uint256 amount);

    // --- errors ---
    error Unauthorized(address caller);
    error AlreadySet();
    error ZeroAddress();
    error InvalidParams();
    error ZeroReward();
    error ZeroDuration();
    error ZeroHash();
    error UnknownJob(uint256 jobId);
    error InvalidStatus(uint256 jobId, JobStatus status);
    error NotSubmitter(address caller);
    error NotSolver(address caller);
    error NotRegisteredSolver(address caller);
    error NotVerifier(address caller);
    error DeadlinePassed(uint64 deadline);
    error DeadlineNotPassed(uint64 deadline);
    error InvalidTrace();
    error SampleBlockNotReached(uint64 sampleBlock);
    error SeedAlreadyFixed();
    error SeedNotFixed();
    error WindowClosed(uint64 windowEnd);
    error WindowNotOver(uint64 windowEnd);
    error SegmentOutOfRange(uint256 segment, uint32 segmentCount);
    error SegmentNotSampled(uint256 segment);
    error AlreadyAttested(uint256 segment);
    error TooManyAttestors(uint256 segment);
    error SolverCannotChallenge();
    error SolverCannotAttest();
    error SegmentAlreadyUpheld(uint256 segment);
    error InvalidProof(uint256 leafIndex);
    error UnknownDispute(uint256 disputeId);
    error DisputeNotLive(uint256 disputeId);
    error DisputesOpen(uint32 openDisputes);
    error NothingToWithdraw();

    // --- submitter ---

    /// @notice Post a job, escrowing `reward + verificationBudget` (approve first). Ids start at 1.
    function postJob(
        bytes32 specHash,
        bytes32 datasetHash,
        uint256 reward,
        uint256 verificationBudget,
        uint64 solveDuration
    ) external returns (uint256 jobId);

    /// @notice Submitter only, job Open: the escrow is credited back.
    function cancel(uint256 jobId) external;

    // --- solver ---

    /// @notice Registered solver claims an Open job; locks `reward * bondFactorBps / 10000`
    ///         of its free stake; deadline = now + solveDuration.
    function claimJob(uint256 jobId) external;

    /// @notice The solver commits its trace before its deadline. Opens the verification
    ///         window (until now + verificationWindow) and sets the sampling block.
    function commitResult(
        uint256 jobId,
        bytes32 traceRoot,
        bytes32 finalStateHash,
        uint32 segmentCount,
        uint32 stepsPerSegment
    ) external;

    // --- anyone ---

    /// @notice Fix the job's sampling seed = blockhash(sampleBlock) once block.number > sampleBlock.
    ///         Returns the seed, or 0 when the block hash was no longer readable and the
    ///         sampling block was re-armed instead (`SeedRearmed`).
    function fixSeed(uint256 jobId) external returns (bytes32 seed);

    /// @notice After the window, with no live dispute: credits the solver the reward, unlocks its
    ///         bond, splits the verification budget equally over the round's attestations
    ///         (division remainder, or all of it when nobody attested, to the submitter).
    function finalize(uint256 jobId) external;

    /// @notice After a claimed job's deadline with no commit: missedDeadlineSlashBps of the bond
    ///         goes to the submitter's credit, the rest is unlocked, the job reopens.
    function reclaim(uint256 jobId) external;

    /// @notice Pay out the caller's credit.
    function withdraw() external returns (uint256 amount);

    // --- verifier ---

    /// @notice A staked verifier attests that sampled `segment` replayed within tolerance.
    ///         Within the window, once per (verifier, segment), at most maxAttestorsPerSegment.
    function attest(uint256 jobId, uint256 segment) external;

    /// @notice A staked verifier (not the solver) disputes `segment` within the window. Both
    ///         committed leaves (`segment`, `segment + 1`) are proven against the trace root;
    ///         challengeBond is locked from the caller's stake; the dispute game takes over.
    function challenge(
        uint256 jobId,
        uint256 segment,
        bytes32 startStateHash,
        uint256 startLossE9,
        bytes32[] calldata startProof,
        bytes32 endStateHash,
        uint256 endLossE9,
        bytes32[] calldata endProof
    ) external returns (uint256 disputeId);

    // --- dispute game only ---

    /// @notice Settlement hook of the dispute game. solverWon: the segment is upheld.
    ///         Otherwise: attestors of the segment are slashed (to the challenger), the job
    ///         reopens with its escrow intact, and the round's other disputes become moot.
    ///         The dispute game moves the solver's and the challenger's bonds itself.
    function resolveDispute(uint256 jobId, uint256 disputeId, bool solverWon) external;

    // --- views ---
    function params() external view returns (Params memory);
    function getJob(uint256 jobId) external view returns (Job memory);
    function jobCount() external view returns (uint256);
    function credits(address account) external view returns (uint256);
    function seedOf(uint256 jobId) external view returns (bytes32);
    /// @notice The sampled segments, once the seed is fixed or blockhash(sampleBlock) is readable.
    function sampledSegments(uint256 jobId) external view returns (uint256[] memory);
    /// @notice Attestors of `segment` in the job's current round.
    function attestorsOf(uint256 jobId, uint256 segment) external view returns (address[] memory);
    function hasAttested(uint256 jobId, uint256 segment, address verifier) external view returns (bool);
    function isUpheld(uint256 jobId, uint256 segment) external view returns (bool);
    function disputeRef(uint256 disputeId) external view returns (DisputeRef memory);
    /// @notice The job's submitter and current solver bond (what the dispute game settles).
    function settlementOf(uint256 jobId) external view returns (address submitter, uint256 bond);
    /// @notice A dispute still counts against its job: not settled, job Committed, same round.
    function isDisputeLive(uint256 disputeId) external view returns (bool);
    function token() external view returns (address);
    function registry() external view returns (address);
    function disputeGame() external view returns (address);
    /// @notice Escrow of unsettled jobs + unpaid credits: what the market owes.
    function totalOwed() external view returns (uint256);
    function totalEscrow() external view returns (uint256);
    function totalCredits() external view returns (uint256);
}
