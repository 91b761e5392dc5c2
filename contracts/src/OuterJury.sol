// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {ReentrancyGuardTransient} from "@openzeppelin/contracts/utils/ReentrancyGuardTransient.sol";
import {INodeRegistry} from "./interfaces/INodeRegistry.sol";
import {CaseId, CollabId} from "./interfaces/Ids.sol";
import {IOuterJury} from "./interfaces/IOuterJury.sol";

/// @title OuterJury
/// @notice Juries over challenged outer states of collaborative jobs. See {IOuterJury}.
/// @dev Holds no tokens between calls; the CollabMarket holds the bonds and pays the majority.
contract OuterJury is IOuterJury, ReentrancyGuardTransient {
    using SafeERC20 for IERC20;

    uint256 internal constant MAX_JURY = 15;
    uint256 internal constant MAX_DURATION = 365 days;
    address internal constant BURN = 0x000000000000000000000000000000000000dEaD;
    uint8 internal constant COMMITTED = 1;
    uint8 internal constant VALID = 2;
    uint8 internal constant INVALID = 3;

    IERC20 public immutable token;
    INodeRegistry public immutable registry;
    address internal immutable _deployer;

    uint256 internal immutable _juryLookahead;
    uint256 internal immutable _jurySize;
    uint256 internal immutable _quorum;
    uint256 internal immutable _commitWindow;
    uint256 internal immutable _revealWindow;
    uint256 internal immutable _jurorSlash;

    address public override collab;
    uint256 public override caseCount;

    mapping(uint256 => Case) internal _cases;
    mapping(uint256 => mapping(address => bytes32)) internal _commits;
    mapping(uint256 => mapping(address => uint8)) internal _votes;

    modifier onlyCollab() {
        // INVARIANT: only the CollabMarket opens and tallies cases: nobody else can make a
        // tally slash jurors or end a case its bonds depend on.
        if (msg.sender != collab || msg.sender == address(0)) revert NotCollab(msg.sender);
        _;
    }

    constructor(IERC20 token_, INodeRegistry registry_, Params memory params_) {
        if (address(token_) == address(0) || address(registry_) == address(0)) revert ZeroAddress();
        if (
            params_.juryLookahead == 0 || params_.juryLookahead > 128 || params_.jurySize == 0
                || params_.jurySize > MAX_JURY || params_.quorum == 0 || params_.quorum > params_.jurySize
                || params_.commitWindow == 0 || params_.commitWindow > MAX_DURATION || params_.revealWindow == 0
                || params_.revealWindow > MAX_DURATION || params_.jurorSlash > type(uint128).max
                // INVARIANT: a juror's stake stays slashable (free or unbonding) from the draw to
                // the tally, so none can unbond and walk away from a slash it has coming.
                || registry_.unbondDelay() <= 2 * (params_.commitWindow + params_.revealWindow)
        ) revert InvalidParams();
        token = token_;
        registry = registry_;
        _deployer = msg.sender;
        _juryLookahead = params_.juryLookahead;
        _jurySize = params_.jurySize;
        _quorum = params_.quorum;
        _commitWindow = params_.commitWindow;
        _revealWindow = params_.revealWindow;
        _jurorSlash = params_.jurorSlash;
    }

    /// @inheritdoc IOuterJury
    function bind(address collab_) external {
        if (msg.sender != _deployer) revert NotDeployer(msg.sender);
        if (collab != address(0)) revert AlreadyBound();
        if (collab_ == address(0)) revert ZeroAddress();
        collab = collab_;
        emit CollabBound(collab_);
    }

    /// @inheritdoc IOuterJury
    function open(CollabId jobId, uint32 round, address poster, address challenger)
        external
        onlyCollab
        returns (CaseId)
    {
        uint256 caseId = ++caseCount;
        Case storage c = _cases[caseId];
        c.jobId = CollabId.unwrap(jobId);
        c.round = round;
        c.poster = poster;
        c.challenger = challenger;
        _request(caseId, c);
        return CaseId.wrap(caseId);
    }

    /// @inheritdoc IOuterJury
    function draw(CaseId id) external nonReentrant {
        uint256 caseId = CaseId.unwrap(id);
        Case storage c = _inPhase(caseId, Phase.Drawing);
        uint64 drawBlock = uint64(c.requestBlock + _juryLookahead);
        if (block.number <= drawBlock) revert JuryNotReady(drawBlock);
        bytes32 bh = blockhash(drawBlock);
        if (bh == 0) {
            // Nobody drew while the hash was readable (256 blocks): ask again from now on.
            _request(caseId, c);
            return;
        }
        address[] memory exclude = new address[](2);
        exclude[0] = c.poster;
        exclude[1] = c.challenger;
        // INVARIANT: a seated juror's slash is locked from the draw to the tally (a quorum's
        // seats, or none): nothing it does meanwhile takes it out of reach.
        address[] memory jury = registry.drawSeats(
            keccak256(abi.encode(bh, caseId)), _jurySize, c.poolLen, c.requestBlock, exclude, _jurorSlash, _quorum
        );
        for (uint256 i; i < jury.length; ++i) {
            c.jury.push(jury[i]);
        }
        c.phase = Phase.Voting;
        if (jury.length < _quorum) {
            // Too few eligible jurors: Void at once, and nobody is slashed for it.
            c.commitEnd = uint64(block.timestamp);
            c.revealEnd = uint64(block.timestamp);
        } else {
            c.commitEnd = uint64(block.timestamp + _commitWindow);
            c.revealEnd = uint64(c.commitEnd + _revealWindow);
        }
        emit JuryDrawn(caseId, jury, c.commitEnd, c.revealEnd);
    }

    /// @inheritdoc IOuterJury
    function commitVote(CaseId id, bytes32 commitment) external {
        uint256 caseId = CaseId.unwrap(id);
        Case storage c = _inPhase(caseId, Phase.Voting);
        if (!_isJuror(c, msg.sender)) revert NotJuror(msg.sender);
        if (block.timestamp >= c.commitEnd) revert CommitClosed(c.commitEnd);
        if (commitment == 0) revert ZeroCommitment();
        if (_votes[caseId][msg.sender] != 0) revert AlreadyCommitted();
        _commits[caseId][msg.sender] = commitment;
        _votes[caseId][msg.sender] = COMMITTED;
        emit VoteCommitted(caseId, msg.sender);
    }

    /// @inheritdoc IOuterJury
    function revealVote(CaseId id, bool valid, bytes32 salt) external {
        uint256 caseId = CaseId.unwrap(id);
        Case storage c = _inPhase(caseId, Phase.Voting);
        if (block.timestamp < c.commitEnd || block.timestamp >= c.revealEnd) {
            revert RevealNotOpen(c.commitEnd, c.revealEnd);
        }
        uint8 state = _votes[caseId][msg.sender];
        if (state == 0) revert NoCommitment();
        if (state != COMMITTED) revert AlreadyRevealed();
        // INVARIANT: a reveal opens the commitment made before anyone could see votes.
        if (keccak256(abi.encode(valid, salt, msg.sender, caseId)) != _commits[caseId][msg.sender]) {
            revert BadReveal();
        }
        _votes[caseId][msg.sender] = valid ? VALID : INVALID;
        emit VoteRevealed(caseId, msg.sender, valid);
    }

    /// @inheritdoc IOuterJury
    function tally(CaseId id)
        external
        onlyCollab
        nonReentrant
        returns (Verdict verdict, uint32 validVotes, uint32 invalidVotes, address[] memory majority, uint256 slashed)
    {
        uint256 caseId = CaseId.unwrap(id);
        Case storage c = _inPhase(caseId, Phase.Voting);
        if (block.timestamp < c.revealEnd) revert RevealNotOver(c.revealEnd);
        c.phase = Phase.Tallied;
        address[] memory jury = c.jury;
        (validVotes, invalidVotes) = _count(caseId, jury);
        // INVARIANT: no verdict without a quorum and a strict majority.
        if (validVotes + invalidVotes < _quorum || validVotes == invalidVotes) verdict = Verdict.Void;
        else verdict = validVotes > invalidVotes ? Verdict.Valid : Verdict.Invalid;
        uint256 losers;
        (majority, losers) = _split(caseId, jury, verdict);
        // A jury below quorum was never asked to vote (nor seated): nobody pays for it.
        if (jury.length >= _quorum) slashed = _slash(caseId, jury, losers, majority.length == 0);
        emit CaseTallied(caseId, verdict, validVotes, invalidVotes, slashed);
        // Forwarded to the CollabMarket, which credits it; a burn leaves nothing to pay.
        if (majority.length == 0) slashed = 0;
    }

    // --- views ---

    function params() external view returns (Params memory) {
        return Params(_juryLookahead, _jurySize, _quorum, _commitWindow, _revealWindow, _jurorSlash);
    }

    function getCase(CaseId id) external view returns (Case memory) {
        uint256 caseId = CaseId.unwrap(id);
        return _cases[caseId];
    }

    function voteOf(CaseId id, address juror) external view returns (uint8) {
        uint256 caseId = CaseId.unwrap(id);
        return _votes[caseId][juror];
    }

    // --- internals ---

    function _inPhase(uint256 caseId, Phase phase) internal view returns (Case storage c) {
        c = _cases[caseId];
        if (c.phase == Phase.None) revert UnknownCase(caseId);
        if (c.phase != phase) revert WrongPhase(caseId, c.phase);
    }

    /// @dev The seed is a block hash after this one and the pool is snapshotted now:
    ///      neither party's later move or timing can steer the draw.
    function _request(uint256 caseId, Case storage c) internal {
        c.phase = Phase.Drawing;
        c.requestBlock = uint64(block.number);
        c.poolLen = uint32(registry.snapshot());
        emit JuryRequested(caseId, c.jobId, c.round, uint64(block.number + _juryLookahead), c.poolLen);
    }

    function _count(uint256 caseId, address[] memory jury) internal view returns (uint32 valid, uint32 invalid) {
        for (uint256 i; i < jury.length; ++i) {
            uint8 v = _votes[caseId][jury[i]];
            if (v == VALID) ++valid;
            else if (v == INVALID) ++invalid;
        }
    }

    /// @dev The majority: jurors who revealed the verdict (on Void every revealer: a tie is
    ///      nobody's fault, silence is); the losers (bit i for jury[i]): everyone else.
    function _split(uint256 caseId, address[] memory jury, Verdict verdict)
        internal
        view
        returns (address[] memory majority, uint256 losers)
    {
        uint256 n = jury.length;
        uint8 want = verdict == Verdict.Valid ? VALID : INVALID;
        majority = new address[](n);
        uint256 m;
        for (uint256 i; i < n; ++i) {
            uint8 v = _votes[caseId][jury[i]];
            if (verdict == Verdict.Void ? v >= VALID : v == want) majority[m++] = jury[i];
            else losers |= uint256(1) << i;
        }
        assembly ("memory-safe") {
            mstore(majority, m)
        }
    }

    /// @dev End the jury's seats: the losers' seat-locked `jurorSlash` is taken, the others'
    ///      released; forward what was taken to the CollabMarket, or burn it when nobody
    ///      revealed (`burn`).
    function _slash(uint256 caseId, address[] memory jury, uint256 losers, bool burn)
        internal
        returns (uint256 slashed)
    {
        if (_jurorSlash == 0) return 0;
        uint256[] memory taken = registry.closeSeats(jury, _jurorSlash, losers, address(this));
        for (uint256 i; i < jury.length; ++i) {
            if ((losers >> i) & 1 == 0) continue;
            slashed += taken[i];
            emit JurorSlashed(caseId, jury[i], taken[i], burn);
        }
        if (slashed != 0) token.safeTransfer(burn ? BURN : collab, slashed);
    }

    function _isJuror(Case storage c, address a) internal view returns (bool) {
        uint256 n = c.jury.length;
        for (uint256 i; i < n; ++i) {
            if (c.jury[i] == a) return true;
        }
        return false;
    }
}
