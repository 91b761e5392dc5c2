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

    /// @notice Market only, after sending `amount` tokens to the game: split them over the
    ///         majority jurors of dispute `id` (resolved Invalid by its jury).
    function creditJury(uint256 id, uint256 amount) external;
}
