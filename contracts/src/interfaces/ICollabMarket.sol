// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @title ICollabMarket
/// @notice The chain side of collaborative (DiLoCo) jobs. Every (round, slot) inner run is an
///         ordinary JobMarket job (a "sub-job") that this contract posts as its submitter with
///         `postReservedJob`, reserved for the slot holder: claim + bond, commit with the S_0 /
///         final-leaf proofs, committee, challenges, bisection + jury, slashing and paying the
///         worker are the market's, unchanged. This contract adds the slots, the rounds, their
///         settlement and the outer state (first poster + challenge decided by a jury).
/// @dev Lifecycle of a job (`CollabStatus`) and of its current round (`RoundPhase`):
///      Open (round 0 Idle) --startRound--> Running: round r Running
///      Running --settleRound, >= minWorkers accepted--> round r Outer (awaiting its outer state)
///      Running --settleRound, fewer accepted--> round r Idle again (retry), or Failed
///      Outer --postOuter, outerWindow without a live challenge, acceptOuter--> round r + 1 Idle,
///            or Finished after the last round.
///      With pipelineDepth 0 rounds are sequential: round r + 1 starts only after round r's
///      sub-jobs are final and its outer state accepted. With D > 0, rounds up to D past the
///      base round (`round`, the lowest not finalized) start on posted candidates; they settle
///      and finalize in order, and a candidate proven wrong rolls back every round built on it
///      (`RoundsRolledBack`), its culprit's pipeline bond refilling the pool (docs/protocol.md,
///      "Pipelined rounds").
///      A challenged outer state is judged by a jury of the OuterJury contract (drawn, voted
///      and tallied there, with the authority to slash silent and minority jurors' stake);
///      this contract holds the bonds and pays the verdict.
///
///      Conservation: `token.balanceOf(this) == totalOwed()` == the jobs' pools (escrow not
///      yet posted as sub-jobs, plus what came back) + unpaid credits + outer bonds held.
///      Pull payments: every payout is a credit; `withdraw()` pays it.
interface ICollabMarket {
    enum CollabStatus {
        None,
        Open, // posted, round 0 not started
        Running,
        Finished, // the last round's outer state accepted: its outerHash is the model
        Failed // a round stayed below minWorkers past maxRoundRetries, or could not be funded
    }

    enum RoundPhase {
        Idle, // to be started (startRound)
        Running, // sub-jobs posted
        Outer // settled with >= minWorkers accepted: waiting for its outer state
    }

    enum ChallengePhase {
        None,
        Live // a challenge's OuterJury case (`juryCase`) is not resolved yet
    }

    enum OuterVerdict {
        None,
        Valid, // the posted outer state recomputes: the challenger loses its bond
        Invalid, // it does not: the poster loses its bond, the post is removed
        Void // too few jurors drawn or revealed, or a tie: both bonds returned
    }

    /// @notice Deployment parameters, fixed for the contract's life.
    struct Params {
        uint256 outerWindow; // seconds a posted outer state stays open to challenge
        uint256 outerBond; // tokens a poster and a challenger each put up
        uint256 maxSlots; // bound on a job's maxWorkers (<= 64)
        uint256 maxRounds; // bound on a job's rounds
        uint256 maxRoundRetries; // retries of a round that stayed below minWorkers
        uint256 throughputToleranceBps; // delivered may fall this far below claimed
        uint256 slotBond; // tokens a worker puts up per slot held, lost if its sub-job goes unclaimed
    }

    /// @notice What a submitter fixes when posting a collaborative job.
    struct CollabTerms {
        bytes32 specHash;
        bytes32 datasetHash;
        uint256 reward; // all rounds, all slots: reward / (rounds * maxWorkers) per sub-job
        uint256 verificationBudget; // likewise per sub-job
        uint32 minWorkers;
        uint32 maxWorkers; // = slots
        uint64 innerSteps; // H, the inner steps of one sub-job
        uint32 stepsPerSegment; // k; H % k == 0
        uint32 rounds; // R
        uint64 roundDuration; // seconds from a round's start to its deadline
        bytes32 initStateHash; // S_0 of round 0's inner runs
        bytes32 outerInitHash; // outer-state hash of theta_0 with zero momentum
        uint8 pipelineDepth; // D <= 4: rounds that may run ahead of the last finalized one (0: sequential)
    }

    struct Collab {
        CollabStatus status;
        RoundPhase phase; // of the current round
        address submitter;
        bytes32 specHash;
        bytes32 datasetHash;
        uint256 reward;
        uint256 verificationBudget;
        uint256 subReward; // per sub-job
        uint256 subBudget; // per sub-job
        uint256 pool; // tokens held for the job: escrow not posted yet + what came back
        uint32 minWorkers;
        uint32 maxWorkers;
        uint64 innerSteps;
        uint32 stepsPerSegment;
        uint32 rounds;
        uint64 roundDuration;
        uint32 round; // the current round
        uint32 retries; // retries of the current round so far
        bytes32 initStateHash; // S_0 of the current round's inner runs
        bytes32 outerHash; // the last accepted outer state (outerInitHash before round 0)
        uint8 pipelineDepth; // D
        uint32 ahead; // speculative rounds running past `round` (<= D); each slot and outer bond
        // of a D > 0 job carries a pipeline bond P = D x maxWorkers x subReward on top
    }

    /// @notice One round (its latest attempt) with its outer state and challenge.
    struct RoundView {
        uint64 start;
        uint64 deadline;
        uint32 attempt; // 0 for the first try, +1 per retry
        uint256[] subJobs; // market job id per slot, 0 where the slot had no sub-job
        uint64 acceptedMask; // bit i: slot i's sub-job was accepted
        bool settled;
        bytes32 outerHash;
        bytes32 nextInitHash;
        address poster; // 0 when nothing is posted
        uint64 postedAt;
        uint64 windowEnd; // postedAt + outerWindow, extended by challenges
        bool accepted;
        ChallengePhase challengePhase;
        address challenger;
        uint256 juryCase; // OuterJury case of the live (or last) challenge; 0 if none
        OuterVerdict lastVerdict;
    }

    // --- events ---
    event CollabPosted(
        uint256 indexed jobId,
        address indexed submitter,
        bytes32 specHash,
        uint256 reward,
        uint256 verificationBudget,
        uint32 maxWorkers,
        uint32 rounds
    );
    event SlotClaimed(uint256 indexed jobId, uint32 indexed slot, address indexed node, uint64 claimedMilliStepsPerSec);
    event SlotReleased(uint256 indexed jobId, uint32 indexed slot, address indexed node, uint8 reason); // 0 left, 1 dropped, 2 throughput, 3 job over, 4 excluded
    event RoundStarted(uint256 indexed jobId, uint32 round, uint32 attempt, uint64 deadline, uint256[] subJobs);
    event SubJobPosted(uint256 indexed jobId, uint32 round, uint32 slot, uint256 marketJobId, address worker);
    event SubJobAccepted(uint256 indexed jobId, uint32 round, uint32 slot, uint256 marketJobId, address worker);
    event SubJobDropped(uint256 indexed jobId, uint32 round, uint32 slot, uint256 marketJobId, address worker, uint8 reason); // 0 missed, 1 condemned, 2 never claimed
    event DeliveredRecorded(address indexed node, uint64 milliStepsPerSec);
    /// @notice A sub-job of `node` in `jobId` was condemned: it is out of the job for good.
    event WorkerExcluded(uint256 indexed jobId, address indexed node);
    event RoundSettled(uint256 indexed jobId, uint32 round, uint64 acceptedMask, uint32 accepted, uint256 sharedPot, uint256 perWorker);
    event RoundRetried(uint256 indexed jobId, uint32 round, uint32 retries);
    event CollabFailed(uint256 indexed jobId, uint32 round, uint256 refund);
    event CollabFinished(uint256 indexed jobId, bytes32 outerHash, uint256 refund);
    event OuterPosted(uint256 indexed jobId, uint32 round, address indexed poster, bytes32 outerHash, bytes32 nextInitHash, uint64 windowEnd);
    event OuterChallenged(uint256 indexed jobId, uint32 round, address indexed challenger, uint256 juryCase);
    event OuterResolved(uint256 indexed jobId, uint32 round, OuterVerdict verdict, uint32 validVotes, uint32 invalidVotes, uint64 windowEnd);
    event OuterAccepted(uint256 indexed jobId, uint32 round, bytes32 outerHash, bytes32 nextInitHash);
    /// @notice Round `firstRound - 1`'s candidate was invalid (reason 0: a delta it included was
    ///         condemned; 1: its post was tallied Invalid): rounds firstRound..lastRound, built
    ///         on it, are back to Idle and their sub-jobs orphaned; `poolRefund` of the
    ///         culprit's pipeline bond went back to the pool for their wasted escrow.
    event RoundsRolledBack(uint256 indexed jobId, uint32 firstRound, uint32 lastRound, uint8 reason, uint256 poolRefund);
    /// @notice A post removed through no fault of its poster (its bond returned).
    event OuterWithdrawn(uint256 indexed jobId, uint32 round, address indexed poster);
    event OrphanSettled(uint256 indexed jobId, uint256 marketJobId, bool paid); // paid: its worker was paid
    event Credited(address indexed account, uint256 amount);
    event Withdrawn(address indexed account, uint256 amount);

    // --- errors ---
    error ZeroAddress();
    error InvalidParams();
    error ZeroReward();
    error ZeroHash();
    error AmountTooLarge(uint256 amount, uint256 max);
    error InvalidWorkers(uint32 minWorkers, uint32 maxWorkers);
    error InvalidSteps(uint64 innerSteps, uint32 stepsPerSegment);
    error InvalidRounds(uint32 rounds);
    error InvalidDuration(uint64 roundDuration);
    error SubJobTooSmall(uint256 subReward);
    error UnknownCollab(uint256 jobId);
    error CollabNotLive(uint256 jobId, CollabStatus status);
    error WrongRoundPhase(uint256 jobId, RoundPhase phase);
    error WrongRound(uint32 round, uint32 current);
    error NotRegisteredSolver(address caller);
    error ExcludedWorker(uint256 jobId, address node);
    error ZeroCount();
    error NotEnoughFreeSlots(uint32 wanted, uint32 free);
    error ThroughputTooLow(uint256 claimed, uint256 needed);
    error SlotCapExceeded(uint32 wouldHold, uint32 cap);
    error NotSlotHolder(uint32 slot, address caller);
    error TooFewWorkers(uint32 held, uint32 minWorkers);
    error RoundNotSettled(uint256 marketJobId);
    error AlreadyPosted(uint256 jobId, uint32 round);
    error NothingPosted(uint256 jobId, uint32 round);
    error OuterWindowClosed(uint64 windowEnd);
    error OuterWindowOpen(uint64 windowEnd);
    error ChallengeLive(uint256 jobId, uint32 round);
    error NoChallenge(uint256 jobId, uint32 round);
    error PosterCannotChallenge();
    error AlreadyChallenged(address challenger);
    error NothingToWithdraw();
    error InvalidDepth(uint8 depth);
    error PipelineFull(uint32 round); // D rounds ahead already, or no round left
    error SubJobNotCommitted(uint256 marketJobId);
    error PipelineUnfunded();
    error NotOrphan(uint256 marketJobId);

    // --- submitter ---

    /// @notice Post a collaborative job, escrowing `reward + verificationBudget` (approve
    ///         first). Ids start at 1. Each sub-job gets reward / (rounds * maxWorkers) and
    ///         verificationBudget / (rounds * maxWorkers); what is left at the end (division
    ///         remainders, cancelled sub-jobs, unpaid verification) is the submitter's.
    function postCollabJob(CollabTerms calldata terms) external returns (uint256 jobId);

    // --- workers ---

    /// @notice A registered solver takes the `count` lowest free slots, effective from the
    ///         next round started. `claimedMilliStepsPerSec` must cover count x the required
    ///         per-slot rate (innerSteps * 1000 / roundDuration). A node whose delivered
    ///         record (`deliveredOf`) is below its claim x (1 - throughputToleranceBps) may
    ///         hold at most max(1, delivered / required) slots of the job; a node with no record
    ///         (no accepted inner run since its last dropped one: a missed deadline or a
    ///         condemned run clears the record) at most one. A node whose inner run in the job
    ///         was condemned is out of it (`ExcludedWorker`).
    function claimSlot(uint256 jobId, uint32 count, uint64 claimedMilliStepsPerSec) external;

    /// @notice The holder frees `slot`; a sub-job already posted for it stays the holder's.
    function leaveSlot(uint256 jobId, uint32 slot) external;

    // --- anyone: rounds ---

    /// @notice Start the current round: round 0 once >= minWorkers slots are held, round r > 0
    ///         once round r - 1's outer state is accepted (accepting it here if it can be).
    ///         First releases the excess slots of nodes that delivered less than they claimed.
    ///         Posts one reserved sub-job per held slot (solveDuration = roundDuration, initial
    ///         state = the round's S_0). Fails the job if its pool cannot fund them (unless
    ///         sub-jobs of rolled-back rounds are unsettled: `PipelineUnfunded`, retry later).
    ///         Pipelined (D > 0), while the base round is not Idle: starts the round after the
    ///         newest started one from its predecessor's posted `nextInitHash`, at most D past
    ///         the base (`PipelineFull`); slots are capped only when nothing is in flight.
    function startRound(uint256 jobId) external;

    /// @notice Settle the current round's sub-jobs through the market: Finalized -> accepted;
    ///         Committed, window over -> finalize (clean -> accepted; condemned -> cancelled,
    ///         dropped, the worker slashed by the market); Claimed past its deadline ->
    ///         reclaim + cancel, dropped; Open past the round deadline -> cancel, dropped.
    ///         Anything still in progress reverts `RoundNotSettled`. Dropped workers lose their
    ///         slot. What the market credits this contract for the round's slashes (missed-
    ///         deadline share, submitter share of a condemned bond) is shared equally by the
    ///         round's accepted workers (all of it to the submitter if none); cancelled escrow
    ///         and unpaid verification budget go back to the pool.
    function settleRound(uint256 jobId) external;

    // --- anyone: outer state ---

    /// @notice Post round `round`'s outer state (after its settlement, nothing posted), with
    ///         `outerBond` (approve first). Accepted once `outerWindow` passed with no live
    ///         challenge (`acceptOuter`). Pipelined, also a candidate (outer + pipeline bond): a
    ///         started, unsettled round whose every sub-job is Committed (`SubJobNotCommitted`), over
    ///         all of them; challengeable at once, a speculative one too, within `outerWindow` from
    ///         its post (never extended when it becomes the base). A live challenge of any
    ///         round in flight holds the base round's settlement (`ChallengeLive`).
    function postOuter(uint256 jobId, uint32 round, bytes32 outerHash, bytes32 nextInitHash) external;

    /// @notice Dispute the posted outer state (the base round's, or pipelined a speculative
    ///         round's candidate) within its window, with `outerBond`: opens an
    ///         OuterJury case (`juryCase`), whose jury is drawn, votes and is tallied there
    ///         (`IOuterJury`). Each address challenges a post once.
    function challengeOuter(uint256 jobId, uint32 round) external;

    /// @notice Anyone, once the case's reveals are over: the OuterJury tallies it (slashing
    ///         silent and minority jurors' unlocked stake, forwarded here for the majority).
    ///         Majority valid: the challenger's bond, half to the majority jurors, half to the
    ///         poster. Majority invalid: the poster's bond, half to the majority jurors, half
    ///         to the challenger (its own bond returned), the post removed (pipelined: the poster's
    ///         pipeline bond refills the pool for the rounds after it, rolled back; reverts
    ///         `ChallengeLive` while a later round's challenge is live). Fewer than quorum
    ///         reveals or a tie: Void, the challenger's bond returned. The slashed juror stake
    ///         goes to the majority (on Void: to the jurors who revealed; burned by the
    ///         OuterJury when none did). Valid and Void leave the post challengeable by
    ///         others for >= outerWindow / 2.
    function resolveOuter(uint256 jobId, uint32 round) external;

    /// @notice Anyone, once the window is over with no live challenge: the poster's bond is
    ///         returned, the next round's S_0 is fixed, and after the last round the job is
    ///         Finished (the pool credited to the submitter).
    function acceptOuter(uint256 jobId, uint32 round) external;

    /// @notice Anyone: settle a sub-job of a rolled-back round (or any other sub-job no round
    ///         owns any more) through the market: Committed past its window -> finalize (the
    ///         worker paid; condemned: cancelled and its worker excluded); Claimed past its
    ///         deadline -> reclaim + cancel; Open -> cancel. What comes back is the pool's.
    function settleOrphan(uint256 marketJobId) external;

    /// @notice Pay out the caller's credit.
    function withdraw() external returns (uint256 amount);

    // --- views ---
    function params() external view returns (Params memory);
    function getCollab(uint256 jobId) external view returns (Collab memory);
    function slotHolders(uint256 jobId) external view returns (address[] memory);
    function getRound(uint256 jobId, uint32 round) external view returns (RoundView memory);
    /// @notice A market job posted by this contract: its collaborative job, round and slot
    ///         (collabJobId 0 for any other job).
    function subJobOf(uint256 marketJobId) external view returns (uint256 collabJobId, uint32 round, uint32 slot);

    /// @notice Sub-jobs of rolled-back rounds not settled yet (`settleOrphan` each).
    function orphansOf(uint256 jobId) external view returns (uint32);
    /// @notice The node's latest delivered throughput (milli-steps/s; 0 = no record).
    /// @notice Was a sub-job of `node` in job `jobId` condemned? Then it may not claim a slot there again.
    function isExcluded(uint256 jobId, address node) external view returns (bool);

    function deliveredOf(address node) external view returns (uint64);
    /// @notice The node's latest claimed throughput (milli-steps/s).
    function claimedOf(address node) external view returns (uint64);
    function collabCount() external view returns (uint256);
    function credits(address account) external view returns (uint256);
    /// @notice Pools + credits + outer bonds held: what the contract owes.
    function totalOwed() external view returns (uint256);
}
