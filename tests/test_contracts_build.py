"""The committed contract artifacts (contracts/out/) are what the sources compile to.

Runs ``node contracts/build.mjs --check``: it recompiles contracts/src with the
pinned solc-js and fails if any artifact is missing, extra or different.
Fix a failure with ``node contracts/build.mjs`` (or ``make contracts``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "contracts" / "out"


def _toolchain_missing() -> str | None:
    if shutil.which("node") is None:
        return "node is not installed: cannot recompile the contracts"
    if not (ROOT / "node_modules" / "solc").is_dir():
        return "node_modules/solc is absent (run `npm ci`): cannot recompile the contracts"
    if not (ROOT / "node_modules" / "@openzeppelin" / "contracts").is_dir():
        return "node_modules/@openzeppelin/contracts is absent (run `npm ci`)"
    return None


def test_artifacts_present_and_well_formed() -> None:
    for name in ("PolToken", "NodeRegistry", "JobMarket", "DisputeGame", "CollabMarket"):
        art = json.loads((OUT / f"{name}.json").read_text())
        assert list(art) == ["contractName", "abi", "bytecode", "deployedBytecode", "compiler"]
        assert art["contractName"] == name
        assert art["bytecode"].startswith("0x") and len(art["bytecode"]) > 2
    errors = json.loads((OUT / "errors.json").read_text())
    assert errors["0x08c379a0"]["name"] == "Error"
    for sel, entry in errors.items():
        assert len(sel) == 10 and entry["name"] and "contract" in entry and "inputs" in entry


EIP170_LIMIT = 24_576  # bytes of runtime code that anvil and every public chain accept


def _with_code() -> list[str]:
    """Every artifact in contracts/out/ that has runtime code."""
    names = []
    for p in sorted(OUT.glob("*.json")):
        art = json.loads(p.read_text())
        if isinstance(art, dict) and len(art.get("deployedBytecode", "0x")) > 2:
            names.append(p.stem)
    return names


@pytest.mark.parametrize("name", _with_code())
def test_deployed_bytecode_under_eip170(name: str) -> None:
    """Growth goes into libraries or separate contracts, never a disabled size limit."""
    code = json.loads((OUT / f"{name}.json").read_text())["deployedBytecode"]
    size = (len(code) - 2) // 2
    assert size <= EIP170_LIMIT, f"{name}: {size} bytes of runtime code > {EIP170_LIMIT}"


def test_size_check_covers_the_deployed_contracts() -> None:
    assert {"PolToken", "NodeRegistry", "JobMarket", "DisputeGame", "OuterJury",
            "CollabMarket"} <= \
        set(_with_code())


def test_build_check_matches_committed_artifacts() -> None:
    reason = _toolchain_missing()
    if reason:
        pytest.skip(reason)
    proc = subprocess.run(
        ["node", "contracts/build.mjs", "--check"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, (
        "contracts/out is stale or the build failed; run `node contracts/build.mjs`\n"
        f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )


# --- cross-check vectors (tests/vectors/, generated from node/proof.py) ---------------

VECTORS = ROOT / "tests" / "vectors"
ANVIL = ROOT / "node_modules" / "@foundry-rs" / "anvil-linux-amd64" / "bin" / "anvil"


def test_vectors_match_node_proof() -> None:
    """The committed vectors are what node/proof.py produces today."""
    import importlib.util  # noqa: PLC0415

    spec = importlib.util.spec_from_file_location("polnet_vectors_gen", VECTORS / "generate.py")
    assert spec and spec.loader
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert json.loads((VECTORS / "trace_vectors.json").read_text()) == gen.trace_vectors()
    assert json.loads((VECTORS / "sampling_vectors.json").read_text()) == gen.sampling_vectors()


def test_solidity_libraries_match_vectors() -> None:
    """TraceLib / SegmentSampler (through LibHarness) on anvil agree with node/proof.py."""
    if not ANVIL.exists():
        pytest.skip(f"anvil binary absent at {ANVIL} (run `npm ci`)")
    import socket  # noqa: PLC0415
    import time  # noqa: PLC0415

    from web3 import Web3  # noqa: PLC0415

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(ANVIL), "--port", str(port), "--silent"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        w3 = Web3(Web3.HTTPProvider(f"http://127.0.0.1:{port}"))
        deadline = time.monotonic() + 20
        while True:
            try:
                if w3.is_connected():
                    break
            except Exception:  # noqa: BLE001 - not up yet
                pass
            if time.monotonic() > deadline:
                pytest.fail("anvil did not start")
            time.sleep(0.1)
        art = json.loads((OUT / "LibHarness.json").read_text())
        factory = w3.eth.contract(abi=art["abi"], bytecode=art["bytecode"])
        rcpt = w3.eth.wait_for_transaction_receipt(
            factory.constructor().transact({"from": w3.eth.accounts[0]}))
        h = w3.eth.contract(address=rcpt["contractAddress"], abi=art["abi"])

        for case in json.loads((VECTORS / "trace_vectors.json").read_text())["cases"]:
            for leaf in case["leaves"]:
                got = h.functions.leafHash(case["job_id"], leaf["index"], leaf["step"],
                                           leaf["state_hash"], leaf["loss_e9"]).call()
                assert "0x" + got.hex() == leaf["leaf_hash"]
                assert h.functions.verifyLeaf(case["root"], case["job_id"], leaf["index"],
                                              case["steps_per_segment"], leaf["state_hash"],
                                              leaf["loss_e9"], leaf["proof"]).call()
                # a wrong loss must not verify
                assert not h.functions.verifyLeaf(case["root"], case["job_id"], leaf["index"],
                                                  case["steps_per_segment"], leaf["state_hash"],
                                                  leaf["loss_e9"] + 1, leaf["proof"]).call()
        for case in json.loads((VECTORS / "sampling_vectors.json").read_text())["cases"]:
            assert h.functions.sample(case["seed"], case["segment_count"], case["n"]).call() \
                == case["segments"], case
            # contains() stops early: it must agree with the whole sample on every segment
            for seg in range(min(case["segment_count"], 80)):
                assert h.functions.contains(case["seed"], case["segment_count"], case["n"],
                                            seg).call() == (seg in case["segments"]), (case, seg)
                # indexOf: the draw position, which picks the committee seat answering for it
                want = case["segments"].index(seg) if seg in case["segments"] else 2**256 - 1
                assert h.functions.indexOf(case["seed"], case["segment_count"], case["n"],
                                           seg).call() == want, (case, seg)
            # a reserved sub-job's sample: the final segment first, then the others'
            assert h.functions.sampleWithFinal(case["seed"], case["segment_count"],
                                               case["n"]).call() == case["with_final"], case
            for seg in range(min(case["segment_count"] + 1, 80)):
                want = (case["with_final"].index(seg) if seg in case["with_final"]
                        else 2**256 - 1)
                assert h.functions.indexOfWithFinal(case["seed"], case["segment_count"],
                                                    case["n"], seg).call() == want, (case, seg)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
