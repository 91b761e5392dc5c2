// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @title SegmentSampler
/// @notice The segments a verifier must check, identical to `node/proof.py`
///         `sample_segments`: draw `i` is
///         `uint256(keccak256(abi.encode(seed, i))) % segmentCount`, duplicates are
///         skipped, until `min(n, segmentCount)` distinct segments; returned in draw order.
/// @dev Duplicates are found in a memory bitmap (one bit per segment), so a draw costs
///      a keccak and two word operations; `contains` stops at the first draw of the
///      segment. When n is close to segmentCount the coupon-collector number of draws
///      still grows: keep n well below segmentCount.
library SegmentSampler {
    function sample(bytes32 seed, uint256 segmentCount, uint256 n) internal pure returns (uint256[] memory out) {
        if (segmentCount == 0) return new uint256[](0);
        if (n > segmentCount) n = segmentCount;
        out = new uint256[](n);
        uint256[] memory seen = new uint256[]((segmentCount + 255) >> 8);
        uint256 filled;
        for (uint256 i; filled < n; ++i) {
            uint256 s = _draw(seed, i) % segmentCount;
            uint256 bit = uint256(1) << (s & 255);
            if (seen[s >> 8] & bit != 0) continue;
            seen[s >> 8] |= bit;
            out[filled++] = s;
        }
    }

    uint256 internal constant ABSENT = type(uint256).max;

    /// @dev uint256(keccak256(abi.encode(seed, i))), hashed in the scratch space: abi.encode
    ///      in the loop allocated 64 bytes of memory per draw, never freed, and memory's
    ///      quadratic price made a full replay's lookup cost ~4.5M gas at n = S = 1,024.
    function _draw(bytes32 seed, uint256 i) private pure returns (uint256 r) {
        assembly ("memory-safe") {
            mstore(0x00, seed)
            mstore(0x20, i)
            r := keccak256(0x00, 0x40)
        }
    }

    /// @notice True when `segment` is among `sample(seed, segmentCount, n)`.
    function contains(bytes32 seed, uint256 segmentCount, uint256 n, uint256 segment) internal pure returns (bool) {
        return indexOf(seed, segmentCount, n, segment) != ABSENT;
    }

    /// @notice `segment`'s position in `sample(seed, segmentCount, n)` (its draw order
    ///         among distinct segments), or ABSENT. The committee seat that answers for
    ///         it is `position % seats` (`node/proof.py` `sample_share`).
    function indexOf(bytes32 seed, uint256 segmentCount, uint256 n, uint256 segment)
        internal
        pure
        returns (uint256)
    {
        if (segment >= segmentCount) return ABSENT;
        if (n > segmentCount) n = segmentCount;
        uint256[] memory seen = new uint256[]((segmentCount + 255) >> 8);
        uint256 filled;
        for (uint256 i; filled < n; ++i) {
            uint256 s = _draw(seed, i) % segmentCount;
            uint256 bit = uint256(1) << (s & 255);
            if (seen[s >> 8] & bit != 0) continue;
            if (s == segment) return filled;
            seen[s >> 8] |= bit;
            ++filled;
        }
        return ABSENT;
    }

    /// @notice A reserved sub-job's sample (a collaborative inner run): its final segment
    ///         first, at position 0 (it ends in the committed weights the worker's delta
    ///         is taken from, so a forged delta is replayed every time), then
    ///         `sample(seed, segmentCount - 1, n)` among the others (node/proof.py
    ///         `sample_segments_with_final`).
    function sampleWithFinal(bytes32 seed, uint256 segmentCount, uint256 n)
        internal
        pure
        returns (uint256[] memory out)
    {
        if (segmentCount == 0) return new uint256[](0);
        uint256[] memory others = sample(seed, segmentCount - 1, n);
        out = new uint256[](others.length + 1);
        out[0] = segmentCount - 1;
        for (uint256 i; i < others.length; ++i) {
            out[i + 1] = others[i];
        }
    }

    /// @notice `segment`'s position in `sampleWithFinal(seed, segmentCount, n)`, or ABSENT.
    function indexOfWithFinal(bytes32 seed, uint256 segmentCount, uint256 n, uint256 segment)
        internal
        pure
        returns (uint256)
    {
        if (segment >= segmentCount) return ABSENT;
        if (segment == segmentCount - 1) return 0;
        uint256 at = indexOf(seed, segmentCount - 1, n, segment);
        return at == ABSENT ? ABSENT : at + 1;
    }
}
