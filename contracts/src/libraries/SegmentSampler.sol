// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @title SegmentSampler
/// @notice The segments a verifier must check, identical to `node/proof.py`
///         `sample_segments`: draw `i` is
///         `uint256(keccak256(abi.encode(seed, i))) % segmentCount`, duplicates are
///         skipped, until `min(n, segmentCount)` distinct segments; returned in draw order.
/// @dev Cost grows with n^2 (duplicate check) and, when n is close to segmentCount,
///      with the coupon-collector number of draws: keep n small (tens).
library SegmentSampler {
    function sample(bytes32 seed, uint256 segmentCount, uint256 n) internal pure returns (uint256[] memory out) {
        if (segmentCount == 0) return new uint256[](0);
        if (n > segmentCount) n = segmentCount;
        out = new uint256[](n);
        uint256 filled;
        uint256 i;
        while (filled < n) {
            uint256 s = uint256(keccak256(abi.encode(seed, i))) % segmentCount;
            bool dup;
            for (uint256 j; j < filled; ++j) {
                if (out[j] == s) {
                    dup = true;
                    break;
                }
            }
            if (!dup) out[filled++] = s;
            unchecked {
                ++i;
            }
        }
    }

    /// @notice True when `segment` is among `sample(seed, segmentCount, n)`.
    function contains(bytes32 seed, uint256 segmentCount, uint256 n, uint256 segment) internal pure returns (bool) {
        if (segment >= segmentCount) return false;
        uint256[] memory s = sample(seed, segmentCount, n);
        for (uint256 j; j < s.length; ++j) {
            if (s[j] == segment) return true;
        }
        return false;
    }
}
