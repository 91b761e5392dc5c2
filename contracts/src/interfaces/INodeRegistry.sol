// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @title INodeRegistry
/// @notice Who is in the network (roles, libp2p identity, capability profile) and
///         what each node has at stake.
/// @dev Stake of a node lives in three buckets:
///      - free: can be locked, unbonded, or slashed by `slashUnlocked`;
///      - locked: backs a solver bond or a challenge bond; only the market and the
///        dispute game move it (`unlock`, `slash`);
///      - unbonding: requested out, withdrawable after `unbondDelay`, still slashable
///        by `slashUnlocked` until withdrawn;
///      - seat-locked: the slashable amount of each juror / attestor seat the node holds,
///        moved from free when it is seated (`drawSeats`) and released or slashed when the
///        seat ends (`closeSeats`): nothing the node does meanwhile (claim, unbond,
///        withdraw) can take it out of a slash's reach. It still counts as verifier stake
///        (eligibility and draw weight), so being seated changes no one's draw.
///      Conservation: `token.balanceOf(registry) == totalOwed()` == the sum of all
///      four buckets over all nodes.
interface INodeRegistry {
    /// @notice Everything the registry knows about a node (`nodeOf`; stored packed).
    struct Node {
        bool registered;
        uint8 roles; // bitmask: SOLVER = 1, VERIFIER = 2
        uint64 registeredAt; // block timestamp of `register`
        uint64 unbondAvailableAt; // timestamp from which `withdrawUnbonded` pays `unbondingStake`
        // Block of the last change to a VERIFIER node's roles, free, locked, unbonding or
        // slashed seat stake (not addresses, not a seat lock or release); a node without
        // the role is never drawn, so its bonds' moves leave it as it was.
        uint64 changedAt;
        uint256 freeStake;
        uint256 lockedStake;
        uint256 unbondingStake;
        uint256 seatLockedStake; // the slashable amount of the node's seats (whole gwei)
        string peerId; // libp2p peer id (base58 text)
        string[] multiaddrs; // libp2p multiaddrs (text)
        string profile; // JSON text: device, memory, measured throughput
    }

    // --- events ---
    event Authorized(address indexed market, address indexed dispute, address indexed outerJury);
    event NodeRegistered(address indexed node, uint8 roles, string peerId, string[] multiaddrs, string profile);
    event NodeUpdated(address indexed node, uint8 roles, string peerId, string[] multiaddrs, string profile);
    event Staked(address indexed node, uint256 amount, uint256 freeStake);
    event UnbondRequested(address indexed node, uint256 amount, uint256 unbondingStake, uint64 availableAt);
    event UnbondWithdrawn(address indexed node, uint256 amount);
    event StakeLocked(address indexed node, uint256 amount, address indexed by);
    event StakeUnlocked(address indexed node, uint256 amount, address indexed by);
    /// @param fromLocked true for `slash` (locked stake) and a slashed seat (`closeSeats`),
    ///        false for `slashUnlocked` (free, then unbonding)
    event Slashed(address indexed node, uint256 amount, address indexed to, bool fromLocked);
    /// @notice `amount` (whole gwei) moved free -> seat-locked for each of `nodes`, by `by`
    ///         (a jury, the market): `drawSeats`.
    event SeatsLocked(address[] nodes, uint256 amount, address indexed by);
    /// @notice One seat of each of `nodes` ended (`closeSeats`): bit i of `slashMask` set, the
    ///         seat was slashed (also a `Slashed`); otherwise `amount` went back to free.
    event SeatsClosed(address[] nodes, uint256 amount, uint256 slashMask, address indexed by);

    // --- errors ---
    error Unauthorized(address caller);
    error AlreadyAuthorized();
    error ZeroAddress();
    error ZeroAmount();
    error InvalidRoles(uint8 roles);
    error EmptyPeerId();
    error AlreadyRegistered(address node);
    error NotRegistered(address node);
    error InsufficientFreeStake(address node, uint256 free, uint256 needed);
    error InsufficientLockedStake(address node, uint256 locked, uint256 needed);
    error NothingToWithdraw();
    error StakeTooLarge(uint256 amount, uint256 room);
    error UnbondNotReady(uint64 availableAt);
    error InvalidSlashRecipient(address to);
    error InvalidParams();

    // --- node actions ---

    /// @notice Join the network. `roles` is a non-zero subset of SOLVER|VERIFIER.
    function register(uint8 roles, string calldata peerId, string[] calldata multiaddrs, string calldata profile)
        external;

    /// @notice Replace roles, peer id, addresses and profile of a registered node.
    function updateNode(uint8 roles, string calldata peerId, string[] calldata multiaddrs, string calldata profile)
        external;

    /// @notice Move `amount` tokens (approved beforehand) into the caller's free stake.
    function stake(uint256 amount) external;

    /// @notice Move `amount` of free stake to unbonding. Resets the unbonding clock:
    ///         all unbonding stake becomes withdrawable `unbondDelay` seconds from now.
    function requestUnbond(uint256 amount) external;

    /// @notice Pay out all unbonding stake once its delay has passed.
    function withdrawUnbonded() external returns (uint256 amount);

    // --- market / dispute only ---

    /// @notice free -> locked (a bond). Reverts `InsufficientFreeStake`.
    function lock(address node, uint256 amount) external;
    /// @notice `isSolver(node)`, and if so `lock(node, amount)` (none for 0): a claim's check
    ///         and bond in one call. False, nothing locked, when not a solver.
    function lockIfSolver(address node, uint256 amount) external returns (bool);

    /// @notice locked -> free. Reverts `InsufficientLockedStake`.
    function unlock(address node, uint256 amount) external;

    /// @notice Take up to `amount` from the node's LOCKED stake and transfer it to `to`
    ///         (the market or the dispute game, which credits it). Returns what was taken.
    function slash(address node, uint256 amount, address to) external returns (uint256 slashed);

    /// @notice `slashUnlocked(nodes[i], amount, to)` for each node, in one token transfer.
    ///         Returns what was taken from each.
    function slashUnlockedBatch(address[] calldata nodes, uint256 amount, address to)
        external
        returns (uint256[] memory slashed);

    /// @notice Take up to `amount` from the node's free stake, then its unbonding
    ///         stake (never its locked stake, which backs other bonds), and transfer it
    ///         to `to` (the market, the dispute game or the outer jury). The market, the
    ///         dispute game and the outer jury (its silent or minority jurors) may call it.
    ///         Returns what was taken.
    function slashUnlocked(address node, uint256 amount, address to) external returns (uint256 slashed);

    /// @notice Draw seats as `sortition(seed, want, poolLen, snapshotBlock, exclude)` does,
    ///         also skipping any node whose free stake now is below `seatLock` (it cannot
    ///         cover the seat: it opted out, it did not steer), and when at least
    ///         `minSeats` were drawn move `seatLock` (rounded up to a whole gwei) of each
    ///         picked node's free stake to its seat-locked stake (`SeatsLocked`). Returns the picks either way. The market,
    ///         the dispute game and the outer jury only; each closes the seats it drew
    ///         (`closeSeats`) with the same amount.
    function drawSeats(
        bytes32 seed,
        uint256 want,
        uint256 poolLen,
        uint256 snapshotBlock,
        address[] calldata exclude,
        uint256 seatLock,
        uint256 minSeats
    ) external returns (address[] memory picked);

    /// @notice Record the current block as a snapshot a later draw will read the
    ///         sortition tree at (pass it as `snapshotBlock`), and return the pool length
    ///         to pass as `poolLen`. The market, the dispute game and the outer jury only,
    ///         at a draw's request.
    function snapshot() external returns (uint256 poolLen);

    /// @notice End one seat of each of `nodes`, each locked with `amount`: where bit i of
    ///         `slashMask` is set, the seat's stake is slashed to `to` (`Slashed`, fromLocked
    ///         true), otherwise it goes back to free (`SeatsClosed`). Returns what was taken
    ///         from each. The market, the dispute game and the outer jury only.
    function closeSeats(address[] calldata nodes, uint256 amount, uint256 slashMask, address to)
        external
        returns (uint256[] memory slashed);

    // --- views ---
    function nodeOf(address node) external view returns (Node memory);
    function isRegistered(address node) external view returns (bool);
    function freeStake(address node) external view returns (uint256);
    function lockedStake(address node) external view returns (uint256);
    function unbondingStake(address node) external view returns (uint256);
    /// @notice The slashable amount of the seats the node holds now.
    function seatLockedStake(address node) external view returns (uint256);
    /// @notice Registered with the SOLVER role and free + locked stake >= minSolverStake.
    function isSolver(address node) external view returns (bool);
    /// @notice Registered with the VERIFIER role and free + seat-locked stake >=
    ///         minVerifierStake: only stake a jury or attestor slash can reach makes a
    ///         verifier (locked bonds do not count).
    function isVerifier(address node) external view returns (bool);
    /// @notice Length of the sortition pool: every address that ever had draw weight, in
    ///         order (append-only, so a slot never moves). An entry weighs
    ///         min(free + seat-locked, sortitionCap) (whole gwei) while it is a verifier,
    ///         else 0: dead entries are never drawn and cost a draw nothing.
    function verifierCount() external view returns (uint256);
    /// @notice Pool entry i.
    function verifierAt(uint256 i) external view returns (address);
    /// @notice Up to `want` distinct verifiers drawn from the first `poolLen` pool entries
    ///         with `seed`, stake-weighted by the entries' weights as of block
    ///         `snapshotBlock` (a stake-weighted sum tree read as of then), using only nodes
    ///         eligible now whose stake and roles did not change after `snapshotBlock`,
    ///         skipping `exclude`. Attempt i (at most `want * DRAW_ATTEMPTS`) takes
    ///         r = uint256(keccak256(abi.encode(seed, i))) and lands on the entry holding point
    ///         r % (total - landed) of the prefix sums of weights with the ranges of the
    ///         entries earlier attempts landed on cut out (total: the first `poolLen`
    ///         entries' weights summed; landed: the cut weights), so no entry is landed on
    ///         twice. Gas grows with log2(poolLen) only; dead entries are never
    ///         landed on. Exact at a `snapshot()` block and at any block after the latest
    ///         weight change; reverts `SnapshotLost` where history needed is gone (two later
    ///         snapshots each followed by a weight change before this draw).
    function sortition(
        bytes32 seed,
        uint256 want,
        uint256 poolLen,
        uint256 snapshotBlock,
        address[] calldata exclude
    ) external view returns (address[] memory picked);
    /// @notice The draw weight of each of the first `poolLen` pool entries as of block
    ///         `snapshotBlock` (in WEIGHT_UNITs, as `sortition` reads them; O(n log n), for
    ///         off-chain use).
    function weightsAt(uint256 poolLen, uint256 snapshotBlock) external view returns (uint256[] memory);
    /// @notice Stake weight cap of one pool entry in `sortition`.
    function sortitionCap() external view returns (uint256);
    function unbondDelay() external view returns (uint256);
    function minSolverStake() external view returns (uint256);
    function minVerifierStake() external view returns (uint256);
    function market() external view returns (address);
    function dispute() external view returns (address);
    function outerJury() external view returns (address);
    /// @notice Sum of free + locked + unbonding + seat-locked stake over all nodes: what the registry owes.
    function totalOwed() external view returns (uint256);
}
