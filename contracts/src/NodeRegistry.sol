// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";
import {ReentrancyGuardTransient} from "@openzeppelin/contracts/utils/ReentrancyGuardTransient.sol";
import {INodeRegistry} from "./interfaces/INodeRegistry.sol";
import {SortitionTree} from "./libraries/SortitionTree.sol";

/// @title NodeRegistry
/// @notice Roles, identities and stake of polnet nodes. See {INodeRegistry}.
/// @dev The owner wires the market, the dispute game and the outer jury once
///      (`setAuthorized`); from then on only the first two lock, unlock and slash stake,
///      and the outer jury may only take unlocked stake of its jurors (`slashUnlocked`) and
///      draw and close seats (`drawSeats`, `closeSeats`).
contract NodeRegistry is INodeRegistry, Ownable, ReentrancyGuardTransient {
    using SafeERC20 for IERC20;
    using SortitionTree for SortitionTree.Tree;

    uint8 public constant SOLVER = 1;
    uint8 public constant VERIFIER = 2;

    IERC20 public immutable token;
    uint256 public immutable override unbondDelay;
    uint256 public immutable override minSolverStake;
    uint256 public immutable override minVerifierStake;
    uint256 public immutable override sortitionCap;

    /// @dev Tries per wanted seat in `sortition` (a try lands on live stake; it is spent only
    ///      on an excluded, already picked or since-moved node): bounds the draw's gas.
    uint256 public constant DRAW_ATTEMPTS = 8;
    /// @dev Bounds timestamps kept as uint64 (`unbondAvailableAt`).
    uint256 internal constant MAX_DELAY = 10 * 365 days;

    address public override market;
    /// @dev The sortition tree's size (= `_pool.length`) and the block of its latest
    ///      snapshot, in the market's word: the snapshot, a draw and a verifier's weight move
    ///      all read that word already (the authorization check), so no second cold read.
    uint32 internal _poolSize;
    uint64 internal _lastSnap;
    address public override dispute;
    address public override outerJury;

    /// @dev Sum of free + locked + unbonding + seat-locked over all nodes; moved with every
    ///      bucket change.
    uint256 internal _totalStaked;

    /// @dev A node as stored: the flags' word, unbonding stake, then one word for what a
    ///      claim, a finalize, a draw and a seat touch (free, locked and seat-locked stake;
    ///      `stake` bounds the registry's total to uint96 so none can wrap), then identity.
    struct Rec {
        bool registered;
        uint8 roles;
        uint40 registeredAt;
        uint40 unbondAvailableAt;
        uint40 changedAt;
        uint32 slot; // 1-based sortition slot, 0 until the node first has draw weight
        uint64 weight; // its draw weight in the tree now, in WEIGHT_UNITs
        // Here, not after the stake word: it keeps free stake out of the flags' word.
        uint256 unbondingStake;
        uint96 freeStake;
        uint96 lockedStake;
        uint64 seatUnits; // seat-locked stake in SEAT_UNITs
        string peerId;
        string[] multiaddrs;
        string profile;
    }

    /// @dev Seat-locked stake is kept in whole gwei (a seat's lock is rounded up to one), so
    ///      it fits the stake word beside free and locked.
    uint256 public constant SEAT_UNIT = 1e9;

    /// @dev Draw weights are kept in units of 1e13 wei (1e-5 POL), rounded up: the
    ///      registry's total, below 2^96 wei, stays below the tree's 2^53 units.
    uint256 public constant WEIGHT_UNIT = 1e13;

    mapping(address => Rec) internal _nodes;
    /// @dev The sortition pool, append-only: slot i + 1 of `_tree` is `_pool[i]`, its
    ///      weight min(free + seat-locked, sortitionCap) while a verifier, else 0, so dead
    ///      entries weigh nothing and a draw never lands on them.
    address[] internal _pool;
    SortitionTree.Tree internal _tree;

    modifier onlyAuthorized() {
        // INVARIANT: only the market and the dispute game move locked stake or slash.
        if (msg.sender != market && msg.sender != dispute) revert Unauthorized(msg.sender);
        _;
    }

    modifier onlySlasher() {
        // INVARIANT: the outer jury takes unlocked stake only; it never touches a bond.
        if (msg.sender != market && msg.sender != dispute && msg.sender != outerJury) {
            revert Unauthorized(msg.sender);
        }
        _;
    }

    constructor(
        IERC20 token_,
        uint256 unbondDelay_,
        uint256 minSolverStake_,
        uint256 minVerifierStake_,
        uint256 sortitionCap_
    ) Ownable(msg.sender) {
        if (address(token_) == address(0)) revert ZeroAddress();
        // A zero minimum would let free addresses fill the pool; the cap must reach it.
        if (unbondDelay_ > MAX_DELAY || minVerifierStake_ == 0 || sortitionCap_ < minVerifierStake_) {
            revert InvalidParams();
        }
        token = token_;
        unbondDelay = unbondDelay_;
        minSolverStake = minSolverStake_;
        minVerifierStake = minVerifierStake_;
        sortitionCap = sortitionCap_;
    }

    /// @notice Wire the market, the dispute game and the outer jury. Once, by the owner.
    function setAuthorized(address market_, address dispute_, address outerJury_) external onlyOwner {
        // INVARIANT: the slashing authorities are fixed once set.
        if (market != address(0) || dispute != address(0)) revert AlreadyAuthorized();
        if (market_ == address(0) || dispute_ == address(0) || outerJury_ == address(0)) revert ZeroAddress();
        market = market_;
        dispute = dispute_;
        outerJury = outerJury_;
        emit Authorized(market_, dispute_, outerJury_);
    }

    // --- node actions ---

    function register(uint8 roles, string calldata peerId, string[] calldata multiaddrs, string calldata profile)
        external
    {
        Rec storage n = _nodes[msg.sender];
        if (n.registered) revert AlreadyRegistered(msg.sender);
        _checkIdentity(roles, peerId);
        n.registered = true;
        n.registeredAt = uint40(block.timestamp);
        _setIdentity(n, roles, peerId, multiaddrs, profile);
        _changed(msg.sender, n);
        emit NodeRegistered(msg.sender, roles, peerId, multiaddrs, profile);
    }

    function updateNode(uint8 roles, string calldata peerId, string[] calldata multiaddrs, string calldata profile)
        external
    {
        Rec storage n = _nodes[msg.sender];
        if (!n.registered) revert NotRegistered(msg.sender);
        _checkIdentity(roles, peerId);
        bool rolesChanged = n.roles != roles;
        _setIdentity(n, roles, peerId, multiaddrs, profile);
        // New addresses (a restarted node's new port) change nothing a draw looks at.
        if (rolesChanged) {
            n.changedAt = uint40(block.number);
            _changed(msg.sender, n);
        }
        emit NodeUpdated(msg.sender, roles, peerId, multiaddrs, profile);
    }

    function stake(uint256 amount) external nonReentrant {
        Rec storage n = _nodes[msg.sender];
        if (!n.registered) revert NotRegistered(msg.sender);
        if (amount == 0) revert ZeroAmount();
        // uint96: free, locked and seat-locked stake share one word (none can wrap).
        uint256 room = type(uint96).max - _totalStaked;
        if (amount > room) revert StakeTooLarge(amount, room);
        n.freeStake += uint96(amount);
        _totalStaked += amount;
        _changed(msg.sender, n);
        token.safeTransferFrom(msg.sender, address(this), amount);
        emit Staked(msg.sender, amount, n.freeStake);
    }

    function requestUnbond(uint256 amount) external {
        Rec storage n = _nodes[msg.sender];
        if (amount == 0) revert ZeroAmount();
        // INVARIANT: locked stake (bonds) can never be unbonded.
        if (n.freeStake < amount) revert InsufficientFreeStake(msg.sender, n.freeStake, amount);
        n.freeStake -= uint96(amount);
        n.unbondingStake += amount;
        n.unbondAvailableAt = uint40(block.timestamp + unbondDelay);
        _changed(msg.sender, n);
        emit UnbondRequested(msg.sender, amount, n.unbondingStake, uint64(n.unbondAvailableAt));
    }

    function withdrawUnbonded() external nonReentrant returns (uint256 amount) {
        Rec storage n = _nodes[msg.sender];
        amount = n.unbondingStake;
        if (amount == 0) revert NothingToWithdraw();
        // INVARIANT: unbonding stake stays slashable for unbondDelay.
        if (block.timestamp < n.unbondAvailableAt) revert UnbondNotReady(n.unbondAvailableAt);
        n.unbondingStake = 0;
        _totalStaked -= amount;
        _changed(msg.sender, n);
        token.safeTransfer(msg.sender, amount);
        emit UnbondWithdrawn(msg.sender, amount);
    }

    // --- market / dispute only ---

    function lock(address node, uint256 amount) external onlyAuthorized {
        _lock(node, _nodes[node], amount);
    }

    function lockIfSolver(address node, uint256 amount) external onlyAuthorized returns (bool) {
        if (!_hasRole(node, SOLVER, minSolverStake)) return false;
        if (amount != 0) _lock(node, _nodes[node], amount);
        return true;
    }

    function _lock(address node, Rec storage n, uint256 amount) internal {
        if (n.freeStake < amount) revert InsufficientFreeStake(node, n.freeStake, amount);
        n.freeStake -= uint96(amount);
        n.lockedStake += uint96(amount);
        _changed(node, n);
        emit StakeLocked(node, amount, msg.sender);
    }

    function unlock(address node, uint256 amount) external onlyAuthorized {
        Rec storage n = _nodes[node];
        if (n.lockedStake < amount) revert InsufficientLockedStake(node, n.lockedStake, amount);
        n.lockedStake -= uint96(amount);
        n.freeStake += uint96(amount);
        _changed(node, n);
        emit StakeUnlocked(node, amount, msg.sender);
    }

    function slash(address node, uint256 amount, address to)
        external
        onlyAuthorized
        nonReentrant
        returns (uint256 slashed)
    {
        _checkRecipient(to);
        Rec storage n = _nodes[node];
        slashed = amount < n.lockedStake ? amount : n.lockedStake;
        n.lockedStake -= uint96(slashed);
        _changed(node, n);
        emit Slashed(node, slashed, to, true);
        _payOut(slashed, to);
    }

    function slashUnlocked(address node, uint256 amount, address to)
        external
        onlySlasher
        nonReentrant
        returns (uint256 slashed)
    {
        _checkRecipient(to);
        slashed = _takeUnlocked(node, amount, to);
        _payOut(slashed, to);
    }

    function slashUnlockedBatch(address[] calldata nodes, uint256 amount, address to)
        external
        onlyAuthorized
        nonReentrant
        returns (uint256[] memory slashed)
    {
        _checkRecipient(to);
        slashed = new uint256[](nodes.length);
        uint256 total;
        for (uint256 i; i < nodes.length; ++i) {
            uint256 s = _takeUnlocked(nodes[i], amount, to);
            slashed[i] = s;
            total += s;
        }
        _payOut(total, to);
    }

    function drawSeats(
        bytes32 seed,
        uint256 want,
        uint256 poolLen,
        uint256 snapshotBlock,
        address[] calldata exclude,
        uint256 seatLock,
        uint256 minSeats
    ) external onlySlasher returns (address[] memory picked) {
        uint256 units = _units(seatLock);
        picked = _draw(seed, want, poolLen, snapshotBlock, exclude, units * SEAT_UNIT);
        if (picked.length < minSeats || units == 0) return picked;
        for (uint256 i; i < picked.length; ++i) {
            Rec storage n = _nodes[picked[i]];
            // INVARIANT: a seat's slashable amount is out of the node's reach until the
            // seat ends; free + seat-locked (its draw weight) does not move.
            n.freeStake -= uint96(units * SEAT_UNIT);
            n.seatUnits += uint64(units);
        }
        emit SeatsLocked(picked, units * SEAT_UNIT, msg.sender);
    }

    /// @inheritdoc INodeRegistry
    function snapshot() external onlySlasher returns (uint256 poolLen) {
        _lastSnap = uint64(block.number);
        return _poolSize;
    }

    function closeSeats(address[] calldata nodes, uint256 amount, uint256 slashMask, address to)
        external
        onlySlasher
        nonReentrant
        returns (uint256[] memory slashed)
    {
        if (slashMask != 0) _checkRecipient(to);
        slashed = new uint256[](nodes.length);
        uint256 units = _units(amount);
        uint256 total;
        for (uint256 i; i < nodes.length; ++i) {
            Rec storage n = _nodes[nodes[i]];
            uint256 seat = n.seatUnits;
            uint256 u = units < seat ? units : seat;
            n.seatUnits = uint64(seat - u);
            if ((slashMask >> i) & 1 != 0) {
                slashed[i] = u * SEAT_UNIT;
                total += u * SEAT_UNIT;
                _changed(nodes[i], n);
                emit Slashed(nodes[i], u * SEAT_UNIT, to, true);
            } else {
                n.freeStake += uint96(u * SEAT_UNIT);
            }
        }
        _payOut(total, to);
        // One event for the batch (each slashed seat also has its Slashed).
        emit SeatsClosed(nodes, units * SEAT_UNIT, slashMask, msg.sender);
    }

    // --- views ---

    function nodeOf(address node) external view returns (Node memory out) {
        Rec storage n = _nodes[node];
        out = Node({
            registered: n.registered,
            roles: n.roles,
            registeredAt: n.registeredAt,
            unbondAvailableAt: n.unbondAvailableAt,
            changedAt: n.changedAt,
            freeStake: n.freeStake,
            lockedStake: n.lockedStake,
            unbondingStake: n.unbondingStake,
            seatLockedStake: uint256(n.seatUnits) * SEAT_UNIT,
            peerId: n.peerId,
            multiaddrs: n.multiaddrs,
            profile: n.profile
        });
    }

    function isRegistered(address node) external view returns (bool) {
        return _nodes[node].registered;
    }

    function freeStake(address node) external view returns (uint256) {
        return _nodes[node].freeStake;
    }

    function lockedStake(address node) external view returns (uint256) {
        return _nodes[node].lockedStake;
    }

    function unbondingStake(address node) external view returns (uint256) {
        return _nodes[node].unbondingStake;
    }

    function seatLockedStake(address node) external view returns (uint256) {
        return uint256(_nodes[node].seatUnits) * SEAT_UNIT;
    }

    function isSolver(address node) external view returns (bool) {
        return _hasRole(node, SOLVER, minSolverStake);
    }

    function isVerifier(address node) external view returns (bool) {
        return _isVerifier(_nodes[node]);
    }

    function verifierCount() external view returns (uint256) {
        return _pool.length;
    }

    function verifierAt(uint256 i) external view returns (address) {
        return _pool[i];
    }

    function sortition(
        bytes32 seed,
        uint256 want,
        uint256 poolLen,
        uint256 snapshotBlock,
        address[] calldata exclude
    ) external view returns (address[] memory picked) {
        return _draw(seed, want, poolLen, snapshotBlock, exclude, 0);
    }

    /// @inheritdoc INodeRegistry
    function weightsAt(uint256 poolLen, uint256 snapshotBlock) external view returns (uint256[] memory w) {
        if (poolLen > _poolSize) poolLen = _poolSize;
        w = new uint256[](poolLen);
        uint256 prev;
        for (uint256 j = 1; j <= poolLen; ++j) {
            uint256 p = _tree.totalAt(j, snapshotBlock);
            w[j - 1] = p - prev;
            prev = p;
        }
    }

    function totalOwed() external view returns (uint256) {
        return _totalStaked;
    }

    // --- internals ---

    /// @dev `sortition`, also skipping nodes whose free stake now cannot cover `seatLock`.
    function _draw(
        bytes32 seed,
        uint256 want,
        uint256 poolLen,
        uint256 snapshotBlock,
        address[] calldata exclude,
        uint256 seatLock
    ) internal view returns (address[] memory picked) {
        if (poolLen > _poolSize) poolLen = _poolSize;
        if (snapshotBlock > type(uint32).max) snapshotBlock = type(uint32).max; // the tree's tags
        picked = new address[](want < poolLen ? want : poolLen);
        // INVARIANT: the tree is read as of the snapshot, so no move after it shifts
        // where a try lands; dead slots weigh 0 and are never landed on.
        uint256 got;
        // (Stack room: from here `poolLen` carries total weight << 128 | poolLen << 64 |
        // snapshotBlock for `_land`, and `cut.length` is the number of tries.)
        {
            uint256 total = poolLen == 0 ? 0 : _tree.totalAt(poolLen, snapshotBlock);
            want = total == 0 ? 0 : want * DRAW_ATTEMPTS;
            poolLen = (total << 128) | (poolLen << 64) | uint64(snapshotBlock);
        }
        // Each landed slot's range of the prefix sums, (start << 128) | weight, sorted: a
        // later try draws from what is left, so it never lands on a slot twice.
        uint256[] memory cut = new uint256[](want);
        for (uint256 i; i < cut.length && got < picked.length; ++i) {
            address a = _land(cut, i, poolLen, seed);
            if (a == address(0)) break; // every slot with weight landed on
            if (_containsCd(exclude, a) || !_drawable(_nodes[a], snapshotBlock, seatLock)) continue;
            picked[got++] = a;
        }
        assembly ("memory-safe") {
            mstore(picked, got)
        }
    }

    /// @dev Try `i`: the slot at point keccak256(seed, i) % (what no earlier try landed on)
    ///      of the prefix sums as of `snap`, skipping the ranges in `cut[0..i)`, which it
    ///      joins. address(0) once nothing is left.
    function _land(uint256[] memory cut, uint256 i, uint256 ctx, bytes32 seed) internal view returns (address a) {
        // Unchecked: the cut ranges are disjoint parts of the total (< 2^53 weight units),
        // x stays below the total and i below cut.length.
        unchecked {
            uint256 total = ctx >> 128;
            uint256 gone;
            for (uint256 k; k < i; ++k) {
                gone += uint128(cut[k]);
            }
            if (gone >= total) return address(0);
            uint256 x = uint256(keccak256(abi.encode(seed, i))) % (total - gone);
            for (uint256 k; k < i; ++k) {
                uint256 c = cut[k];
                if (x < c >> 128) break;
                x += uint128(c);
            }
            uint256 snap = uint64(ctx);
            (uint256 slot, uint256 into, uint256 leaf) = _tree.find(uint64(ctx >> 64), snap, x);
            uint256 e = ((x - into) << 128) | leaf;
            uint256 j = i;
            for (; j > 0 && cut[j - 1] > e; --j) {
                cut[j] = cut[j - 1];
            }
            cut[j] = e;
            // _pool[slot - 1] without the bounds check's read of the length: the tree's
            // slots are 1.._poolSize and _poolSize == _pool.length.
            assembly ("memory-safe") {
                mstore(0, _pool.slot)
                a := sload(add(keccak256(0, 32), sub(slot, 1)))
            }
        }
    }

    /// @dev A node that moved after the snapshot is skipped (it opted out; its weight as of
    ///      the snapshot still holds its place, so no one else's try moves), and so is one
    ///      whose free stake cannot cover its seat.
    function _drawable(Rec storage n, uint256 snap, uint256 seatLock) internal view returns (bool) {
        return n.changedAt <= snap && _isVerifier(n) && n.freeStake >= seatLock;
    }

    function _hasRole(address node, uint8 role, uint256 minStake) internal view returns (bool) {
        Rec storage n = _nodes[node];
        if (!n.registered || (n.roles & role) == 0) return false;
        return uint256(n.freeStake) + n.lockedStake >= minStake;
    }

    function _isVerifier(Rec storage n) internal view returns (bool) {
        return n.registered && (n.roles & VERIFIER) != 0
            && uint256(n.freeStake) + uint256(n.seatUnits) * SEAT_UNIT >= minVerifierStake;
    }

    /// @dev Whole SEAT_UNITs covering `amount` (rounded up).
    function _units(uint256 amount) internal pure returns (uint256) {
        return (amount + SEAT_UNIT - 1) / SEAT_UNIT;
    }

    /// @dev Record the change block and move the node's draw weight in the tree; a node
    ///      takes a slot the first time it has weight. Only a draw reads the block, and a
    ///      node without the VERIFIER role is never drawn (a role change stamps it,
    ///      `updateNode`): its bonds' moves skip the write.
    function _changed(address node, Rec storage n) internal {
        uint256 old = n.weight;
        if ((n.roles & VERIFIER) == 0 && old == 0) return;
        n.changedAt = uint40(block.number);
        uint256 w;
        if (_isVerifier(n)) {
            uint256 v = uint256(n.freeStake) + uint256(n.seatUnits) * SEAT_UNIT;
            uint256 cap = sortitionCap;
            // Rounded up: every verifier weighs at least one unit, whatever the minimum.
            w = ((v < cap ? v : cap) + WEIGHT_UNIT - 1) / WEIGHT_UNIT;
        }
        if (w == old) return;
        n.weight = uint64(w);
        if (n.slot == 0) {
            uint32 j = _poolSize + 1;
            _poolSize = j;
            n.slot = j;
            _tree.append(j, w);
            _pool.push(node);
        } else {
            _tree.update(n.slot, _poolSize, _lastSnap, old, w);
        }
    }

    function _containsCd(address[] calldata list, address a) internal pure returns (bool) {
        for (uint256 i; i < list.length; ++i) {
            if (list[i] == a) return true;
        }
        return false;
    }

    function _checkIdentity(uint8 roles, string calldata peerId) internal pure {
        if (roles == 0 || roles > (SOLVER | VERIFIER)) revert InvalidRoles(roles);
        if (bytes(peerId).length == 0) revert EmptyPeerId();
    }

    function _setIdentity(
        Rec storage n,
        uint8 roles,
        string calldata peerId,
        string[] calldata multiaddrs,
        string calldata profile
    ) internal {
        n.roles = roles;
        n.peerId = peerId;
        delete n.multiaddrs;
        for (uint256 i; i < multiaddrs.length; ++i) {
            n.multiaddrs.push(multiaddrs[i]);
        }
        n.profile = profile;
    }

    function _checkRecipient(address to) internal view {
        // INVARIANT: slashed tokens only go to a contract that credits them, so the
        // three contracts together still hold exactly what they owe.
        if (to != market && to != dispute && to != outerJury) revert InvalidSlashRecipient(to);
    }

    /// @dev Free, then unbonding stake (never locked); emits Slashed, the caller pays out.
    function _takeUnlocked(address node, uint256 amount, address to) internal returns (uint256 slashed) {
        Rec storage n = _nodes[node];
        uint256 free = n.freeStake;
        uint256 fromFree = amount < free ? amount : free;
        n.freeStake = uint96(free - fromFree);
        uint256 rest = amount - fromFree;
        if (rest != 0) {
            uint256 unbonding = n.unbondingStake;
            uint256 fromUnbonding = rest < unbonding ? rest : unbonding;
            n.unbondingStake = unbonding - fromUnbonding;
            slashed = fromFree + fromUnbonding;
        } else {
            slashed = fromFree;
        }
        _changed(node, n);
        emit Slashed(node, slashed, to, false);
    }

    function _payOut(uint256 amount, address to) internal {
        if (amount == 0) return;
        _totalStaked -= amount;
        if (amount != 0) token.safeTransfer(to, amount);
    }
}
