"""One juror machine for both juries: a dispute's (DisputeGame: one step replayed) and
an outer round's (OuterJury: a collaborative round's outer state recomputed).

Both are commit-reveal: a seated juror puts its vote and salt on disk, then sends the
commitment; once the commit stage is over it reveals (a silent juror is slashed). The
game settles at its last reveal; a case with a silent juror (or an OuterJury round) is
resolved by anyone once the reveal stage is over. The contracts tell their stages
apart differently (the game by its phase, OuterJury by its clocks), so each caller
maps its case to a `JuryStage` and what it knows of its own vote; the decision is
this one function.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from node.roles.actions import Wait


class JuryStage(enum.Enum):
    COMMIT = "commit"
    REVEAL = "reveal"
    OVER = "over"    # the reveal stage has ended: the case can be resolved
    OTHER = "other"  # not (or no longer) a voting stage: nothing for a juror to do


@dataclass(frozen=True)
class JurorView:
    stage: JuryStage
    seated: bool     # we sit on this jury
    saved: bool      # our vote and salt are on disk
    committed: bool  # our commitment is on chain (or its transaction landed)
    revealed: bool   # our reveal is on chain (or its transaction landed)


@dataclass(frozen=True)
class CommitVote:
    """Judge, put the vote and salt on disk, send the commitment."""


@dataclass(frozen=True)
class ResendVote:
    """The vote and salt are on disk but no commitment on chain (killed, or a lost
    receipt): send the same one again."""


@dataclass(frozen=True)
class RevealVote:
    pass


@dataclass(frozen=True)
class Resolve:
    pass


JurorAction = CommitVote | ResendVote | RevealVote | Resolve | Wait


def clocked_stage(now: int, commit_end: int, reveal_end: int) -> JuryStage:
    """The stage of a jury told by its clocks (OuterJury): commit before ``commit_end``,
    reveal before ``reveal_end``, then over."""
    if now < commit_end:
        return JuryStage.COMMIT
    return JuryStage.REVEAL if now < reveal_end else JuryStage.OVER


def decide_juror(v: JurorView) -> JurorAction:
    if v.stage == JuryStage.OVER:
        return Resolve()
    if not v.seated:
        return Wait()
    if v.stage == JuryStage.COMMIT and not v.committed:
        return ResendVote() if v.saved else CommitVote()
    # Marked revealed only once the reveal landed: a failed one is sent again.
    if v.stage == JuryStage.REVEAL and v.saved and v.committed and not v.revealed:
        return RevealVote()
    return Wait()
