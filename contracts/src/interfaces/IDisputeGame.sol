// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @title IDisputeGame
/// @notice What the market needs of the dispute game.
interface IDisputeGame {
    /// @notice Open a dispute over steps [startStep, endStep] of `jobId`'s segment `segment`.
    ///         Market only: it proved both leaves and locked the challenger's bond.
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

    function challengerOf(uint256 id) external view returns (address);

    /// @notice The majority jurors of dispute `id` (resolved Invalid by its jury), in jury
    ///         order: the market credits them the jurors' share of the solver's bond.
    function majorityOf(uint256 id) external view returns (address[] memory);
}
