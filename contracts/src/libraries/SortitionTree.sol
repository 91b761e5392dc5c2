// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @title SortitionTree
/// @notice A stake-weighted sum tree (Fenwick) over pool slots 1..size whose nodes can be
///         read as of a snapshot block, so a draw descends the tree as it stood when the
///         draw was requested whatever moved since.
/// @dev Each tree node is one word holding its last three values and the blocks they were
///      written in: [v0 53 | v1 53 | v2 53 | b0 32 | b1 32 | b2 32] (v0 newest; values
///      are weights in the caller's unit, whose total must stay below 2^53). A write keeps
///      the value it replaces only when a snapshot was taken since that value was written
///      (`lastSnap >= b0`): otherwise no draw can ask for it. Reading as of block s gives
///      the newest value written at or before s; if all three are newer the value is gone
///      (`SnapshotLost`: three snapshots, each followed by a write to this node, after s).
///      Exact at every snapshot block and at any block after the latest write.
library SortitionTree {
    error SnapshotLost(uint256 snapshotBlock);

    /// @dev The tree's size and the block of its latest snapshot are the caller's to keep
    ///      (passed in): it packs them into a word it reads anyway (NodeRegistry: beside the
    ///      market's address, which every authorized call reads).
    struct Tree {
        mapping(uint256 => uint256) node;
    }

    uint256 private constant V = (1 << 53) - 1;
    uint256 private constant B = (1 << 32) - 1;

    /// @dev Add slot `j` (the tree's size + 1; the caller counts it) with weight `w`.
    function append(Tree storage t, uint256 j, uint256 w) internal {
        // A Fenwick node j sums slots (j - lowbit(j), j]: w plus the nodes below it.
        uint256 s = w;
        uint256 stop = j - (j & (~j + 1));
        for (uint256 k = j - 1; k > stop; k -= k & (~k + 1)) {
            s += t.node[k] & V;
        }
        // Never read as of a block before now: a snapshot then had a smaller size.
        t.node[j] = s | (block.number << 159);
    }

    /// @dev Slot `j`'s weight goes from `from` to `to`, in a tree of `n` slots whose latest
    ///      snapshot was taken at block `snap`.
    function update(Tree storage t, uint256 j, uint256 n, uint256 snap, uint256 from, uint256 to) internal {
        // Unchecked: a node's value includes the slot's old weight `from`, and every sum stays
        // below 2^53; j stays below 2 * n.
        unchecked {
            for (; j <= n; j += j & (~j + 1)) {
                uint256 w = t.node[j];
                uint256 v = (w & V) + to - from;
                uint256 b0 = (w >> 159) & B;
                if (b0 == block.number || snap < b0) {
                    // No snapshot can need the value this replaces.
                    t.node[j] = (w & ~(V | (B << 159))) | v | (block.number << 159);
                } else {
                    // [v0 v1 v2 | b0 b1 b2] -> [v v0 v1 | now b0 b1]
                    uint256 vs = ((w & ((1 << 106) - 1)) << 53) | v;
                    uint256 bs = (((w >> 159) & ((1 << 64) - 1)) << 32) | block.number;
                    t.node[j] = vs | (bs << 159);
                }
            }
        }
    }

    /// @dev Node `j` as of block `s`.
    function at(Tree storage t, uint256 j, uint256 s) internal view returns (uint256) {
        uint256 w = t.node[j];
        // Unrolled: the newest value is the one read almost always.
        if (((w >> 159) & B) <= s) return w & V;
        if (((w >> 191) & B) <= s) return (w >> 53) & V;
        if ((w >> 223) <= s) return (w >> 106) & V;
        revert SnapshotLost(s);
    }

    /// @dev Sum of slots 1..len as of block `s`.
    function totalAt(Tree storage t, uint256 len, uint256 s) internal view returns (uint256 sum) {
        unchecked {
            // The sum of a prefix's nodes is the prefix's weight (< 2^53).
            for (uint256 j = len; j > 0; j -= j & (~j + 1)) {
                sum += at(t, j, s);
            }
        }
    }

    /// @dev The slot (1-based) holding point `x` < totalAt(len, s) as of `s` (the first slot
    ///      whose prefix sum exceeds x), x less the prefix sum before that slot, and the
    ///      slot's own weight. The slot's node is the last the descent passes over, and the
    ///      nodes it takes after it are exactly those under it: the weight is that node less
    ///      them, with no read beyond the descent's own.
    function find(Tree storage t, uint256 len, uint256 s, uint256 x)
        internal
        view
        returns (uint256 pos, uint256 into, uint256 leaf)
    {
        // Unchecked: positions stay below 2 * len, and x only drops by a v <= x.
        unchecked {
            uint256 step = 1;
            while (step << 1 <= len) step <<= 1;
            for (; step > 0; step >>= 1) {
                uint256 k = pos + step;
                if (k > len) continue;
                uint256 v = at(t, k, s);
                if (v <= x) {
                    pos = k;
                    x -= v;
                    // Wraps before the first node passed over; reset there (a slot's own
                    // weight is at most its node's, so the final value is exact).
                    leaf -= v;
                } else {
                    leaf = v;
                }
            }
            return (pos + 1, x, leaf);
        }
    }
}
