// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {DisputeId, JobId} from "./Ids.sol";

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
///      Committed --finalize (round condemned: a dispute proved the solver wrong)--> Open
///      Reserved jobs (`postReservedJob`): the same lifecycle, but only the reserved
///      solver claims (every round, reopened ones included) and only the submitter
///      finalizes, reclaims and cancels (the CollabMarket posts its inner runs so).
///      Each claim starts a new `round`; the committee, attestations, bars and disputes
///      belong to the round they were made in.
///
///      Terms: `postJob` fixes total steps T, checkpoint interval k (T % k == 0) and the
///      hash of the spec's seeded initial state S_0; `commitResult` proves leaf 0 holds
///      S_0 and the last leaf (index T / k) holds `finalStateHash`.
///
///      Disputes (rational-adversary rules): a dispute the solver wins bars only the
///      challenger who lost it from that segment; any other verifier may still challenge.
///      Challenges are open while the window is, or while any dispute of the round is
///      live, and every dispute that ends leaves at least `disputeGrace` seconds of
///      window. A dispute the solver loses condemns the round; the bond is settled once,
///      by `finalize` after the window, when all disputes of the round have ended:
///      submitterShareBps to the submitter, the rest (plus the attestors' slashes when a
///      jury proved a sampled segment invalid) to the challenger of the EARLIEST-OPENED
///      dispute the solver lost (`RoundInfo.firstWinner`, paid in that `finalize`). Opening
///      order, not finishing order: a puppet opened after an honest challenge cannot take
///      its reward by losing faster, and a puppet opened before any honest one is the
///      cheater reporting itself (it forfeits the reward and the submitter share).
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

    /// @notice How a dispute ended (the dispute game reports it).
    enum Verdict {
        None,
        Valid, // the step replayed (jury) or the challenger ran out of clock
        Invalid, // the jury found the step wrong
        SolverTimedOut, // the solver ran out of clock: it loses, but nothing was proven
        Void // too few jurors drawn, below quorum or a tie: nobody wins
    }

    /// @notice Deployment parameters, fixed for the market's life.
    struct Params {
        uint256 bondFactorBps; // solver bond = reward * bondFactorBps / 10000, locked from its stake
        uint256 verificationWindow; // seconds from commitResult during which attest / challenge are open
        uint256 sampleLookahead; // blocks between commit and the sampling block (>= 1)
        uint256 sampleCount; // n: segments sampled per job (min(n, segmentCount))
        // Reserved jobs (collaborative inner runs): their final segment plus this many of
        // the others (SegmentSampler.sampleWithFinal); the bond deters a rational cheater
        // at n = 1 and a worker's many rounds give the per-job floor (docs/protocol.md).
        uint256 reservedSampleCount;
        uint256 missedDeadlineSlashBps; // share of the bond a solver loses to the submitter when it misses its deadline
        uint256 challengeBond; // locked from the challenger's stake per challenge
        uint256 attestorSlashBps; // of registry.minVerifierStake, taken from each attestor of a job proven invalid on a sampled segment
        uint256 attestorsPerJob; // committee seats drawn per round (stake-weighted) to verify the sample
        uint256 disputeGrace; // seconds of window left to others whenever a dispute ends
        // The next three sum to 10000: how a condemned solver's bond is split.
        uint256 challengerShareBps;
        uint256 jurorShareBps;
        uint256 submitterShareBps;
    }

    /// @notice What a submitter fixes when posting: the commitment must be this job's.
    struct JobTerms {
        bytes32 specHash;
        bytes32 datasetHash;
        uint256 reward;
        uint256 verificationBudget;
        uint64 solveDuration;
        uint64 totalSteps; // T
        uint32 stepsPerSegment; // k, the checkpoint interval; T % k == 0
        bytes32 initStateHash; // hash of S_0, which follows from the spec's seed
        // n, the segments sampled: 0 takes the floor min(params.sampleCount, S); else
        // floor <= n <= S (S: every segment). verificationBudget is the fee at the floor:
        // the market escrows verificationBudget * n / floor, so more replay pays more.
        uint32 sampleCount;
    }

    /// @dev All static types, in this order: CollabMarket reads fields 0 (status), 10
    ///      (deadline), 11 (committedAt), 12 (windowEnd) and 19 (openDisputes) of `getJob`'s
    ///      return data by position (tests/test_collab_market.py would catch a reorder).
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
        uint64 windowEnd; // committedAt + verificationWindow, extended by disputes
        bytes32 traceRoot;
        bytes32 finalStateHash;
        uint32 segmentCount; // T / k, fixed at post
        uint32 stepsPerSegment; // k: leaf i commits the state after step i*k
        uint64 sampleBlock;
        bytes32 seed; // 0 until fixed
        uint32 openDisputes; // live disputes of the current round
        uint32 round; // number of claims so far
        uint32 attestations; // committee members who attested in the current round
        uint64 totalSteps;
        bytes32 initStateHash;
        uint64 snapshotBlock; // commit block: the committee is drawn from stake as of then
        uint32 poolLen; // sortition pool length at commit
        uint32 sampleCount; // n: segments sampled (reserved jobs: 0, their own rule)
    }

    /// @notice The market's record of a dispute it opened.
    struct DisputeRef {
        uint256 jobId;
        uint256 segment;
        address challenger;
        uint32 round; // job round the dispute belongs to
        bool settled; // the dispute game reported its verdict
        Verdict verdict;
    }

    /// @notice Settlement state of one round of a job.
    struct RoundInfo {
        bool condemned; // some dispute of the round ended Invalid or SolverTimedOut
        bool sampledInvalid; // a jury found a sampled segment invalid
        bool settled; // the condemned round's bond was split (finalize)
        uint32 juryWins; // disputes of the round that ended Invalid
        uint32 timeoutWins; // disputes of the round that ended SolverTimedOut
        uint64 firstWinner; // the earliest-opened dispute the solver lost: the one paid
        // Bit i: committee seat i's share of the sample held a segment a jury found
        // invalid; seat i's attestor (if it attested) is slashed at settlement.
        uint16 liableSeats;
    }

    // --- events ---
    event DisputeGameSet(address indexed disputeGame);
    event AvailabilitySet(address indexed availability);
    event JobPosted(
        uint256 indexed jobId,
        address indexed submitter,
        bytes32 specHash,
        bytes32 datasetHash,
        uint256 reward,
        uint256 verificationBudget,
        uint64 solveDuration
    );
    event JobReserved(uint256 indexed jobId, address indexed solver);
    event JobTermsFixed(uint256 indexed jobId, uint64 totalSteps, uint32 stepsPerSegment, bytes32 initStateHash);
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
    event CommitteeDrawn(uint256 indexed jobId, uint32 round, address[] committee);
    event Attested(uint256 indexed jobId, address indexed verifier, uint32 round);
    event Challenged(
        uint256 indexed jobId, uint256 indexed disputeId, uint256 segment, address indexed challenger, uint32 round
    );
    event DisputeResolved(uint256 indexed jobId, uint256 indexed disputeId, uint256 segment, Verdict verdict);
    event ChallengerBarred(uint256 indexed jobId, uint256 indexed segment, address indexed challenger, uint32 round);
    event WindowExtended(uint256 indexed jobId, uint64 windowEnd);
    event RoundCondemned(uint256 indexed jobId, uint32 round);
    event RoundSettled(
        uint256 indexed jobId, uint32 round, uint256 slashedBond, uint256 toSubmitter, uint128 perChallenger, uint128 perJury
    );
    event RewardPaid(
        uint256 indexed jobId, uint256 indexed disputeId, address indexed challenger, uint256 amount, uint256 juryAmount
    );
    event AttestorSlashed(uint256 indexed jobId, address indexed attestor, uint256 amount);
    /// @notice A condemned round's attestor slashes, sent to the burn address (no party of
    ///         the round is paid them: see JobMarket._settleCondemned).
    event AttestorSlashesBurned(uint256 indexed jobId, uint32 indexed round, uint256 amount);
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
    error AmountTooLarge(uint256 amount, uint256 max);
    error DurationTooLong(uint256 duration, uint256 max);
    error InvalidTerms(uint64 totalSteps, uint32 stepsPerSegment);
    error SampleCountOutOfRange(uint256 n, uint256 min, uint256 max);
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
    error NotInCommittee(address caller);
    error AlreadyAttested(address caller);
    error SolverCannotChallenge();
    error ChallengerBarredFrom(uint256 segment, address challenger);
    error AlreadyCondemned(uint256 jobId, uint32 round);
    error InvalidProof(uint256 leafIndex);
    error UnknownDispute(uint256 disputeId);
    error DisputeNotLive(uint256 disputeId);
    error DisputesOpen(uint32 openDisputes);
    error NothingToWithdraw();
    error NotReservedSolver(uint256 jobId, address caller);
    error OnlySubmitter(uint256 jobId, address caller);
    /// @notice A clean round is paid only when a majority of its committee attested or every
    ///         sampled segment is published on chain (Availability.publish).
    error NoEvidence(uint32 attestations, uint32 seats);

    // --- submitter ---

    /// @notice Post a job, escrowing `reward + verificationBudget` (approve first). Ids start at 1.
    function postJob(JobTerms calldata terms) external returns (JobId jobId);

    /// @notice Like `postJob` (the caller is the submitter and escrows), but only `solver`
    ///         may `claimJob` it, in every round (`NotReservedSolver`), and only the
    ///         submitter may `finalize`, `reclaim` or `cancel` it (`OnlySubmitter`), so a
    ///         contract submitter can attribute every credit the market gives it.
    function postReservedJob(JobTerms calldata terms, address solver) external returns (JobId jobId);

    /// @notice Submitter only, job Open: the escrow is credited back.
    function cancel(JobId jobId) external;

    // --- solver ---

    /// @notice Registered solver claims an Open job; locks `reward * bondFactorBps / 10000`
    ///         of its free stake; deadline = now + solveDuration.
    function claimJob(JobId jobId) external;

    /// @notice The solver commits its trace before its deadline: `initProof` proves leaf 0
    ///         = (step 0, the job's initStateHash, loss 0), `finalProof` proves leaf T / k =
    ///         (step T, finalStateHash, finalLossE9). Opens the verification window (until
    ///         now + verificationWindow) and sets the sampling block.
    function commitResult(
        JobId jobId,
        bytes32 traceRoot,
        bytes32 finalStateHash,
        uint256 finalLossE9,
        bytes32[] calldata initProof,
        bytes32[] calldata finalProof
    ) external;

    // --- anyone ---

    /// @notice Fix the job's sampling seed = blockhash(sampleBlock) once block.number > sampleBlock
    ///         and draw the round's attestation committee from it. Returns the seed, or 0 when
    ///         the block hash was no longer readable and the sampling block was re-armed
    ///         instead (`SeedRearmed`).
    function fixSeed(JobId jobId) external returns (bytes32 seed);

    /// @notice After the window, with no live dispute. A clean round is paid only with
    ///         evidence (else `NoEvidence`): a strict majority of the seats drawn attested, or
    ///         every sampled segment's leaves are published (`IAvailability.evidenced`).
    ///         A clean round: credits the solver the
    ///         reward, unlocks its bond, pays each committee member that attested
    ///         verificationBudget / attestorsPerJob (the rest to the submitter). A condemned
    ///         round: slashes the bond, credits the submitter its share and the round's first
    ///         winner the rest (its majority jurors their share, through the dispute game),
    ///         slashes the attestors (to that winner) if a jury proved a sampled segment
    ///         invalid, and reopens the job with its escrow intact.
    function finalize(JobId jobId) external;

    /// @notice After a claimed job's deadline with no commit: missedDeadlineSlashBps of the bond
    ///         goes to the submitter's credit, the rest is unlocked, the job reopens.
    ///         Anyone, except for a reserved job: its submitter only (so is `finalize`).
    function reclaim(JobId jobId) external;

    /// @notice Pay out the caller's credit.
    function withdraw() external returns (uint256 amount);


    // --- verifier ---

    /// @notice A committee member of the round attests, once, that every sampled segment
    ///         replayed within tolerance. Within the window.
    function attest(JobId jobId) external;

    /// @notice A staked verifier (not the solver, not barred from the segment) disputes
    ///         `segment` while the window is open or a dispute of the round is live, and the
    ///         round is not yet condemned (a later dispute could never be its first winner,
    ///         only delay the settlement). Both
    ///         committed leaves (`segment`, `segment + 1`) are proven against the trace root;
    ///         challengeBond is locked from the caller's stake; the dispute game takes over.
    function challenge(
        JobId jobId,
        uint256 segment,
        bytes32 startStateHash,
        uint256 startLossE9,
        bytes32[] calldata startProof,
        bytes32 endStateHash,
        uint256 endLossE9,
        bytes32[] calldata endProof
    ) external returns (uint256 disputeId);

    // --- dispute game only ---

    /// @notice Verdict of a dispute. Valid bars its challenger from the segment this round;
    ///         Invalid / SolverTimedOut condemn the round; every verdict extends the window
    ///         to at least now + disputeGrace. The dispute game moves the challenger's bond.
    function resolveDispute(
        JobId jobId,
        DisputeId disputeId,
        uint256 segment,
        uint32 round,
        address challenger,
        Verdict verdict
    ) external;

    // --- availability game only ---

    /// @notice The Availability contract reports on a round: op 0 a request opened (counted
    ///         in `openDisputes`; refused on a condemned round), 1 answered, 2 lost (unanswered:
    ///         condemns the round; `challenger` is paid the challenger's share at settlement when
    ///         no dispute of the round was lost), 3 unasked leaves published. Every op but 0
    ///         leaves at least `disputeGrace` of window.
    function availabilityHook(JobId jobId, uint32 round, uint8 op, address challenger) external;

    // --- views ---
    function availability() external view returns (address);
    function params() external view returns (Params memory);
    function getJob(JobId jobId) external view returns (Job memory);
    function jobCount() external view returns (uint256);
    function credits(address account) external view returns (uint256);
    function seedOf(JobId jobId) external view returns (bytes32);
    /// @notice The sampled segments, once the seed is fixed or blockhash(sampleBlock) is readable.
    function sampledSegments(JobId jobId) external view returns (uint256[] memory);
    /// @notice The current round's committee (empty until the seed is fixed).
    function committeeOf(JobId jobId) external view returns (address[] memory);
    /// @notice Committee members who attested in the job's current round.
    function attestorsOf(JobId jobId) external view returns (address[] memory);
    function hasAttested(JobId jobId, address verifier) external view returns (bool);
    function isBarred(JobId jobId, uint256 segment, address challenger) external view returns (bool);
    function disputeRef(DisputeId disputeId) external view returns (DisputeRef memory);
    function roundInfo(JobId jobId, uint32 round) external view returns (RoundInfo memory);
    /// @notice The only solver that may claim a reserved job; address(0) for an ordinary job.
    function reservedSolverOf(JobId jobId) external view returns (address);
    /// @notice The job's submitter and current solver bond.
    function settlementOf(JobId jobId) external view returns (address submitter, uint256 bond);
    /// @notice A dispute still counts against its job: not settled, job Committed, same round.
    function isDisputeLive(DisputeId disputeId) external view returns (bool);
    function token() external view returns (address);
    function registry() external view returns (address);
    function disputeGame() external view returns (address);
    /// @notice Escrow of unsettled jobs + unpaid credits: what the market owes.
    function totalOwed() external view returns (uint256);
    /// @notice Attestor slashes burned, ever (`AttestorSlashesBurned`).
    function totalBurned() external view returns (uint256);
    function totalEscrow() external view returns (uint256);
    function totalCredits() external view returns (uint256);
}
