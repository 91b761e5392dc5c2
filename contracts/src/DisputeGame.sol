// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {IDisputeGame} from "./interfaces/IDisputeGame.sol";
import {IJobMarket} from "./interfaces/IJobMarket.sol";
import {INodeRegistry} from "./interfaces/INodeRegistry.sol";

/// @title DisputeGame
/// @notice Bisection to one training step, then a commit-reveal jury.
/// @dev Game of dispute `id` over steps [lo, hi], loHash / hiHash the states there.
///      The challenger accepts the state at `lo` and disputes the state at `hi`.
///      1. Bisection. Solver to move: `postMid(id, midHash)`, the state hash after step
///         `mid = (lo + hi) / 2`. Challenger to move: `choose(id, disputeLower)`;
///         disputeLower = true -> [lo, mid] (it disputes the mid state), false ->
///         [mid, hi] (it accepts the mid state). Chess clock: each side has
///         `params.clock` seconds for all its moves together; time runs only for the
///         side to move. A move at or after the mover's clock ran out reverts
///         `ClockExpired`; then anyone may call `timeout(id)` and the side to move loses.
///      2. Jury. When hi - lo == 1 the jury is drawn: `jurySeed =
///         keccak256(abi.encode(blockhash(block.number - 1), id))`, jurors =
///         `drawJury(jurySeed, solver, challenger)` (registry verifiers with enough stake,
///         parties excluded, up to `jurySize`; fewer when not enough verifiers exist).
///         Jurors replay step lo -> hi from the state loHash and vote `valid` iff it
///         yields hiHash (a step the solver cannot serve is invalid). Commit
///         `keccak256(abi.encode(id, juror, valid, salt))` before `commitEnd`, reveal in
///         [commitEnd, revealEnd).
///      3. `resolve(id)` at or after revealEnd: solver wins iff valid >= invalid
///         revealed votes (the challenger carries the burden: ties and no reveals
///         uphold the step). Jurors who did not reveal or voted with the minority lose
///         jurorSlashBps of registry.minVerifierStake (free / unbonding stake).
///      Settlement (all credited, pulled with `withdraw()`):
///      - step valid (solver won): the challenger's bond is slashed;
///        solverShareOfChallengerBondBps -> solver, jurorShareOfChallengerBondBps -> jury pool
///        (the two sum to 10000; rounding dust -> solver).
///      - step invalid (challenger won): the whole solver bond is slashed;
///        challengerShareBps -> challenger, jurorShareBps -> jury pool,
///        submitterShareBps -> job submitter (the three sum to 10000; rounding dust ->
///        challenger); the challenger's bond is unlocked; the market reopens the job
///        (escrow intact) and slashes the segment's attestors to the challenger.
///      - jury pool (+ stake slashed from jurors) is split equally among the majority
///        jurors; division remainder, or all of it when there are none (timeout, empty
///        jury, no reveals), goes to the winner.
///      Moot: when another dispute reopened the job (market `isDisputeLive(id)` false),
///      `abortMoot(id)` (anyone; `resolve` / `timeout` do the same) ends the game and
///      unlocks the challenger's bond; nobody is paid or slashed.
///      Conservation: `token.balanceOf(this) == totalOwed()` == unpaid credits.
contract DisputeGame is IDisputeGame, ReentrancyGuard {
    using SafeERC20 for IERC20;

    uint256 internal constant BPS = 10_000;

    /// @notice Deployment parameters, fixed for the game's life.
    struct Params {
        uint256 clock; // seconds per side for all its bisection moves
        uint256 jurySize; // jurors drawn per dispute (fewer if not enough eligible verifiers)
        uint256 commitWindow; // seconds from the jury draw to commit votes
        uint256 revealWindow; // seconds after the commit window to reveal
        uint256 jurorSlashBps; // of registry.minVerifierStake, per minority / non-revealing juror
        // The next three sum to 10000, as do the last two.
        uint256 challengerShareBps; // of a slashed solver bond, to the challenger
        uint256 jurorShareBps; // of a slashed solver bond, to the majority jurors
        uint256 submitterShareBps; // of a slashed solver bond, to the job's submitter
        uint256 solverShareOfChallengerBondBps; // of a losing challenger's bond, to the solver
        uint256 jurorShareOfChallengerBondBps; // of a losing challenger's bond, to the majority jurors
    }

    /// @notice Stored phase; `getDispute` reports Reveal once the commit window is over.
    enum Phase {
        None,
        Bisection,
        Commit,
        Reveal,
        Resolved,
        Moot
    }

    enum Side {
        Solver,
        Challenger
    }

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
        bytes32 loHash;
        bytes32 hiHash;
        bytes32 midHash; // solver's pending mid claim (0 when none)
        Phase phase;
        Side turn;
        uint64 solverClock; // seconds left (as of lastMove)
        uint64 challengerClock;
        uint64 lastMove; // timestamp the side to move started thinking
        uint32 rounds; // bisection steps taken
        bytes32 jurySeed;
        uint64 commitEnd;
        uint64 revealEnd;
        uint32 validVotes;
        uint32 invalidVotes;
        bool solverWon;
        address[] jury;
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
    event MidPosted(uint256 indexed id, uint256 mid, bytes32 midHash, uint64 solverClockLeft);
    event RangeNarrowed(
        uint256 indexed id, uint256 lo, uint256 hi, bytes32 loHash, bytes32 hiHash, uint64 challengerClockLeft
    );
    event JuryDrawn(uint256 indexed id, bytes32 jurySeed, address[] jury, uint64 commitEnd, uint64 revealEnd);
    event VoteCommitted(uint256 indexed id, address indexed juror, bytes32 commitment);
    event VoteRevealed(uint256 indexed id, address indexed juror, bool valid);
    event TimedOut(uint256 indexed id, Side loser);
    event JurorSlashed(uint256 indexed id, address indexed juror, uint256 amount);
    event DisputeResolved(
        uint256 indexed id, uint256 indexed jobId, bool solverWon, uint32 validVotes, uint32 invalidVotes, uint256 slashedBond
    );
    event DisputeMooted(uint256 indexed id, uint256 indexed jobId);
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
    error NotJuror(address caller);
    error CommitClosed(uint64 commitEnd);
    error RevealNotOpen(uint64 commitEnd, uint64 revealEnd);
    error RevealNotOver(uint64 revealEnd);
    error AlreadyCommitted();
    error NoCommitment();
    error AlreadyRevealed();
    error BadReveal();
    error DisputeStillLive(uint256 id);
    error NothingToWithdraw();

    IERC20 public immutable token;
    INodeRegistry public immutable registry;
    IJobMarket public immutable market;
    Params internal _params;

    uint256 public disputeCount;
    uint256 public totalCredits;
    mapping(address => uint256) public credits;

    mapping(uint256 => Dispute) internal _disputes;
    mapping(uint256 => mapping(address => Vote)) internal _votes;
    mapping(uint256 => mapping(address => bool)) internal _isJuror;

    constructor(IERC20 token_, INodeRegistry registry_, IJobMarket market_, Params memory params_) {
        if (address(token_) == address(0) || address(registry_) == address(0) || address(market_) == address(0)) {
            revert ZeroAddress();
        }
        if (
            params_.clock == 0 || params_.clock > type(uint64).max || params_.jurySize == 0
                || params_.commitWindow == 0 || params_.revealWindow == 0 || params_.jurorSlashBps > BPS
                || params_.challengerShareBps + params_.jurorShareBps + params_.submitterShareBps != BPS
                || params_.solverShareOfChallengerBondBps + params_.jurorShareOfChallengerBondBps != BPS
        ) revert InvalidParams();
        token = token_;
        registry = registry_;
        market = market_;
        _params = params_;
    }

    // --- market ---

    /// @inheritdoc IDisputeGame
    function open(
        uint256 jobId,
        uint256 segment,
        address solver,
        address challenger,
        uint256 startStep,
        uint256 endStep,
        bytes32 startHash,
        bytes32 endHash
    ) external returns (uint256 id) {
        // INVARIANT: only the market opens disputes (it proved the leaves and locked the bond).
        if (msg.sender != address(market)) revert Unauthorized(msg.sender);
        if (endStep <= startStep) revert InvalidRange(startStep, endStep);
        id = ++disputeCount;
        Dispute storage d = _disputes[id];
        d.jobId = jobId;
        d.segment = segment;
        d.solver = solver;
        d.challenger = challenger;
        d.challengeBond = market.params().challengeBond;
        d.startStep = startStep;
        d.endStep = endStep;
        d.lo = startStep;
        d.hi = endStep;
        d.loHash = startHash;
        d.hiHash = endHash;
        d.solverClock = uint64(_params.clock);
        d.challengerClock = uint64(_params.clock);
        d.lastMove = uint64(block.timestamp);
        d.turn = Side.Solver;
        d.phase = Phase.Bisection;
        emit DisputeOpened(id, jobId, segment, solver, challenger, startStep, endStep, startHash, endHash);
        if (endStep - startStep == 1) _drawJury(id, d);
    }

    // --- bisection ---

    /// @notice Solver: the state hash after step (lo + hi) / 2.
    function postMid(uint256 id, bytes32 midHash) external {
        Dispute storage d = _bisecting(id);
        if (d.turn != Side.Solver || msg.sender != d.solver) revert NotYourTurn(msg.sender);
        if (midHash == bytes32(0)) revert ZeroHash();
        d.solverClock = _charge(id, d, d.solverClock);
        d.midHash = midHash;
        d.turn = Side.Challenger;
        emit MidPosted(id, (d.lo + d.hi) / 2, midHash, d.solverClock);
    }

    /// @notice Challenger: dispute [lo, mid] (true) or [mid, hi] (false).
    function choose(uint256 id, bool disputeLower) external {
        Dispute storage d = _bisecting(id);
        if (d.turn != Side.Challenger || msg.sender != d.challenger) revert NotYourTurn(msg.sender);
        d.challengerClock = _charge(id, d, d.challengerClock);
        uint256 mid = (d.lo + d.hi) / 2;
        if (disputeLower) {
            d.hi = mid;
            d.hiHash = d.midHash;
        } else {
            d.lo = mid;
            d.loHash = d.midHash;
        }
        d.midHash = bytes32(0);
        d.rounds += 1;
        d.turn = Side.Solver;
        emit RangeNarrowed(id, d.lo, d.hi, d.loHash, d.hiHash, d.challengerClock);
        if (d.hi - d.lo == 1) _drawJury(id, d);
    }

    /// @notice Anyone: the side to move ran out of clock and loses.
    function timeout(uint256 id) external nonReentrant {
        Dispute storage d = _bisecting(id);
        uint256 left = d.turn == Side.Solver ? d.solverClock : d.challengerClock;
        // INVARIANT: exactly one of {move, timeout} is possible at any time.
        if (block.timestamp < d.lastMove + left) revert ClockNotExpired(id, d.lastMove + left);
        if (!market.isDisputeLive(id)) return _moot(id, d);
        emit TimedOut(id, d.turn);
        if (d.turn == Side.Solver) d.solverClock = 0;
        else d.challengerClock = 0;
        _settle(id, d, d.turn == Side.Challenger, 0, new address[](0));
    }

    // --- jury ---

    function commitVote(uint256 id, bytes32 commitment) external {
        Dispute storage d = _inJury(id);
        if (!_isJuror[id][msg.sender]) revert NotJuror(msg.sender);
        if (block.timestamp >= d.commitEnd) revert CommitClosed(d.commitEnd);
        if (commitment == bytes32(0)) revert ZeroHash();
        Vote storage v = _votes[id][msg.sender];
        if (v.commitment != bytes32(0)) revert AlreadyCommitted();
        v.commitment = commitment;
        emit VoteCommitted(id, msg.sender, commitment);
    }

    function revealVote(uint256 id, bool valid, bytes32 salt) external {
        Dispute storage d = _inJury(id);
        if (!_isJuror[id][msg.sender]) revert NotJuror(msg.sender);
        if (block.timestamp < d.commitEnd || block.timestamp >= d.revealEnd) {
            revert RevealNotOpen(d.commitEnd, d.revealEnd);
        }
        Vote storage v = _votes[id][msg.sender];
        if (v.commitment == bytes32(0)) revert NoCommitment();
        if (v.revealed) revert AlreadyRevealed();
        // INVARIANT: a reveal must open the commitment made before anyone could see votes.
        if (keccak256(abi.encode(id, msg.sender, valid, salt)) != v.commitment) revert BadReveal();
        v.revealed = true;
        v.valid = valid;
        if (valid) d.validVotes += 1;
        else d.invalidVotes += 1;
        emit VoteRevealed(id, msg.sender, valid);
    }

    /// @notice Anyone, at or after revealEnd: count votes, slash absent / minority jurors, settle.
    function resolve(uint256 id) external nonReentrant {
        Dispute storage d = _inJury(id);
        if (block.timestamp < d.revealEnd) revert RevealNotOver(d.revealEnd);
        if (!market.isDisputeLive(id)) return _moot(id, d);
        bool solverWon = d.validVotes >= d.invalidVotes;
        uint256 cut = registry.minVerifierStake() * _params.jurorSlashBps / BPS;
        uint256 pool;
        address[] memory jury = d.jury;
        address[] memory majority = new address[](jury.length);
        uint256 m;
        for (uint256 i; i < jury.length; ++i) {
            Vote storage v = _votes[id][jury[i]];
            if (v.revealed && v.valid == solverWon) {
                majority[m++] = jury[i];
            } else if (cut != 0) {
                uint256 s = registry.slashUnlocked(jury[i], cut, address(this));
                pool += s;
                emit JurorSlashed(id, jury[i], s);
            }
        }
        assembly ("memory-safe") {
            mstore(majority, m)
        }
        _settle(id, d, solverWon, pool, majority);
    }

    /// @notice Anyone: end a dispute whose job was reopened by another dispute.
    function abortMoot(uint256 id) external nonReentrant {
        Dispute storage d = _disputes[id];
        if (d.phase != Phase.Bisection && d.phase != Phase.Commit) revert WrongPhase(id, d.phase);
        if (market.isDisputeLive(id)) revert DisputeStillLive(id);
        _moot(id, d);
    }

    function withdraw() external nonReentrant returns (uint256 amount) {
        amount = credits[msg.sender];
        if (amount == 0) revert NothingToWithdraw();
        credits[msg.sender] = 0;
        totalCredits -= amount;
        token.safeTransfer(msg.sender, amount);
        emit Withdrawn(msg.sender, amount);
    }

    // --- views ---

    function params() external view returns (Params memory) {
        return _params;
    }

    function getDispute(uint256 id) external view returns (DisputeView memory out) {
        Dispute storage d = _disputes[id];
        out.dispute = d;
        out.phase = d.phase;
        if (d.phase == Phase.Commit && block.timestamp >= d.commitEnd) out.phase = Phase.Reveal;
        out.solverClockLeft = d.solverClock;
        out.challengerClockLeft = d.challengerClock;
        if (d.phase == Phase.Bisection) {
            uint256 elapsed = block.timestamp - d.lastMove;
            if (d.turn == Side.Solver) out.solverClockLeft = elapsed >= d.solverClock ? 0 : d.solverClock - elapsed;
            else out.challengerClockLeft = elapsed >= d.challengerClock ? 0 : d.challengerClock - elapsed;
        }
        out.votes = new Vote[](d.jury.length);
        for (uint256 i; i < d.jury.length; ++i) {
            out.votes[i] = _votes[id][d.jury[i]];
        }
    }

    function voteOf(uint256 id, address juror) external view returns (Vote memory) {
        return _votes[id][juror];
    }

    function isJuror(uint256 id, address account) external view returns (bool) {
        return _isJuror[id][account];
    }

    /// @notice The jury for `seed` under the registry's current state: a partial
    ///         Fisher-Yates shuffle of verifier indices, step i swapping slot i with slot
    ///         `i + uint256(keccak256(abi.encode(seed, i))) % (count - i)`, keeping the
    ///         verifier at slot i if it is `isVerifier` and neither party, until jurySize
    ///         are kept or all verifiers were looked at.
    function drawJury(bytes32 seed, address solver, address challenger) public view returns (address[] memory jury) {
        uint256 count = registry.verifierCount();
        uint256 want = _params.jurySize;
        jury = new address[](want);
        uint256[] memory idx = new uint256[](count);
        for (uint256 i; i < count; ++i) {
            idx[i] = i;
        }
        uint256 got;
        for (uint256 i; i < count && got < want; ++i) {
            uint256 r = i + uint256(keccak256(abi.encode(seed, i))) % (count - i);
            (idx[i], idx[r]) = (idx[r], idx[i]);
            address a = registry.verifierAt(idx[i]);
            if (a != solver && a != challenger && registry.isVerifier(a)) jury[got++] = a;
        }
        assembly ("memory-safe") {
            mstore(jury, got)
        }
    }

    /// @notice Unpaid credits: what the game owes.
    function totalOwed() external view returns (uint256) {
        return totalCredits;
    }

    // --- internals ---

    function _bisecting(uint256 id) internal view returns (Dispute storage d) {
        d = _disputes[id];
        if (d.phase == Phase.None) revert UnknownDispute(id);
        if (d.phase != Phase.Bisection) revert WrongPhase(id, d.phase);
    }

    function _inJury(uint256 id) internal view returns (Dispute storage d) {
        d = _disputes[id];
        if (d.phase == Phase.None) revert UnknownDispute(id);
        if (d.phase != Phase.Commit) revert WrongPhase(id, d.phase);
    }

    /// @dev Charge the mover the time since lastMove; reverts when its clock ran out.
    function _charge(uint256 id, Dispute storage d, uint64 left) internal returns (uint64) {
        uint256 elapsed = block.timestamp - d.lastMove;
        // INVARIANT: a late move cannot steal a win the other side can already claim by timeout.
        if (elapsed >= left) revert ClockExpired(id);
        d.lastMove = uint64(block.timestamp);
        return uint64(left - elapsed);
    }

    function _drawJury(uint256 id, Dispute storage d) internal {
        bytes32 seed = keccak256(abi.encode(blockhash(block.number - 1), id));
        address[] memory jury = drawJury(seed, d.solver, d.challenger);
        d.jurySeed = seed;
        d.jury = jury;
        for (uint256 i; i < jury.length; ++i) {
            _isJuror[id][jury[i]] = true;
        }
        d.commitEnd = uint64(block.timestamp + _params.commitWindow);
        d.revealEnd = uint64(d.commitEnd + _params.revealWindow);
        d.phase = Phase.Commit;
        emit JuryDrawn(id, seed, jury, d.commitEnd, d.revealEnd);
    }

    function _moot(uint256 id, Dispute storage d) internal {
        d.phase = Phase.Moot;
        if (d.challengeBond != 0) registry.unlock(d.challenger, d.challengeBond);
        emit DisputeMooted(id, d.jobId);
    }

    function _settle(uint256 id, Dispute storage d, bool solverWon, uint256 pool, address[] memory majority)
        internal
    {
        d.phase = Phase.Resolved;
        d.solverWon = solverWon;
        address winner;
        uint256 slashedBond;
        if (solverWon) {
            winner = d.solver;
            market.resolveDispute(d.jobId, id, true);
            if (d.challengeBond != 0) slashedBond = registry.slash(d.challenger, d.challengeBond, address(this));
            uint256 toJury = slashedBond * _params.jurorShareOfChallengerBondBps / BPS;
            pool += toJury;
            _credit(winner, slashedBond - toJury); // solver share + rounding dust
        } else {
            winner = d.challenger;
            IJobMarket.Job memory job = market.getJob(d.jobId); // read before the market reopens it
            market.resolveDispute(d.jobId, id, false);
            if (job.bond != 0) slashedBond = registry.slash(d.solver, job.bond, address(this));
            if (d.challengeBond != 0) registry.unlock(d.challenger, d.challengeBond);
            uint256 toJury = slashedBond * _params.jurorShareBps / BPS;
            uint256 toSubmitter = slashedBond * _params.submitterShareBps / BPS;
            pool += toJury;
            _credit(job.submitter, toSubmitter);
            _credit(winner, slashedBond - toJury - toSubmitter); // challenger share + rounding dust
        }
        uint256 per = majority.length == 0 ? 0 : pool / majority.length;
        for (uint256 i; i < majority.length; ++i) {
            _credit(majority[i], per);
        }
        _credit(winner, pool - per * majority.length);
        emit DisputeResolved(id, d.jobId, solverWon, d.validVotes, d.invalidVotes, slashedBond);
    }

    function _credit(address account, uint256 amount) internal {
        if (amount == 0) return;
        credits[account] += amount;
        totalCredits += amount;
        emit Credited(account, amount);
    }
}
