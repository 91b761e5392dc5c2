// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {IJobMarket} from "./IJobMarket.sol";
import {DisputeId, JobId} from "./Ids.sol";

/// @title IDisputeGame
/// @notice What the market needs of the dispute game.
interface IDisputeGame {
    /// @notice Open a dispute over steps [startStep, endStep] of `jobId`'s segment `segment`.
    ///         Market only: it proved both leaves and locked the challenger's bond.
    function open(
        JobId jobId,
        uint256 segment,
        uint32 round,
        address solver,
        address challenger,
        uint256 startStep,
        uint256 endStep,
        bytes32 startHash,
        bytes32 endHash
    ) external returns (DisputeId id);

    function challengerOf(DisputeId id) external view returns (address);
    /// @notice What the market's `disputeRef` reports: zeros for an unknown id; `resolved`
    ///         once the game reported its verdict to the market.
    /// @dev `jobId` stays uint256: the market copies it into `DisputeRef`; typed, JobMarket
    ///      (~1.3 KB under EIP-170) built 260 bytes larger. Its via-IR size moves by about
    ///      that much with the AST ids of the sources compiled before it, so measure it.
    function refOf(DisputeId id)
        external
        view
        returns (uint256 jobId, uint256 segment, address challenger, uint32 round, bool resolved, IJobMarket.Verdict verdict);

    /// @notice The majority jurors of dispute `id` when it was resolved Invalid by its jury
    ///         (empty otherwise), in jury order: the market credits them the jurors' share
    ///         of the solver's bond.
    function majorityOf(DisputeId id) external view returns (address[] memory);
}
