// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @title IDisputeGame
/// @notice The narrow interface the job market calls to start a dispute.
interface IDisputeGame {
    /// @notice Open a bisection game over steps [startStep, endStep] of `segment`.
    /// @dev Only the market. The market has already proven both end states against the
    ///      trace root and locked the challenger's bond (market `params().challengeBond`).
    ///      The game settles both bonds itself and reports back via
    ///      `IJobMarket.resolveDispute(jobId, id, solverWon)`.
    /// @param startHash the committed state at startStep (both sides accept it)
    /// @param endHash the committed state at endStep (the challenger disputes it)
    /// @return id the dispute id (ids start at 1)
    function open(
        uint256 jobId,
        uint256 segment,
        address solver,
        address challenger,
        uint256 startStep,
        uint256 endStep,
        bytes32 startHash,
        bytes32 endHash
    ) external returns (uint256 id);

    /// @notice The challenger of dispute `id` (0 for an unknown id).
    function challengerOf(uint256 id) external view returns (address);
}
