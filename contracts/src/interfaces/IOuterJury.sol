// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {CaseId, CollabId} from "./Ids.sol";

/// @title IOuterJury
/// @notice The jury that decides a challenged outer state of a collaborative job. The
///         CollabMarket opens a case when someone challenges a posted outer state and asks
///         for the verdict when it resolves; the case is drawn, voted and tallied here. The
///         CollabMarket keeps the posts and the bonds; this contract has the registry's
///         authority to seat jurors and slash their seat-locked (or unlocked) stake, which
///         the CollabMarket has not.
/// @dev Case lifecycle (`Phase`):
///      Drawing (requested at block Q) --draw after Q + juryLookahead--> Voting
///      Voting --tally (the CollabMarket, at or after revealEnd)--> Tallied
///      A draw with fewer than quorum eligible jurors goes straight to Voting with
///      commitEnd = revealEnd = now: it tallies Void at once and slashes nobody.
///
///      Slashing (the point of a contract of its own): at tally, of a jury of at least
///      quorum, each juror who did not reveal, or revealed against a Valid / Invalid verdict,
///      loses `jurorSlash`, seat-locked in the registry when a quorum was drawn (so no claim
///      or unbond after the draw dodges it) and released for the others at the tally. A juror
///      that stays silent to stall a case into Void, or votes without recomputing, pays for it.
///      INVARIANT: this contract holds no tokens between calls: what a tally slashes is
///      forwarded to the CollabMarket in the same call (which credits it to the majority) or,
///      when no juror revealed, burned: never paid to the poster or the challenger, who could
///      own the silent jurors.
interface IOuterJury {
    enum Phase {
        None,
        Drawing, // requested at requestBlock; draw after requestBlock + juryLookahead
        Voting, // drawn: commit before commitEnd, reveal in [commitEnd, revealEnd)
        Tallied
    }

    enum Verdict {
        None,
        Valid, // the posted outer state recomputes
        Invalid, // it does not
        Void // too few jurors drawn or revealed, or a tie
    }

    /// @notice Deployment parameters, fixed for the contract's life.
    struct Params {
        uint256 juryLookahead; // blocks from the request to the block whose hash seeds the draw
        uint256 jurySize;
        uint256 quorum; // reveals needed for a verdict (<= jurySize)
        uint256 commitWindow; // seconds from the draw to commit votes
        uint256 revealWindow; // seconds after that to reveal
        uint256 jurorSlash; // seat-locked at the draw; a silent or minority juror loses it
    }

    struct Case {
        uint256 jobId;
        uint32 round;
        Phase phase;
        address poster;
        address challenger;
        uint64 requestBlock;
        uint32 poolLen; // verifier pool length at requestBlock
        uint64 commitEnd;
        uint64 revealEnd;
        address[] jury;
    }

    event CollabBound(address indexed collab);
    event JuryRequested(uint256 indexed caseId, uint256 indexed jobId, uint32 round, uint64 drawBlock, uint32 poolLen);
    event JuryDrawn(uint256 indexed caseId, address[] jury, uint64 commitEnd, uint64 revealEnd);
    event VoteCommitted(uint256 indexed caseId, address indexed juror);
    event VoteRevealed(uint256 indexed caseId, address indexed juror, bool valid);
    event JurorSlashed(uint256 indexed caseId, address indexed juror, uint256 amount, bool burned);
    event CaseTallied(uint256 indexed caseId, Verdict verdict, uint32 validVotes, uint32 invalidVotes, uint256 slashed);

    error ZeroAddress();
    error InvalidParams();
    error NotDeployer(address caller);
    error AlreadyBound();
    error NotCollab(address caller);
    error UnknownCase(uint256 caseId);
    error WrongPhase(uint256 caseId, Phase phase);
    error JuryNotReady(uint64 drawBlock);
    error NotJuror(address caller);
    error ZeroCommitment();
    error CommitClosed(uint64 commitEnd);
    error RevealNotOpen(uint64 commitEnd, uint64 revealEnd);
    error RevealNotOver(uint64 revealEnd);
    error AlreadyCommitted();
    error NoCommitment();
    error AlreadyRevealed();
    error BadReveal();

    /// @notice The deployer names the CollabMarket, once.
    function bind(address collab) external;

    /// @notice The CollabMarket: open a case for `challenger`'s challenge of `poster`'s outer
    ///         state of (jobId, round). The jury is requested now (block Q); neither party
    ///         can sit on it. Returns the case id (from 1).
    function open(CollabId jobId, uint32 round, address poster, address challenger) external returns (CaseId caseId);

    /// @notice Anyone, after block Q + juryLookahead: jury = registry.sortition(keccak256(
    ///         blockhash(Q + juryLookahead), caseId), jurySize, pool length at Q, Q, [poster,
    ///         challenger]), stake-weighted as of Q. Re-arms at the current block if that hash
    ///         is no longer readable (256 blocks).
    function draw(CaseId caseId) external;

    /// @notice Juror, before commitEnd: commitment = keccak256(abi.encode(valid, salt, juror,
    ///         caseId)). Vote valid iff recomputing the outer step from the previous outer
    ///         state and the round's accepted deltas yields the posted hash.
    function commitVote(CaseId caseId, bytes32 commitment) external;

    /// @notice Juror, in [commitEnd, revealEnd).
    function revealVote(CaseId caseId, bool valid, bytes32 salt) external;

    /// @notice The CollabMarket, at or after revealEnd: count the votes (a verdict needs quorum
    ///         reveals and a strict majority, else Void), slash silent and minority jurors
    ///         (on Void: silent ones) and forward the slashed stake to the CollabMarket, or
    ///         burn it when nobody revealed. `majority`: the jurors who revealed the verdict
    ///         (on Void: every juror who revealed), to be paid.
    function tally(CaseId caseId)
        external
        returns (Verdict verdict, uint32 validVotes, uint32 invalidVotes, address[] memory majority, uint256 slashed);

    // --- views ---
    function params() external view returns (Params memory);
    function collab() external view returns (address);
    function caseCount() external view returns (uint256);
    function getCase(CaseId caseId) external view returns (Case memory);
    /// @notice 0 none, 1 committed, 2 revealed valid, 3 revealed invalid.
    function voteOf(CaseId caseId, address juror) external view returns (uint8);
}
