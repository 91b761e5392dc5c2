// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {MerkleProof} from "@openzeppelin/contracts/utils/cryptography/MerkleProof.sol";

/// @title TraceLib
/// @notice Proof-of-learning trace leaves and their Merkle proofs, identical to
///         `node/proof.py` (`TraceLeaf.hash`, `MerkleTree`, `verify_proof`).
/// @dev There are `segmentCount + 1` leaves. Leaf `index` commits the state after
///      step `index * k`; segment `s` is checked between leaves `s` and `s + 1`.
///      Leaves are OpenZeppelin standard-tree leaves (double keccak of the ABI
///      encoding); inner nodes hash sorted pairs, so a proof is a sibling list.
library TraceLib {
    /// @notice keccak256(bytes.concat(keccak256(abi.encode(jobId, index, step, stateHash, lossE9)))).
    function leafHash(uint256 jobId, uint256 index, uint256 step, bytes32 stateHash, uint256 lossE9)
        internal
        pure
        returns (bytes32)
    {
        return keccak256(bytes.concat(keccak256(abi.encode(jobId, index, step, stateHash, lossE9))));
    }

    /// @notice True when the leaf `(jobId, index, index * k, stateHash, lossE9)` is in the tree `root`.
    function verifyLeaf(
        bytes32 root,
        uint256 jobId,
        uint256 index,
        uint256 stepsPerSegment,
        bytes32 stateHash,
        uint256 lossE9,
        bytes32[] memory proof
    ) internal pure returns (bool) {
        return MerkleProof.verify(proof, root, leafHash(jobId, index, index * stepsPerSegment, stateHash, lossE9));
    }
}
