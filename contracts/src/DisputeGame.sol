// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {ReentrancyGuardTransient} from "@openzeppelin/contracts/utils/ReentrancyGuardTransient.sol";
import {IDisputeGame} from "./interfaces/IDisputeGame.sol";
import {DisputeId, JobId} from "./interfaces/Ids.sol";
import {IJobMarket} from "./interfaces/IJobMarket.sol";
import {INodeRegistry} from "./interfaces/INodeRegistry.sol";

/// @title DisputeGame
/// @notice N-way bisection to one training step, then a commit-reveal jury.
/// @dev Game of dispute `id` over steps [lo, hi], loHash / hiHash the states there.
///      The challenger accepts the state at `lo` and disputes the state at `hi`.
///      1. Bisection (n-way dissection, as in Arbitrum's challenge protocol: fewer
///         rounds, so fewer transactions). Each round splits [lo, hi] into
///         `parts = min(fanout, hi - lo)` parts at the points
///         `p_j = lo + (hi - lo) * j / parts` (j = 0..parts; `midSteps(id)` lists
///         p_1..p_{parts-1}). Solver to move: `postMids(id, hashes)`, the state hashes
///         after steps p_1..p_{parts-1}; the game keeps only a commitment to them and the
///         range (`midsRoot`) and emits them in `MidsPosted`. Challenger to move:
///         `choose(id, part, hashes, loHash, hiHash)` with the same hashes and the range's
///         end states: it disputes [p_part, p_part+1] (it accepts the state at p_part and
///         disputes the one at p_part+1). fanout = 2 is plain bisection.
///         Chess clock: each side has
///         `params.clock` seconds for all its moves together; time runs only for the
///         side to move. A move at or after the mover's clock ran out reverts
///         `ClockExpired`; then anyone may call `timeout(id)` and the side to move loses.
///      2. Jury. When hi - lo == 1 the game asks for a jury (phase Drawing) at block Q and
///         snapshots the registry's sortition pool length. After block Q + juryLookahead
///         anyone calls `drawJury(id)`: seed = keccak256(abi.encode(blockhash(Q +
///         juryLookahead), id)), unknown to both parties at their last move and the same
///         whoever sends the draw and whenever; jurors = registry.sortition(seed, jurySize,
///         poolLen, Q, [solver, challenger, the job's attestors]) (stake-weighted, only
///         nodes whose stake did not move after Q, bounded tries). If blockhash(Q +
///         juryLookahead) is no longer readable the request re-arms at the current block.
///         Fewer than `quorum` jurors drawn: the dispute ends Void. Jurors replay step
///         lo -> hi from loHash and vote `valid` iff it yields hiHash (a step the solver
///         cannot serve is invalid). Commit `keccak256(abi.encode(id, juror, valid, salt))`
///         before `commitEnd`, reveal in [commitEnd, revealEnd).
///      3. The last juror's reveal settles the dispute (no further transaction); when some
///         juror stays silent, `resolve(id)` at or after revealEnd does it (afterwards it
///         reverts WrongPhase). Fewer than `quorum` reveals or a tie is Void;
///         otherwise the majority decides (Valid / Invalid). Jurors who did not reveal or
///         voted with the minority lose (solver bond + challenge bond) * jurorSlashBps: what a
///         juror risks grows with what is at stake. That amount is seat-locked in the
///         registry when the jury is drawn (a juror whose free stake cannot cover it is
///         skipped) and slashed or released at settlement, so no claim or unbond after the
///         draw can dodge it.
///      Settlement (all credited, pulled with `withdraw()`):
///      - Valid (jury, or the challenger ran out of clock): the challenger's bond is slashed;
///        jurorShareOfChallengerBondBps -> majority jurors (when a jury decided); of the rest,
///        DELAY_SHARE_BPS is held for the round's solver (`settleDelay`: paid when the round
///        is paid, burned when it is condemned) and the remainder is burned. INVARIANT: a
///        losing challenger's bond reaches the solver only as that held half, and only for
///        a round that was paid, so a cheater's puppet never recycles more than half of it.
///      - Invalid / SolverTimedOut / Void: the challenger's bond is unlocked. The market
///        settles the solver's bond once per round (`IJobMarket.finalize`) and credits the
///        winning Invalid dispute's majority jurors (`majorityOf`) their share there.
///      - jury pool (stake slashed from jurors) is split equally among the majority jurors
///        (on Void: those who revealed); division dust to the first of them; burned when
///        there are none.
///      Conservation: `token.balanceOf(this) == totalOwed()` == unpaid credits.
///      Storage (gas): a dispute is packed into 3 words (`Core` x2, `State`) + 1 hash word
///      (`_word`: the range root, the pending mids' commitment, the jury request, then the
///      jury stream's first word once drawn, the seed being in `JuryDrawn` only; moves pass the hashes it commits to back as calldata); the jury is a bit stream of 163-bit entries (address | revealed |
///      valid | commits; 3 jurors in 2 words, the first of them `_word`), a commitment in its juror's `_lastCommit` word (rewritten
///      dispute after dispute) unless that word is busy (then `_commits`, the entry marked COMMITS); commitEnd / revealEnd / vote counts are
///      derived. `getDispute` rebuilds the `Dispute` view struct from them.
contract DisputeGame is IDisputeGame, ReentrancyGuardTransient {
    using SafeERC20 for IERC20;

    uint256 internal constant BPS = 10_000;

    /// @notice Deployment parameters, fixed for the game's life.
    struct Params {
        uint256 clock; // seconds per side for all its bisection moves
        uint256 jurySize; // jurors drawn per dispute (fewer if not enough eligible verifiers)
        uint256 quorum; // reveals (and drawn jurors) needed for a verdict; 1..jurySize
        uint256 commitWindow; // seconds from the jury draw to commit votes
        uint256 revealWindow; // seconds after the commit window to reveal
        uint256 jurorSlashBps; // of (solver bond + challenge bond), per minority / non-revealing juror
        uint256 jurorShareOfChallengerBondBps; // of a losing challenger's bond, to the majority jurors; rest burned
        uint256 fanout; // parts per bisection round, 2..MAX_FANOUT (2 = halves)
        uint256 juryLookahead; // blocks between the jury request and the block whose hash seeds it
        uint256 clockExtension; // seconds a side to move always has after the other's move (<= clock)
    }

    /// @notice Stored phase; `getDispute` reports Reveal once the commit window is over.
    enum Phase {
        None,
        Bisection,
        Drawing, // waiting for the jury seed block
        Commit,
        Reveal,
        Resolved
    }

    enum Side {
        Solver,
        Challenger
    }

    /// @notice The view form of a dispute (`getDispute`); storage is packed (see `Core`, `State`).
    struct Dispute {
        uint256 jobId;
        uint256 segment;
        address solver;
        address challenger;
        uint256 challengeBond; // locked by the market at open
        uint256 startStep;
        uint256 endStep;
        uint256 lo;
        uint256 hi;
        // Not stored, so not here: loHash / hiHash, the states at lo and hi (in the newest
        // RangeNarrowed, or DisputeOpened before any choose).
        bytes32 rangeRoot; // solver to move: keccak256(abi.encode(loHash, hiHash)) (0 otherwise)
        bytes32 midsRoot; // challenger to move: the pending mids' commitment (see postMids; 0 otherwise)
        Phase phase;
        Side turn;
        uint64 solverClock; // seconds left (as of lastMove)
        uint64 challengerClock;
        uint64 lastMove; // timestamp the side to move started thinking
        uint32 rounds; // bisection steps taken
        bytes32 jurySeed; // always 0: the seed is in `JuryDrawn` (its word holds the jury now)
        uint64 commitEnd;
        uint64 revealEnd;
        uint32 validVotes;
        uint32 invalidVotes;
        bool solverWon; // verdict == Valid
        IJobMarket.Verdict verdict;
        uint64 drawBlock; // while Drawing: the block whose hash seeds the jury
        address[] jury;
        uint256[] midSteps; // p_1..p_{parts-1} of the current range while bisecting
    }

    struct Vote {
        bytes32 commitment;
        bool revealed;
        bool valid;
    }

    /// @notice `getDispute` result: the stored dispute, the phase as of now, clocks as of
    ///         now, and the votes aligned with `dispute.jury`.
    struct DisputeView {
        Dispute dispute;
        Phase phase;
        uint256 solverClockLeft;
        uint256 challengerClockLeft;
        Vote[] votes;
    }

    // --- events ---
    event DisputeOpened(
        uint256 indexed id,
        uint256 indexed jobId,
        uint256 segment,
        address indexed solver,
        address challenger,
        uint256 startStep,
        uint256 endStep,
        bytes32 startHash,
        bytes32 endHash
    );
    event MidsPosted(uint256 indexed id, uint256[] steps, bytes32[] hashes, uint64 solverClockLeft);
    event RangeNarrowed(
        uint256 indexed id, uint256 lo, uint256 hi, bytes32 loHash, bytes32 hiHash, uint64 challengerClockLeft
    );
    event JuryRequested(uint256 indexed id, uint64 drawBlock, uint32 poolLen);
    event JuryDrawn(uint256 indexed id, bytes32 jurySeed, address[] jury, uint64 commitEnd, uint64 revealEnd);
    event VoteCommitted(uint256 indexed id, address juror, bytes32 commitment);
    event VoteRevealed(uint256 indexed id, address juror, bool valid);
    event TimedOut(uint256 indexed id, Side loser);
    event JurorSlashed(uint256 indexed id, address indexed juror, uint256 amount);
    event DisputeResolved(
        uint256 indexed id,
        uint256 indexed jobId,
        IJobMarket.Verdict verdict,
        uint32 validVotes,
        uint32 invalidVotes,
        uint256 slashedBond
    );
    event Burned(uint256 indexed id, uint256 amount);
    /// @notice Of a lost challenge's bond, held for the round's solver (`settleDelay`).
    event DelayCompensationHeld(uint256 indexed id, uint256 indexed jobId, uint32 round, uint256 amount);
    /// @notice The round's held compensation: to its solver (paid round) or burned (condemned).
    event DelayCompensationSettled(uint256 indexed jobId, uint32 round, address solver, uint256 paid, uint256 burned);
    event Credited(address indexed account, uint256 amount);
    event Withdrawn(address indexed account, uint256 amount);

    // --- errors ---
    error Unauthorized(address caller);
    error ZeroAddress();
    error InvalidParams();
    error InvalidRange(uint256 startStep, uint256 endStep);
    error UnknownDispute(uint256 id);
    error WrongPhase(uint256 id, Phase phase);
    error NotYourTurn(address caller);
    error ClockExpired(uint256 id);
    error ClockNotExpired(uint256 id, uint256 expiresAt);
    error ZeroHash();
    error WrongMidCount(uint256 given, uint256 expected);
    error MidsMismatch(bytes32 given, bytes32 posted);
    error NoSuchPart(uint256 part, uint256 parts);
    error NotJuror(address caller);
    error CommitClosed(uint64 commitEnd);
    error RevealNotOpen(uint64 commitEnd, uint64 revealEnd);
    error RevealNotOver(uint64 revealEnd);
    error AlreadyCommitted();
    error NoCommitment();
    error AlreadyRevealed();
    error BadReveal();
    error JuryNotReady(uint64 drawBlock);
    error NothingToWithdraw();
    error NoDelayCompensation(uint256 jobId, uint32 round);
    error RoundNotSettled(uint256 jobId, uint32 round);

    /// @dev Packed storage of a dispute: words 0 and 1. startStep is segment * k (`open`
    ///      checks it); the round is the job's at open (the market's records read it here).
    struct Core {
        address solver;
        uint32 segment;
        uint32 k; // endStep - startStep
        uint32 round;
        address challenger;
        uint64 jobId;
    }

    /// @dev The word every move reads and writes (`_stateWord`, packed by `_store`).
    struct State {
        Phase phase;
        Side turn;
        uint8 rounds; // bisection steps taken
        IJobMarket.Verdict verdict;
        uint32 loOff; // lo - startStep
        uint32 hiOff; // hi - startStep
        uint48 lastMove; // timestamp the side to move started thinking; the jury draw time after it
        uint48 solverClock; // seconds left (as of lastMove)
        uint48 challengerClock;
    }

    uint256 internal constant REVEALED = 1 << 160;
    uint256 internal constant VALID = 1 << 161;
    uint256 internal constant NOT_FOUND = type(uint256).max;
    /// @dev The juror's commitment is in `_commits` (not `_lastCommit`).
    uint256 internal constant COMMITS = 1 << 162;
    uint256 internal constant ENTRY_BITS = 163;
    uint256 internal constant ENTRY_MASK = (1 << 163) - 1;
    /// @dev Bounds the calldata and event of one move.
    uint256 internal constant MAX_FANOUT = 64;
    uint256 internal constant MAX_JURY = 15;
    /// @dev Rounds a range of up to 2^32 steps can take (fanout >= 2): bounds the extensions.
    uint256 internal constant MAX_ROUNDS = 32;
    /// @dev Of a lost challenge's bond after the jurors' share: held for the delayed solver
    ///      (issue 30, "delay is priced"), paid once its round is paid and burned when the
    ///      round is condemned, so a cheater's puppets get nothing back; the rest is burned
    ///      either way, so even a cheater that escapes loses half of every puppet bond.
    uint256 internal constant DELAY_SHARE_BPS = 5_000;
    /// @dev Where burned tokens go: nobody holds its key.
    address internal constant BURN = 0x000000000000000000000000000000000000dEaD;

    IERC20 public immutable token;
    INodeRegistry public immutable registry;
    IJobMarket public immutable market;

    uint256 internal immutable _clock;
    uint256 internal immutable _jurySize;
    uint256 internal immutable _quorum;
    uint256 internal immutable _commitWindow;
    uint256 internal immutable _revealWindow;
    uint256 internal immutable _jurorSlashBps;
    uint256 internal immutable _jurorShareOfChallengerBondBps;
    uint256 internal immutable _fanout;
    uint256 internal immutable _juryLookahead;
    uint256 internal immutable _clockExtension;
    /// @dev market.params().challengeBond, fixed for the market's life: what every dispute locked.
    uint256 internal immutable _challengeBond;

    /// @dev disputeCount + 1 and totalCredits + 1: never zero, so no write starts a fresh word.
    uint256 internal _nextId = 1;
    uint256 internal _creditsPlusOne = 1;
    /// @dev Per account: credit + 1 once ever credited, so a drained account's next credit
    ///      rewrites a dirty word; `credits` returns the real amount.
    mapping(address => uint256) internal _accountCreditsPlusOne;
    uint256 public totalBurned;
    /// @dev (jobId << 32 | round) => delay compensation held for that round's solver.
    mapping(uint256 => uint256) internal _delayHeld;
    /// @notice Sum of `_delayHeld`: tokens the game holds for rounds not yet settled.
    uint256 public totalDelayHeld;

    mapping(uint256 => Core) internal _core;
    mapping(uint256 => uint256) internal _stateWord; // State, packed: see _store

    /// @dev One word per dispute: while bisecting, solver to move, keccak256(abi.encode(loHash,
    ///      hiHash)) (the range root); challenger to move, keccak256(abi.encode(rangeRoot,
    ///      keccak256(abi.encodePacked(mids)))); then the jury request (block | poolLen << 64),
    ///      then the jury's first word (`_juryWord`). Moves pass the hashes back as calldata,
    ///      checked against it.
    mapping(uint256 => bytes32) internal _word;
    /// @dev The jury as a bit stream over words 0, 1, ...: entry i (address | REVEALED | VALID,
    ///      ENTRY_BITS wide) at bits [i * ENTRY_BITS, (i + 1) * ENTRY_BITS), so 3 jurors take
    ///      2 words. Word 0 is `_word[id]` (a rewrite of the request's dirty word, not a fresh
    ///      one: the seed is in `JuryDrawn` only), word w > 0 is `_jury[id][w - 1]`. The jury
    ///      ends at the first entry with a zero address.
    mapping(uint256 => mapping(uint256 => uint256)) internal _jury;
    /// @dev A juror's vote commitment where it cannot be kept in `_lastCommit` (its word
    ///      there holds the commitment of another dispute still in its jury stage).
    mapping(uint256 => mapping(address => bytes32)) internal _commits;
    /// @dev Per juror: id << 216 | revealEnd << 176 | the low 176 bits of its latest
    ///      commitment. Binding: to reveal either vote a juror needs two (valid, salt) openings
    ///      whose hashes agree in 176 bits, ~2^88 keccak by the birthday bound, and the preimage
    ///      names the dispute id and the juror, so that work is per seat and cannot be reused
    ///      (a second preimage for a commitment already sent is ~2^176). One word per juror, rewritten
    ///      by each commit once that dispute's reveal stage is over (a dirty word: ~5k gas
    ///      where a fresh one per vote costs 22.1k); a commit before then goes whole to
    ///      `_commits`, its jury entry marked COMMITS. So a vote past its reveal stage can
    ///      read as uncommitted once a later one replaced it (VoteCommitted has them all).
    mapping(address => uint256) internal _lastCommit;
    uint256 internal constant LOW176 = (1 << 176) - 1;

    constructor(IERC20 token_, INodeRegistry registry_, IJobMarket market_, Params memory params_) {
        if (address(token_) == address(0) || address(registry_) == address(0) || address(market_) == address(0)) {
            revert ZeroAddress();
        }
        IJobMarket.Params memory mp = market_.params();
        if (
            params_.clock == 0 || params_.clock > 365 days || params_.jurySize == 0 || params_.jurySize > MAX_JURY
                || params_.quorum == 0 || params_.quorum > params_.jurySize || params_.commitWindow == 0
                || params_.revealWindow == 0 || params_.commitWindow > 365 days || params_.revealWindow > 365 days
                || params_.jurorSlashBps > BPS || params_.jurorShareOfChallengerBondBps > BPS
                || params_.fanout < 2 || params_.fanout > MAX_FANOUT || params_.juryLookahead == 0
                || params_.juryLookahead > 128 || params_.clockExtension > params_.clock
                // INVARIANT: stake stays slashable for longer than a window plus a whole dispute,
                // so no attestor or juror can unbond and walk away from a slash it has coming.
                || registry_.unbondDelay()
                    <= mp.verificationWindow + mp.disputeGrace + 2 * params_.clock
                        + 2 * MAX_ROUNDS * params_.clockExtension + params_.commitWindow + params_.revealWindow
        ) revert InvalidParams();
        token = token_;
        registry = registry_;
        market = market_;
        _clock = params_.clock;
        _jurySize = params_.jurySize;
        _quorum = params_.quorum;
        _commitWindow = params_.commitWindow;
        _revealWindow = params_.revealWindow;
        _jurorSlashBps = params_.jurorSlashBps;
        _jurorShareOfChallengerBondBps = params_.jurorShareOfChallengerBondBps;
        _fanout = params_.fanout;
        _juryLookahead = params_.juryLookahead;
        _clockExtension = params_.clockExtension;
        _challengeBond = mp.challengeBond;
    }

    // --- market ---

    /// @inheritdoc IDisputeGame
    function open(
        JobId job,
        uint256 segment,
        uint32 round,
        address solver,
        address challenger,
        uint256 startStep,
        uint256 endStep,
        bytes32 startHash,
        bytes32 endHash
    ) external returns (DisputeId) {
        uint256 jobId = JobId.unwrap(job);
        // INVARIANT: only the market opens disputes (it proved the leaves and locked the bond).
        if (msg.sender != address(market)) revert Unauthorized(msg.sender);
        if (
            endStep <= startStep || endStep > type(uint64).max || endStep - startStep > type(uint32).max
                || jobId > type(uint64).max || segment > type(uint32).max
                || startStep != segment * (endStep - startStep)
        ) revert InvalidRange(startStep, endStep);
        // INVARIANT: dispute ids are unique: never reused.
        uint256 id = _nextId++;
        uint256 k = endStep - startStep;
        _core[id] = Core(solver, uint32(segment), uint32(k), round, challenger, uint64(jobId));
        _word[id] = keccak256(abi.encode(startHash, endHash));
        State memory s;
        s.phase = Phase.Bisection;
        s.hiOff = uint32(k);
        s.lastMove = uint48(block.timestamp);
        s.solverClock = uint48(_clock);
        s.challengerClock = uint48(_clock);
        emit DisputeOpened(id, jobId, segment, solver, challenger, startStep, endStep, startHash, endHash);
        if (k == 1) _requestJury(id, s);
        _store(id, s);
        return DisputeId.wrap(id);
    }

    // --- bisection ---

    /// @notice Solver: the state hashes after steps `midSteps(id)` (p_1..p_{parts-1}).
    function postMids(DisputeId disputeId, bytes32[] calldata hashes) external {
        uint256 id = DisputeId.unwrap(disputeId);
        State memory s = _bisecting(id);
        Core storage c = _core[id];
        if (s.turn != Side.Solver || msg.sender != c.solver) revert NotYourTurn(msg.sender);
        uint256 parts = _parts(s);
        if (hashes.length != parts - 1) revert WrongMidCount(hashes.length, parts - 1);
        for (uint256 j; j < hashes.length; ++j) {
            if (hashes[j] == bytes32(0)) revert ZeroHash();
        }
        uint48 left = _charge(id, s, s.solverClock);
        s.solverClock = left;
        s.turn = Side.Challenger;
        // As Optimism's FaultDisputeGame: a move near the end never leaves the other side
        // less than the extension to answer it.
        if (s.challengerClock < _clockExtension) s.challengerClock = uint48(_clockExtension);
        // Only a commitment to the range and the mids is stored (over the range root, one
        // word): `choose` gets the hashes back as calldata and checks them against it.
        _word[id] = keccak256(abi.encode(_word[id], keccak256(abi.encodePacked(hashes))));
        _store(id, s);
        emit MidsPosted(id, _midSteps(_startOf(c), s, parts), hashes, left);
    }

    /// @notice Challenger: dispute part `part` of the range, [p_part, p_part+1]; `hashes`
    ///         are the solver's posted mids (from `MidsPosted`), `loHash` / `hiHash` the
    ///         states at the range's ends (from the last `RangeNarrowed`, or `DisputeOpened`).
    function choose(DisputeId disputeId, uint256 part, bytes32[] calldata hashes, bytes32 loHash, bytes32 hiHash)
        external
    {
        uint256 id = DisputeId.unwrap(disputeId);
        State memory s = _bisecting(id);
        if (s.turn != Side.Challenger || msg.sender != _core[id].challenger) revert NotYourTurn(msg.sender);
        uint256 parts = _parts(s);
        if (part >= parts) revert NoSuchPart(part, parts);
        bytes32 posted = _word[id];
        bytes32 root =
            keccak256(abi.encode(keccak256(abi.encode(loHash, hiHash)), keccak256(abi.encodePacked(hashes))));
        // INVARIANT: the new range's end states are exactly ones the solver posted (or the
        // range's own ends, which the market proved or an earlier round posted).
        if (root != posted) revert MidsMismatch(root, posted);
        s.challengerClock = _charge(id, s, s.challengerClock);
        unchecked {
            uint256 span = s.hiOff - s.loOff;
            uint32 newLo = uint32(s.loOff + span * part / parts);
            uint32 newHi = uint32(s.loOff + span * (part + 1) / parts);
            s.loOff = newLo;
            s.hiOff = newHi;
            s.rounds += 1;
        }
        s.turn = Side.Solver;
        if (s.solverClock < _clockExtension) s.solverClock = uint48(_clockExtension);
        _narrowed(id, s, part == 0 ? loHash : hashes[part - 1], part == parts - 1 ? hiHash : hashes[part]);
    }

    /// @dev The end of `choose`: the new range's event and word (the jury request instead
    ///      once one step is left), then `s`.
    function _narrowed(uint256 id, State memory s, bytes32 newLoHash, bytes32 newHiHash) internal {
        uint256 start = _startOf(_core[id]);
        unchecked {
            emit RangeNarrowed(id, start + s.loOff, start + s.hiOff, newLoHash, newHiHash, s.challengerClock);
        }
        if (s.hiOff - s.loOff == 1) _requestJury(id, s);
        else _word[id] = keccak256(abi.encode(newLoHash, newHiHash));
        _store(id, s);
    }

    /// @notice Anyone: the side to move ran out of clock and loses.
    function timeout(DisputeId disputeId) external nonReentrant {
        uint256 id = DisputeId.unwrap(disputeId);
        State memory s = _bisecting(id);
        uint256 left = s.turn == Side.Solver ? s.solverClock : s.challengerClock;
        // INVARIANT: exactly one of {move, timeout} is possible at any time.
        if (block.timestamp < s.lastMove + left) revert ClockNotExpired(id, s.lastMove + left);
        emit TimedOut(id, s.turn);
        if (s.turn == Side.Solver) s.solverClock = 0;
        else s.challengerClock = 0;
        IJobMarket.Verdict v = s.turn == Side.Challenger ? IJobMarket.Verdict.Valid : IJobMarket.Verdict.SolverTimedOut;
        uint256 slashedBond = _settle(id, s, v, 0, new address[](0));
        emit DisputeResolved(id, _core[id].jobId, v, 0, 0, slashedBond);
    }

    // --- jury ---

    /// @notice Anyone, once block Q + juryLookahead is mined: draw the jury from its hash.
    function drawJury(DisputeId disputeId) external nonReentrant {
        uint256 id = DisputeId.unwrap(disputeId);
        State memory s = _load(id);
        if (s.phase == Phase.None) revert UnknownDispute(id);
        if (s.phase != Phase.Drawing) revert WrongPhase(id, s.phase);
        uint256 req = uint256(_word[id]);
        uint64 requestBlock = uint64(req);
        uint64 drawBlock = requestBlock + uint64(_juryLookahead);
        if (block.number <= drawBlock) revert JuryNotReady(drawBlock);
        bytes32 bh = blockhash(drawBlock);
        if (bh == bytes32(0)) {
            // Nobody drew while the hash was readable (256 blocks): ask again from now on.
            _requestJury(id, s);
            _store(id, s);
            return;
        }
        Core memory c = _core[id];
        bytes32 seed = keccak256(abi.encode(bh, id));
        // INVARIANT: a seated juror's slash is locked from the draw to `resolve` (a quorum's
        // seats are locked, or none): nothing it does meanwhile takes it out of reach.
        address[] memory jury = _drawSeats(id, c, seed, req);
        if (jury.length < _quorum) {
            _word[id] = 0; // no jury: its stream starts here (see `_juryWord`)
            // Too few eligible jurors: an explicit outcome, nobody wins or pays.
            emit JuryDrawn(id, seed, jury, 0, 0);
            _settle(id, s, IJobMarket.Verdict.Void, 0, new address[](0));
            emit DisputeResolved(id, c.jobId, IJobMarket.Verdict.Void, 0, 0, 0);
            return;
        }
        _storeJury(id, jury);
        s.lastMove = uint48(block.timestamp);
        s.phase = Phase.Commit;
        _store(id, s);
        uint64 commitEnd = uint64(block.timestamp + _commitWindow);
        emit JuryDrawn(id, seed, jury, commitEnd, uint64(commitEnd + _revealWindow));
    }

    function commitVote(DisputeId disputeId, bytes32 commitment) external {
        uint256 id = DisputeId.unwrap(disputeId);
        State memory s = _inJury(id);
        (uint256 i, uint256 e) = _findJuror(id, msg.sender);
        if (i == NOT_FOUND) revert NotJuror(msg.sender);
        uint64 commitEnd = uint64(s.lastMove + _commitWindow);
        if (block.timestamp >= commitEnd) revert CommitClosed(commitEnd);
        if (commitment == bytes32(0)) revert ZeroHash();
        uint256 last = _lastCommit[msg.sender];
        // INVARIANT: one commitment per juror and dispute, wherever it is kept.
        if (last >> 216 == id || e & COMMITS != 0) revert AlreadyCommitted();
        // The word is free once the reveal stage of the dispute it holds is over (nothing
        // reads a commitment then); ids below 2^40 fit it.
        if (id < (1 << 40) && block.timestamp >= uint40(last >> 176)) {
            _lastCommit[msg.sender] =
                (id << 216) | (uint256(commitEnd + _revealWindow) << 176) | (uint256(commitment) & LOW176);
        } else {
            _commits[id][msg.sender] = commitment;
            _setBit(id, i * ENTRY_BITS + 162); // COMMITS
        }
        emit VoteCommitted(id, msg.sender, commitment);
    }

    /// @dev The last juror's reveal settles the dispute (as `resolve`): once every juror
    ///      revealed, nothing can change the count, and the tally in the same transaction
    ///      spares a `resolve` transaction and its cold reads.
    function revealVote(DisputeId disputeId, bool valid, bytes32 salt) external nonReentrant {
        uint256 id = DisputeId.unwrap(disputeId);
        State memory s = _inJury(id);
        (uint256 i, uint256 e) = _findJuror(id, msg.sender);
        if (i == NOT_FOUND) revert NotJuror(msg.sender);
        uint64 commitEnd = uint64(s.lastMove + _commitWindow);
        uint64 revealEnd = uint64(commitEnd + _revealWindow);
        if (block.timestamp < commitEnd || block.timestamp >= revealEnd) revert RevealNotOpen(commitEnd, revealEnd);
        bytes32 commitment = _commitmentOf(id, msg.sender, e);
        if (commitment == bytes32(0)) revert NoCommitment();
        if (e & REVEALED != 0) revert AlreadyRevealed();
        // INVARIANT: a reveal must open the commitment made before anyone could see votes
        // (its low 176 bits where `_lastCommit` keeps it).
        uint256 opened = uint256(keccak256(abi.encode(id, msg.sender, valid, salt)));
        if ((e & COMMITS != 0 ? opened : opened & LOW176) != uint256(commitment)) revert BadReveal();
        _setBit(id, i * ENTRY_BITS + 160); // REVEALED
        if (valid) _setBit(id, i * ENTRY_BITS + 161); // VALID
        emit VoteRevealed(id, msg.sender, valid);
        uint256 n = _jurySize;
        for (uint256 k; k < n; ++k) {
            uint256 entry = _entry(id, k);
            if (entry == 0) break; // the end of a smaller jury
            if (entry & REVEALED == 0) return;
        }
        _resolve(id, s, _juryEntries(id));
    }

    /// @notice Anyone, at or after revealEnd: count votes, slash absent / minority jurors, settle.
    ///         (Once every juror revealed, the last reveal did it already.)
    function resolve(DisputeId disputeId) external nonReentrant {
        uint256 id = DisputeId.unwrap(disputeId);
        State memory s = _inJury(id);
        uint64 revealEnd = uint64(s.lastMove + _commitWindow + _revealWindow);
        if (block.timestamp < revealEnd) revert RevealNotOver(revealEnd);
        _resolve(id, s, _juryEntries(id));
    }

    function _resolve(uint256 id, State memory s, uint256[] memory entries) internal {
        (uint32 validVotes, uint32 invalidVotes) = _count(entries);
        IJobMarket.Verdict v;
        // INVARIANT: no verdict without a quorum and a strict majority; silence decides nothing.
        if (validVotes + invalidVotes < _quorum || validVotes == invalidVotes) v = IJobMarket.Verdict.Void;
        else v = validVotes > invalidVotes ? IJobMarket.Verdict.Valid : IJobMarket.Verdict.Invalid;
        (uint256 pool, address[] memory majority) = _slashMinority(id, entries, v);
        uint256 slashedBond = _settle(id, s, v, pool, majority);
        emit DisputeResolved(id, _core[id].jobId, v, validVotes, invalidVotes, slashedBond);
    }

    /// @notice Anyone, once the round settled: its held delay compensation (half of what its
    ///         lost challenges' bonds left after the jurors) to its solver when the round was
    ///         paid (`finalize`), burned when it was condemned.
    function settleDelay(JobId job, uint32 round) external nonReentrant {
        uint256 jobId = JobId.unwrap(job);
        uint256 key = (jobId << 32) | round;
        uint256 amount = _delayHeld[key];
        if (amount == 0 || jobId > type(uint64).max) revert NoDelayCompensation(jobId, round);
        IJobMarket.Job memory j = market.getJob(JobId.wrap(jobId));
        bool paid = j.round == round && j.status == IJobMarket.JobStatus.Finalized;
        if (!paid && !market.roundInfo(JobId.wrap(jobId), round).settled) revert RoundNotSettled(jobId, round);
        _delayHeld[key] = 0;
        totalDelayHeld -= amount;
        if (paid) {
            _creditsPlusOne += _credit(j.solver, amount);
            emit DelayCompensationSettled(jobId, round, j.solver, amount, 0);
        } else {
            _burn(0, amount);
            emit DelayCompensationSettled(jobId, round, address(0), 0, amount);
        }
    }

    /// @notice Delay compensation held for round `round` of job `jobId`.
    function delayHeld(JobId job, uint32 round) external view returns (uint256) {
        uint256 jobId = JobId.unwrap(job);
        return jobId > type(uint64).max ? 0 : _delayHeld[(jobId << 32) | round];
    }

    /// @inheritdoc IDisputeGame
    function majorityOf(DisputeId disputeId) external view returns (address[] memory majority) {
        uint256 id = DisputeId.unwrap(disputeId);
        State memory s = _load(id);
        if (s.phase != Phase.Resolved || s.verdict != IJobMarket.Verdict.Invalid) return majority;
        uint256[] memory entries = _juryEntries(id);
        majority = new address[](entries.length);
        uint256 n;
        for (uint256 i; i < entries.length; ++i) {
            if (entries[i] & (REVEALED | VALID) == REVEALED) majority[n++] = address(uint160(entries[i]));
        }
        assembly ("memory-safe") {
            mstore(majority, n)
        }
    }

    function withdraw() external nonReentrant returns (uint256 amount) {
        uint256 c = _accountCreditsPlusOne[msg.sender];
        if (c <= 1) revert NothingToWithdraw();
        amount = c - 1;
        _accountCreditsPlusOne[msg.sender] = 1;
        _creditsPlusOne -= amount;
        token.safeTransfer(msg.sender, amount);
        emit Withdrawn(msg.sender, amount);
    }

    // --- views ---

    function credits(address account) external view returns (uint256) {
        uint256 c = _accountCreditsPlusOne[account];
        return c == 0 ? 0 : c - 1;
    }

    function params() external view returns (Params memory) {
        return Params({
            clock: _clock,
            jurySize: _jurySize,
            quorum: _quorum,
            commitWindow: _commitWindow,
            revealWindow: _revealWindow,
            jurorSlashBps: _jurorSlashBps,
            jurorShareOfChallengerBondBps: _jurorShareOfChallengerBondBps,
            fanout: _fanout,
            juryLookahead: _juryLookahead,
            clockExtension: _clockExtension
        });
    }

    /// @notice Disputes opened so far (ids 1..disputeCount).
    function disputeCount() external view returns (uint256) {
        return _nextId - 1;
    }

    /// @notice Credited, not yet withdrawn.
    function totalCredits() public view returns (uint256) {
        return _creditsPlusOne - 1;
    }

    function getDispute(DisputeId disputeId) external view returns (DisputeView memory out) {
        uint256 id = DisputeId.unwrap(disputeId);
        State memory s = _load(id);
        Core memory c = _core[id];
        Dispute memory d = out.dispute;
        d.jobId = c.jobId;
        d.segment = c.segment;
        d.solver = c.solver;
        d.challenger = c.challenger;
        if (s.phase != Phase.None) d.challengeBond = _challengeBond;
        uint256 start = uint256(c.segment) * c.k;
        d.startStep = start;
        d.endStep = start + c.k;
        d.lo = start + s.loOff;
        d.hi = start + s.hiOff;
        bytes32 third = _word[id];
        if (s.phase == Phase.Bisection) {
            if (s.turn == Side.Challenger) d.midsRoot = third;
            else d.rangeRoot = third;
            d.midSteps = _midSteps(start, s, _parts(s));
        }
        d.phase = s.phase;
        d.turn = s.turn;
        d.solverClock = s.solverClock;
        d.challengerClock = s.challengerClock;
        d.lastMove = s.lastMove;
        d.rounds = s.rounds;
        if (_drawn(s)) {
            // d.jurySeed stays 0: the seed is in JuryDrawn, not stored (`_word` holds the jury).
            d.commitEnd = uint64(s.lastMove + _commitWindow);
            d.revealEnd = uint64(d.commitEnd + _revealWindow);
        }
        d.verdict = s.verdict;
        d.solverWon = s.verdict == IJobMarket.Verdict.Valid;
        if (s.phase == Phase.Drawing) d.drawBlock = uint64(uint256(third)) + uint64(_juryLookahead);
        // Before the draw the jury's first word (`_word`) holds the range or the request.
        uint256[] memory entries = _drawn(s) ? _juryEntries(id) : new uint256[](0);
        d.jury = new address[](entries.length);
        out.votes = new Vote[](entries.length);
        for (uint256 i; i < entries.length; ++i) {
            uint256 e = entries[i];
            address a = address(uint160(e));
            d.jury[i] = a;
            out.votes[i] = Vote(_commitmentOf(id, a, e), e & REVEALED != 0, e & VALID != 0);
            if (e & REVEALED != 0) {
                if (e & VALID != 0) ++d.validVotes;
                else ++d.invalidVotes;
            }
        }
        out.phase = s.phase;
        if (s.phase == Phase.Commit && block.timestamp >= d.commitEnd) out.phase = Phase.Reveal;
        out.solverClockLeft = s.solverClock;
        out.challengerClockLeft = s.challengerClock;
        if (s.phase == Phase.Bisection) {
            uint256 elapsed = block.timestamp - s.lastMove;
            if (s.turn == Side.Solver) out.solverClockLeft = elapsed >= s.solverClock ? 0 : s.solverClock - elapsed;
            else out.challengerClockLeft = elapsed >= s.challengerClock ? 0 : s.challengerClock - elapsed;
        }
    }

    /// @inheritdoc IDisputeGame
    function challengerOf(DisputeId disputeId) external view returns (address) {
        uint256 id = DisputeId.unwrap(disputeId);
        return _core[id].challenger;
    }

    /// @inheritdoc IDisputeGame
    function refOf(DisputeId disputeId)
        external
        view
        returns (uint256 jobId, uint256 segment, address challenger, uint32 round, bool resolved, IJobMarket.Verdict verdict)
    {
        uint256 id = DisputeId.unwrap(disputeId);
        Core storage c = _core[id];
        State memory s = _load(id);
        return (c.jobId, c.segment, c.challenger, c.round, s.phase == Phase.Resolved, s.verdict);
    }

    function voteOf(DisputeId disputeId, address juror) external view returns (Vote memory v) {
        uint256 id = DisputeId.unwrap(disputeId);
        (uint256 i, uint256 e) = _drawn(_load(id)) ? _findJuror(id, juror) : (NOT_FOUND, 0);
        if (i != NOT_FOUND) {
            v.commitment = _commitmentOf(id, juror, e);
            v.revealed = e & REVEALED != 0;
            v.valid = e & VALID != 0;
        }
    }

    function isJuror(DisputeId disputeId, address account) external view returns (bool) {
        uint256 id = DisputeId.unwrap(disputeId);
        if (!_drawn(_load(id))) return false;
        (uint256 i,) = _findJuror(id, account);
        return i != NOT_FOUND;
    }

    /// @notice Steps p_1..p_{parts-1} whose states the solver posts this round (empty
    ///         once bisection is over).
    function midSteps(DisputeId disputeId) external view returns (uint256[] memory) {
        uint256 id = DisputeId.unwrap(disputeId);
        State memory s = _load(id);
        if (s.phase != Phase.Bisection) return new uint256[](0);
        return _midSteps(_startOf(_core[id]), s, _parts(s));
    }

    /// @notice Unpaid credits and held delay compensation: what the game owes.
    function totalOwed() external view returns (uint256) {
        return totalCredits() + totalDelayHeld;
    }

    // --- internals ---

    /// @dev The commitment of `juror` (jury entry `e`) in dispute `id`: whole from `_commits`
    ///      (COMMITS), else the low 176 bits `_lastCommit` keeps (0: none kept).
    function _commitmentOf(uint256 id, address juror, uint256 e) internal view returns (bytes32) {
        if (e & COMMITS != 0) return _commits[id][juror];
        uint256 last = _lastCommit[juror];
        return last >> 216 == id ? bytes32(last & LOW176) : bytes32(0);
    }

    function _load(uint256 id) internal view returns (State memory s) {
        uint256 w = _stateWord[id];
        s.phase = Phase(uint8(w));
        s.turn = Side(uint8(w >> 8));
        s.rounds = uint8(w >> 16);
        s.verdict = IJobMarket.Verdict(uint8(w >> 40));
        s.loOff = uint32(w >> 48);
        s.hiOff = uint32(w >> 80);
        s.lastMove = uint48(w >> 112);
        s.solverClock = uint48(w >> 160);
        s.challengerClock = uint48(w >> 208);
    }

    function _store(uint256 id, State memory s) internal {
        _stateWord[id] = uint256(uint8(s.phase)) | (uint256(uint8(s.turn)) << 8) | (uint256(s.rounds) << 16)
            | (uint256(uint8(s.verdict)) << 40)
            | (uint256(s.loOff) << 48) | (uint256(s.hiOff) << 80) | (uint256(s.lastMove) << 112)
            | (uint256(s.solverClock) << 160) | (uint256(s.challengerClock) << 208);
    }

    /// @dev The segment's first step: segment * k (`open` checked it).
    function _startOf(Core storage c) internal view returns (uint256) {
        return uint256(c.segment) * c.k;
    }

    function _parts(State memory s) internal view returns (uint256) {
        uint256 span = s.hiOff - s.loOff;
        return span < _fanout ? span : _fanout;
    }

    function _midSteps(uint256 start, State memory s, uint256 parts) internal pure returns (uint256[] memory steps) {
        steps = new uint256[](parts - 1);
        unchecked {
            uint256 lo = start + s.loOff;
            uint256 span = s.hiOff - s.loOff;
            for (uint256 j = 1; j < parts; ++j) {
                steps[j - 1] = lo + span * j / parts;
            }
        }
    }

    function _bisecting(uint256 id) internal view returns (State memory s) {
        s = _load(id);
        if (s.phase == Phase.None) revert UnknownDispute(id);
        if (s.phase != Phase.Bisection) revert WrongPhase(id, s.phase);
    }

    function _inJury(uint256 id) internal view returns (State memory s) {
        s = _load(id);
        if (s.phase == Phase.None) revert UnknownDispute(id);
        if (s.phase != Phase.Commit) revert WrongPhase(id, s.phase);
    }

    /// @dev The jury was drawn (or none could be: an empty stream): the range is one step and
    ///      bisection is over. Only then is `_word` the jury's first word (`_juryWord`).
    function _drawn(State memory s) internal pure returns (bool) {
        return s.phase != Phase.None && s.phase != Phase.Bisection && s.phase != Phase.Drawing
            && s.hiOff - s.loOff == 1;
    }

    function _findJuror(uint256 id, address a) internal view returns (uint256, uint256) {
        uint256 n = _jurySize;
        for (uint256 i; i < n; ++i) {
            uint256 e = _entry(id, i);
            if (e == 0) break;
            if (address(uint160(e)) == a) return (i, e);
        }
        return (NOT_FOUND, 0);
    }

    function _juryEntries(uint256 id) internal view returns (uint256[] memory entries) {
        uint256 n = _jurySize;
        entries = new uint256[](n);
        uint256 got;
        for (; got < n; ++got) {
            uint256 e = _entry(id, got);
            if (e == 0) break;
            entries[got] = e;
        }
        assembly ("memory-safe") {
            mstore(entries, got)
        }
    }

    /// @dev Jury entry i of the bit stream (it may straddle two words).
    function _entry(uint256 id, uint256 i) internal view returns (uint256 e) {
        unchecked {
            uint256 bit = i * ENTRY_BITS;
            uint256 w = bit >> 8;
            uint256 o = bit & 255;
            e = _juryWord(id, w) >> o;
            if (o + ENTRY_BITS > 256) e |= _juryWord(id, w + 1) << (256 - o);
            e &= ENTRY_MASK;
        }
    }

    /// @dev Word `w` of dispute `id`'s jury stream: `_word[id]`, then `_jury[id][w - 1]`.
    function _juryWord(uint256 id, uint256 w) internal view returns (uint256) {
        unchecked {
            return w == 0 ? uint256(_word[id]) : _jury[id][w - 1];
        }
    }

    function _setJuryWord(uint256 id, uint256 w, uint256 v) internal {
        unchecked {
            if (w == 0) _word[id] = bytes32(v);
            else _jury[id][w - 1] = v;
        }
    }

    function _setBit(uint256 id, uint256 bit) internal {
        uint256 w = bit >> 8;
        _setJuryWord(id, w, _juryWord(id, w) | (uint256(1) << (bit & 255)));
    }

    function _count(uint256[] memory entries) internal pure returns (uint32 validVotes, uint32 invalidVotes) {
        for (uint256 i; i < entries.length; ++i) {
            uint256 e = entries[i];
            if (e & REVEALED != 0) {
                if (e & VALID != 0) ++validVotes;
                else ++invalidVotes;
            }
        }
    }

    /// @dev Slash jurors who did not reveal or voted with the minority (on Void: who did not
    ///      reveal) from their seats and release the others' seats; the others are the
    ///      majority. The cut scales with the stakes of the dispute (the job's bond is fixed
    ///      while a dispute of its round is live, so it is the amount `drawJury` locked).
    function _slashMinority(uint256 id, uint256[] memory entries, IJobMarket.Verdict v)
        internal
        returns (uint256 pool, address[] memory majority)
    {
        uint256 n = entries.length;
        uint256 mask = v == IJobMarket.Verdict.Void ? REVEALED : REVEALED | VALID;
        uint256 want = v == IJobMarket.Verdict.Invalid ? REVEALED : mask;
        address[] memory jury = new address[](n);
        majority = new address[](n);
        uint256 m;
        uint256 losers;
        for (uint256 i; i < n; ++i) {
            uint256 e = entries[i];
            address a = address(uint160(e));
            jury[i] = a;
            if (e & mask == want) majority[m++] = a;
            else losers |= uint256(1) << i;
        }
        assembly ("memory-safe") {
            mstore(majority, m)
        }
        uint256 cut = _jurorCut(id);
        if (cut == 0) return (0, majority);
        uint256[] memory slashed = registry.closeSeats(jury, cut, losers, address(this));
        for (uint256 i; i < n; ++i) {
            if ((losers >> i) & 1 == 0) continue;
            pool += slashed[i];
            emit JurorSlashed(id, jury[i], slashed[i]);
        }
    }

    function _jurorCut(uint256 id) internal view returns (uint256) {
        (, uint256 bond) = market.settlementOf(JobId.wrap(_core[id].jobId));
        return (bond + _challengeBond) * _jurorSlashBps / BPS;
    }

    /// @dev Charge the mover the time since lastMove; reverts when its clock ran out.
    function _charge(uint256 id, State memory s, uint48 left) internal view returns (uint48) {
        uint256 elapsed = block.timestamp - s.lastMove;
        // INVARIANT: a late move cannot steal a win the other side can already claim by timeout.
        if (elapsed >= left) revert ClockExpired(id);
        s.lastMove = uint48(block.timestamp);
        return uint48(left - elapsed);
    }

    /// @dev Caller writes `s` back. The jury seed is a block hash after this one, and the
    ///      pool is snapshotted now: neither party's later move or timing can steer it.
    function _requestJury(uint256 id, State memory s) internal {
        uint32 poolLen = uint32(registry.snapshot());
        _word[id] = bytes32(uint256(block.number) | (uint256(poolLen) << 64));
        s.phase = Phase.Drawing;
        s.lastMove = uint48(block.timestamp);
        emit JuryRequested(id, uint64(block.number + _juryLookahead), poolLen);
    }

    /// @dev The jury of request `req` (block | poolLen << 64), its seats locked at the cut.
    function _drawSeats(uint256 id, Core memory c, bytes32 seed, uint256 req) internal returns (address[] memory) {
        return registry.drawSeats(
            seed, _jurySize, uint32(req >> 64), uint64(req), _juryExclusions(c), _jurorCut(id), _quorum
        );
    }

    /// @dev The parties and the job's attestors never judge the dispute.
    function _juryExclusions(Core memory c) internal view returns (address[] memory exclude) {
        address[] memory atts = market.attestorsOf(JobId.wrap(c.jobId));
        exclude = new address[](atts.length + 2);
        exclude[0] = c.solver;
        exclude[1] = c.challenger;
        for (uint256 i; i < atts.length; ++i) {
            exclude[i + 2] = atts[i];
        }
    }

    function _storeJury(uint256 id, address[] memory jury) internal {
        unchecked {
            uint256[] memory buf = new uint256[]((jury.length * ENTRY_BITS + 255) >> 8);
            for (uint256 i; i < jury.length; ++i) {
                uint256 bit = i * ENTRY_BITS;
                uint256 o = bit & 255;
                uint256 e = uint160(jury[i]);
                buf[bit >> 8] |= e << o;
                if (o + ENTRY_BITS > 256) buf[(bit >> 8) + 1] |= e >> (256 - o);
            }
            for (uint256 w; w < buf.length; ++w) {
                _setJuryWord(id, w, buf[w]);
            }
        }
    }

    /// @dev Writes `s` (Resolved) before any external call; returns the slashed challenger bond.
    function _settle(uint256 id, State memory s, IJobMarket.Verdict v, uint256 pool, address[] memory majority)
        internal
        returns (uint256 slashedBond)
    {
        s.phase = Phase.Resolved;
        s.verdict = v;
        _store(id, s);
        Core memory c = _core[id];
        market.resolveDispute(JobId.wrap(c.jobId), DisputeId.wrap(id), c.segment, c.round, c.challenger, v);
        if (v == IJobMarket.Verdict.Valid) {
            if (_challengeBond != 0) slashedBond = registry.slash(c.challenger, _challengeBond, address(this));
            uint256 toJury = majority.length == 0 ? 0 : slashedBond * _jurorShareOfChallengerBondBps / BPS;
            uint256 held = (slashedBond - toJury) * DELAY_SHARE_BPS / BPS;
            if (held != 0) {
                _delayHeld[(uint256(c.jobId) << 32) | c.round] += held;
                totalDelayHeld += held;
                emit DelayCompensationHeld(id, c.jobId, c.round, held);
            }
            _burn(id, slashedBond - toJury - held);
            pool += toJury;
        } else if (_challengeBond != 0) {
            registry.unlock(c.challenger, _challengeBond);
        }
        _payOut(id, pool, majority, majority.length);
    }

    /// @dev `amount` (held by the game) split over majority[0..n); dust to the first; burned if n == 0.
    function _payOut(uint256 id, uint256 amount, address[] memory majority, uint256 n) internal {
        if (amount == 0) return;
        if (n == 0) return _burn(id, amount);
        uint256 per = amount / n;
        uint256 credited = _credit(majority[0], amount - per * (n - 1));
        for (uint256 i = 1; i < n; ++i) {
            credited += _credit(majority[i], per);
        }
        _creditsPlusOne += credited;
    }

    function _burn(uint256 id, uint256 amount) internal {
        if (amount == 0) return;
        totalBurned += amount;
        token.safeTransfer(BURN, amount);
        emit Burned(id, amount);
    }

    /// @dev Caller adds the returned amount to the total.
    function _credit(address account, uint256 amount) internal returns (uint256) {
        if (amount == 0) return 0;
        uint256 c = _accountCreditsPlusOne[account];
        _accountCreditsPlusOne[account] = (c == 0 ? 1 : c) + amount;
        emit Credited(account, amount);
        return amount;
    }
}
