// A Hardhat Network node (EDR) for polnet's tests on a second EVM besides anvil.
// devnet/hardhat.py starts it with `hardhat node --config devnet/hardhat.config.js`
// and sets these variables; the accounts are the same dev mnemonic anvil uses.
const env = process.env;
const interval = Number(env.POLNET_HH_BLOCK_MS || 0);
module.exports = {
  paths: { cache: env.POLNET_HH_CACHE || "/tmp/polnet-hardhat-cache" },
  networks: {
    hardhat: {
      chainId: Number(env.POLNET_HH_CHAIN_ID || 31338),
      hardfork: "cancun",
      accounts: {
        mnemonic: env.POLNET_HH_MNEMONIC,
        count: Number(env.POLNET_HH_ACCOUNTS || 10),
        accountsBalance: "10000000000000000000000",
      },
      mining: { auto: true, interval: interval > 0 ? interval : 0 },
      blockGasLimit: 30000000,
      allowBlocksWithSameTimestamp: true,
      loggingEnabled: false,
    },
  },
};
