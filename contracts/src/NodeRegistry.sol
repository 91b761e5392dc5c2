// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";
import {ReentrancyGuardTransient} from "@openzeppelin/contracts/utils/ReentrancyGuardTransient.sol";
import {INodeRegistry} from "./interfaces/INodeRegistry.sol";

/// @title NodeRegistry
/// @notice Roles, identities and stake of polnet nodes. See {INodeRegistry}.
/// @dev The owner wires the market and the dispute game once (`setAuthorized`);
///      from then on only they can lock, unlock and slash stake.
contract NodeRegistry is INodeRegistry, Ownable, ReentrancyGuardTransient {
    using SafeERC20 for IERC20;

    uint8 public constant SOLVER = 1;
    uint8 public constant VERIFIER = 2;

    IERC20 public immutable token;
    uint256 public immutable override unbondDelay;
    uint256 public immutable override minSolverStake;
    uint256 public immutable override minVerifierStake;

    address public override market;
    address public override dispute;

    /// @dev Sum of free + locked + unbonding over all nodes; moved with every bucket change.
    uint256 internal _totalStaked;

    mapping(address => Node) internal _nodes;
    address[] internal _verifiers;
    mapping(address => uint256) internal _verifierSlot; // index + 1 in _verifiers, 0 = absent

    modifier onlyAuthorized() {
        // INVARIANT: only the market and the dispute game move locked stake or slash.
        if (msg.sender != market && msg.sender != dispute) revert Unauthorized(msg.sender);
        _;
    }

    constructor(IERC20 token_, uint256 unbondDelay_, uint256 minSolverStake_, uint256 minVerifierStake_)
        Ownable(msg.sender)
    {
        if (address(token_) == address(0)) revert ZeroAddress();
        token = token_;
        unbondDelay = unbondDelay_;
        minSolverStake = minSolverStake_;
        minVerifierStake = minVerifierStake_;
    }

    /// @notice Wire the market and the dispute game. Once, by the owner.
    function setAuthorized(address market_, address dispute_) external onlyOwner {
        // INVARIANT: the slashing authorities are fixed once set.
        if (market != address(0) || dispute != address(0)) revert AlreadyAuthorized();
        if (market_ == address(0) || dispute_ == address(0)) revert ZeroAddress();
        market = market_;
        dispute = dispute_;
        emit Authorized(market_, dispute_);
    }

    // --- node actions ---

    function register(uint8 roles, string calldata peerId, string[] calldata multiaddrs, string calldata profile)
        external
    {
        Node storage n = _nodes[msg.sender];
        if (n.registered) revert AlreadyRegistered(msg.sender);
        _checkIdentity(roles, peerId);
        n.registered = true;
        n.registeredAt = uint64(block.timestamp);
        _setIdentity(n, roles, peerId, multiaddrs, profile);
        emit NodeRegistered(msg.sender, roles, peerId, multiaddrs, profile);
    }

    function updateNode(uint8 roles, string calldata peerId, string[] calldata multiaddrs, string calldata profile)
        external
    {
        Node storage n = _nodes[msg.sender];
        if (!n.registered) revert NotRegistered(msg.sender);
        _checkIdentity(roles, peerId);
        _setIdentity(n, roles, peerId, multiaddrs, profile);
        emit NodeUpdated(msg.sender, roles, peerId, multiaddrs, profile);
    }

    function stake(uint256 amount) external nonReentrant {
        Node storage n = _nodes[msg.sender];
        if (!n.registered) revert NotRegistered(msg.sender);
        if (amount == 0) revert ZeroAmount();
        n.freeStake += amount;
        _totalStaked += amount;
        token.safeTransferFrom(msg.sender, address(this), amount);
        emit Staked(msg.sender, amount, n.freeStake);
    }

    function requestUnbond(uint256 amount) external {
        Node storage n = _nodes[msg.sender];
        if (amount == 0) revert ZeroAmount();
        // INVARIANT: locked stake (bonds) can never be unbonded.
        if (n.freeStake < amount) revert InsufficientFreeStake(msg.sender, n.freeStake, amount);
        n.freeStake -= amount;
        n.unbondingStake += amount;
        n.unbondAvailableAt = uint64(block.timestamp + unbondDelay);
        emit UnbondRequested(msg.sender, amount, n.unbondingStake, n.unbondAvailableAt);
    }

    function withdrawUnbonded() external nonReentrant returns (uint256 amount) {
        Node storage n = _nodes[msg.sender];
        amount = n.unbondingStake;
        if (amount == 0) revert NothingToWithdraw();
        // INVARIANT: unbonding stake stays slashable for unbondDelay.
        if (block.timestamp < n.unbondAvailableAt) revert UnbondNotReady(n.unbondAvailableAt);
        n.unbondingStake = 0;
        _totalStaked -= amount;
        token.safeTransfer(msg.sender, amount);
        emit UnbondWithdrawn(msg.sender, amount);
    }

    // --- market / dispute only ---

    function lock(address node, uint256 amount) external onlyAuthorized {
        Node storage n = _nodes[node];
        if (n.freeStake < amount) revert InsufficientFreeStake(node, n.freeStake, amount);
        n.freeStake -= amount;
        n.lockedStake += amount;
        emit StakeLocked(node, amount, msg.sender);
    }

    function unlock(address node, uint256 amount) external onlyAuthorized {
        Node storage n = _nodes[node];
        if (n.lockedStake < amount) revert InsufficientLockedStake(node, n.lockedStake, amount);
        n.lockedStake -= amount;
        n.freeStake += amount;
        emit StakeUnlocked(node, amount, msg.sender);
    }

    function slash(address node, uint256 amount, address to)
        external
        onlyAuthorized
        nonReentrant
        returns (uint256 slashed)
    {
        _checkRecipient(to);
        Node storage n = _nodes[node];
        slashed = amount < n.lockedStake ? amount : n.lockedStake;
        n.lockedStake -= slashed;
        emit Slashed(node, slashed, to, true);
        _payOut(slashed, to);
    }

    function slashUnlocked(address node, uint256 amount, address to)
        external
        onlyAuthorized
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

    // --- views ---

    function nodeOf(address node) external view returns (Node memory) {
        return _nodes[node];
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

    function isSolver(address node) external view returns (bool) {
        return _hasRole(node, SOLVER, minSolverStake);
    }

    function isVerifier(address node) external view returns (bool) {
        return _hasRole(node, VERIFIER, minVerifierStake);
    }

    function verifierCount() external view returns (uint256) {
        return _verifiers.length;
    }

    function verifierAt(uint256 i) external view returns (address) {
        return _verifiers[i];
    }

    function verifierAtIfEligible(uint256 i) external view returns (address node, bool eligible) {
        node = _verifiers[i];
        eligible = _hasRole(node, VERIFIER, minVerifierStake);
    }

    function totalOwed() external view returns (uint256) {
        return _totalStaked;
    }

    // --- internals ---

    function _hasRole(address node, uint8 role, uint256 minStake) internal view returns (bool) {
        Node storage n = _nodes[node];
        if (!n.registered || (n.roles & role) == 0) return false;
        uint256 free = n.freeStake;
        return free >= minStake || free + n.lockedStake >= minStake;
    }

    function _checkIdentity(uint8 roles, string calldata peerId) internal pure {
        if (roles == 0 || roles > (SOLVER | VERIFIER)) revert InvalidRoles(roles);
        if (bytes(peerId).length == 0) revert EmptyPeerId();
    }

    function _setIdentity(
        Node storage n,
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
        bool listed = _verifierSlot[msg.sender] != 0;
        bool wants = (roles & VERIFIER) != 0;
        if (wants && !listed) {
            _verifiers.push(msg.sender);
            _verifierSlot[msg.sender] = _verifiers.length;
        } else if (!wants && listed) {
            uint256 idx = _verifierSlot[msg.sender] - 1;
            address last = _verifiers[_verifiers.length - 1];
            _verifiers[idx] = last;
            _verifierSlot[last] = idx + 1;
            _verifiers.pop();
            _verifierSlot[msg.sender] = 0;
        }
    }

    function _checkRecipient(address to) internal view {
        // INVARIANT: slashed tokens only go to a contract that credits them, so the
        // three contracts together still hold exactly what they owe.
        if (to != market && to != dispute) revert InvalidSlashRecipient(to);
    }

    /// @dev Free, then unbonding stake (never locked); emits Slashed, the caller pays out.
    function _takeUnlocked(address node, uint256 amount, address to) internal returns (uint256 slashed) {
        Node storage n = _nodes[node];
        uint256 free = n.freeStake;
        uint256 fromFree = amount < free ? amount : free;
        n.freeStake = free - fromFree;
        uint256 rest = amount - fromFree;
        if (rest != 0) {
            uint256 unbonding = n.unbondingStake;
            uint256 fromUnbonding = rest < unbonding ? rest : unbonding;
            n.unbondingStake = unbonding - fromUnbonding;
            slashed = fromFree + fromUnbonding;
        } else {
            slashed = fromFree;
        }
        emit Slashed(node, slashed, to, false);
    }

    function _payOut(uint256 amount, address to) internal {
        _totalStaked -= amount;
        if (amount != 0) token.safeTransfer(to, amount);
    }
}
