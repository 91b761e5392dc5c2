// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {TraceLib} from "../libraries/TraceLib.sol";
import {SegmentSampler} from "../libraries/SegmentSampler.sol";

/// @title LibHarness
/// @notice Test-only wrapper exposing the internal libraries, so tests can pin
///         them to the vectors in `tests/vectors/` (generated from node/proof.py).
///         Not part of a deployment.
contract LibHarness {
    function leafHash(uint256 jobId, uint256 index, uint256 step, bytes32 stateHash, uint256 lossE9)
        external
        pure
        returns (bytes32)
    {
        return TraceLib.leafHash(jobId, index, step, stateHash, lossE9);
    }

    function verifyLeaf(
        bytes32 root,
        uint256 jobId,
        uint256 index,
        uint256 stepsPerSegment,
        bytes32 stateHash,
        uint256 lossE9,
        bytes32[] calldata proof
    ) external pure returns (bool) {
        return TraceLib.verifyLeaf(root, jobId, index, stepsPerSegment, stateHash, lossE9, proof);
    }

    function sample(bytes32 seed, uint256 segmentCount, uint256 n) external pure returns (uint256[] memory) {
        return SegmentSampler.sample(seed, segmentCount, n);
    }

    function indexOf(bytes32 seed, uint256 segmentCount, uint256 n, uint256 segment)
        external
        pure
        returns (uint256)
    {
        return SegmentSampler.indexOf(seed, segmentCount, n, segment);
    }

    function contains(bytes32 seed, uint256 segmentCount, uint256 n, uint256 segment) external pure returns (bool) {
        return SegmentSampler.contains(seed, segmentCount, n, segment);
    }

    function sampleWithFinal(bytes32 seed, uint256 segmentCount, uint256 n) external pure returns (uint256[] memory) {
        return SegmentSampler.sampleWithFinal(seed, segmentCount, n);
    }

    function indexOfWithFinal(bytes32 seed, uint256 segmentCount, uint256 n, uint256 segment)
        external
        pure
        returns (uint256)
    {
        return SegmentSampler.indexOfWithFinal(seed, segmentCount, n, segment);
    }
}
