// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {ERC20} from "@openzeppelin/contracts/token/ERC20/ERC20.sol";
import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";

/// @title PolToken
/// @notice The polnet stake and payment token ("Polnet Token", "POL", 18 decimals).
/// @dev The deployer owns it and is the only minter (a devnet faucet, not an
///      emission schedule). Plain OpenZeppelin ERC-20: no transfer hooks, no fees.
contract PolToken is ERC20, Ownable {
    constructor() ERC20("Polnet Token", "POL") Ownable(msg.sender) {}

    /// @notice Mint `amount` tokens to `to`. Only the owner.
    function mint(address to, uint256 amount) external onlyOwner {
        _mint(to, amount);
    }
}
