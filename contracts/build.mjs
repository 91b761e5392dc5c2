#!/usr/bin/env node
// Compile contracts/src with solc-js (standard JSON) and write one artifact per
// contract to contracts/out/<Name>.json plus contracts/out/errors.json.
//
//   node contracts/build.mjs          build, (re)write contracts/out/
//   node contracts/build.mjs --check  build into a temp dir, exit 1 if any file in
//                                     contracts/out/ differs, is missing or is extra
//
// Output is deterministic: fixed compiler settings, sources fed in sorted order,
// relative source unit names (no absolute paths reach the metadata), object keys
// sorted, two-space indent and a trailing newline.

import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const require = createRequire(import.meta.url);
const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(HERE, '..');
const SRC = path.join(HERE, 'src');
const OUT = path.join(HERE, 'out');
const NODE_MODULES = path.join(ROOT, 'node_modules');

const solc = require(path.join(NODE_MODULES, 'solc'));

// Changing any of these changes every artifact: keep them fixed.
const SETTINGS = {
  evmVersion: 'cancun',
  metadata: { bytecodeHash: 'ipfs' },
  optimizer: { enabled: true, runs: 200 },
  outputSelection: { '*': { '*': ['abi', 'evm.bytecode.object', 'evm.deployedBytecode.object'] } },
  remappings: [],
  // viaIR (issue 30's third gas pass): the IR pipeline's optimizer cut ~3% off a
  // dispute's gas and ~10% off the runtime code; it compiles slower under solc-js.
  viaIR: true,
};

// Per-contract optimizer runs (unit -> [name, runs]); every other contract keeps SETTINGS.
// Runs 1 compiles a contract at the 24,576-byte limit for size (a little more gas per call,
// less code); more runs trade code for gas on the contracts a dispute and a draw run most
// (NodeRegistry: the sortition walk; DisputeGame: every move; JobMarket: 1,000, as at
// 10,000 it passes the size limit).
const RUNS = {
  'src/DisputeGame.sol': ['DisputeGame', 10000],
  'src/JobMarket.sol': ['JobMarket', 1000],
  'src/NodeRegistry.sol': ['NodeRegistry', 10000],
};
const settingsFor = (runs) => ({ ...SETTINGS, optimizer: { enabled: true, runs } });

function listSources(dir) {
  const out = [];
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, entry.name);
    if (entry.isDirectory()) out.push(...listSources(p));
    else if (entry.name.endsWith('.sol')) out.push(p);
  }
  return out.sort();
}

function findImports(importPath) {
  let file;
  if (importPath.startsWith('@openzeppelin/')) file = path.join(NODE_MODULES, importPath);
  else if (importPath.startsWith('src/')) file = path.join(HERE, importPath);
  else return { error: `unresolvable import ${importPath}` };
  try {
    return { contents: fs.readFileSync(file, 'utf8') };
  } catch (e) {
    return { error: `cannot read ${importPath}: ${e.message}` };
  }
}

function sortKeys(v) {
  if (Array.isArray(v)) return v.map(sortKeys);
  if (v && typeof v === 'object') {
    const o = {};
    for (const k of Object.keys(v).sort()) o[k] = sortKeys(v[k]);
    return o;
  }
  return v;
}

const dump = (obj) => JSON.stringify(obj, null, 2) + '\n';

function errorSignature(e) {
  const typ = (i) => {
    if (i.type.startsWith('tuple')) {
      return `(${i.components.map(typ).join(',')})${i.type.slice('tuple'.length)}`;
    }
    return i.type;
  };
  return `${e.name}(${e.inputs.map(typ).join(',')})`;
}

function selector(sig) {
  return '0x' + keccakHex(sig).slice(0, 8);
}

// js-sha3 ships with solc-js (its own dependency): no extra package needed.
const { keccak256: keccakHex } = require(require.resolve('js-sha3', { paths: [path.join(NODE_MODULES, 'solc')] }));

function compile() {
  const sources = {};
  for (const file of listSources(SRC)) {
    const unit = path.relative(HERE, file).split(path.sep).join('/'); // "src/X.sol"
    sources[unit] = { content: fs.readFileSync(file, 'utf8') };
  }
  const run = (settings, warn) => {
    const input = { language: 'Solidity', sources, settings };
    const out = JSON.parse(solc.compile(JSON.stringify(input), { import: findImports }));
    const errors = (out.errors || []).filter((e) => e.severity === 'error');
    for (const e of out.errors || []) {
      if (warn && e.severity !== 'error') process.stderr.write(`warning: ${e.formattedMessage || e.message}\n`);
    }
    if (errors.length) {
      for (const e of errors) process.stderr.write(`${e.formattedMessage || e.message}\n`);
      throw new Error(`solc: ${errors.length} error(s)`);
    }
    return out;
  };
  const output = run(SETTINGS, true);
  const tuned = {};
  for (const [unit, [name, runs]] of Object.entries(RUNS)) {
    const selection = { [unit]: { [name]: SETTINGS.outputSelection['*']['*'] } };
    tuned[unit] = run({ ...settingsFor(runs), outputSelection: selection }, false).contracts[unit][name];
  }
  const version = solc.version();
  const files = {};
  const errorTable = {
    // Built-in revert payloads, so a client can decode every revert from one table.
    '0x08c379a0': { contract: 'solidity', contracts: ['solidity'], inputs: [{ name: 'message', type: 'string' }], name: 'Error', signature: 'Error(string)' },
    '0x4e487b71': { contract: 'solidity', contracts: ['solidity'], inputs: [{ name: 'code', type: 'uint256' }], name: 'Panic', signature: 'Panic(uint256)' },
  };
  const names = new Set();
  const deployable = new Set();
  for (const unit of Object.keys(output.contracts || {}).sort()) {
    if (!unit.startsWith('src/')) continue; // OpenZeppelin units: no artifacts of their own
    for (const name of Object.keys(output.contracts[unit]).sort()) {
      if (names.has(name)) throw new Error(`duplicate contract name ${name}`);
      names.add(name);
      const own = RUNS[unit] && RUNS[unit][0] === name;
      const c = own ? tuned[unit] : output.contracts[unit][name];
      const abi = sortKeys(c.abi);
      files[`${name}.json`] = dump({
        contractName: name,
        abi,
        bytecode: '0x' + c.evm.bytecode.object,
        deployedBytecode: '0x' + c.evm.deployedBytecode.object,
        compiler: { version, settings: sortKeys(own ? settingsFor(RUNS[unit][1]) : SETTINGS) },
      });
      for (const item of abi) {
        if (item.type !== 'error') continue;
        const sig = errorSignature(item);
        const sel = selector(sig);
        const entry = errorTable[sel];
        if (entry) {
          if (entry.signature !== sig) throw new Error(`selector clash ${sel}: ${sig} vs ${entry.signature}`);
          if (!entry.contracts.includes(name)) entry.contracts.push(name);
          entry.contracts.sort();
        } else {
          errorTable[sel] = { contract: name, contracts: [name], inputs: item.inputs, name: item.name, signature: sig };
        }
        if (c.evm.bytecode.object) deployable.add(name);
      }
    }
  }
  const sortedErrors = {};
  for (const sel of Object.keys(errorTable).sort()) {
    const e = errorTable[sel];
    // `contract`: the first deployable contract that can raise it (else the first declarer).
    e.contract = e.contracts.find((n) => deployable.has(n)) || e.contracts[0];
    sortedErrors[sel] = sortKeys(e);
  }
  files['errors.json'] = dump(sortedErrors);
  return files;
}

function main() {
  const check = process.argv.includes('--check');
  const files = compile();
  if (!check) {
    fs.mkdirSync(OUT, { recursive: true });
    for (const f of fs.readdirSync(OUT)) if (f.endsWith('.json') && !(f in files)) fs.unlinkSync(path.join(OUT, f));
    for (const [f, text] of Object.entries(files)) fs.writeFileSync(path.join(OUT, f), text);
    process.stdout.write(`wrote ${Object.keys(files).length} files to ${path.relative(ROOT, OUT)}/\n`);
    return;
  }
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'polnet-contracts-'));
  try {
    for (const [f, text] of Object.entries(files)) fs.writeFileSync(path.join(tmp, f), text);
    const committed = fs.existsSync(OUT) ? fs.readdirSync(OUT).filter((f) => f.endsWith('.json')).sort() : [];
    const problems = [];
    for (const f of Object.keys(files).sort()) {
      if (!committed.includes(f)) problems.push(`missing: contracts/out/${f}`);
      else if (fs.readFileSync(path.join(OUT, f), 'utf8') !== files[f]) problems.push(`differs: contracts/out/${f}`);
    }
    for (const f of committed) if (!(f in files)) problems.push(`extra: contracts/out/${f}`);
    if (problems.length) {
      process.stderr.write(problems.join('\n') + '\nartifacts are stale: run `node contracts/build.mjs`\n');
      process.exit(1);
    }
    process.stdout.write(`contracts/out is up to date (${committed.length} files)\n`);
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

main();
