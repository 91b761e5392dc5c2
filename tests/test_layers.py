"""The layering of docs/architecture.md, checked on every import in node/, verifier/
and devnet/ (deferred ones included): a part imports only from parts in lower
layers, and no file imports itself back through others."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Bottom to top; a part may import from any part in a lower layer, never from its own
# layer or above. The picture and the reasons are in docs/architecture.md.
LAYERS: list[set[str]] = [
    {"errors"},
    {"units", "proof", "boundary", "logs", "childenv", "fsutil"},
    {"spec_hf", "tensorfile", "incentives", "event_text"},
    {"spec", "datasets"},
    {"dataset_formats", "store", "chain"},
    {"p2p", "train"},
    {"behaviors", "data", "config"},
    {"verifier", "devnet"},
    {"roles", "explorer"},
    {"demo"},
    {"demo_collab"},
    {"cli"},
]
RANK = {part: i for i, layer in enumerate(LAYERS) for part in layer}


def part_of(module: str) -> str | None:
    """node.X.* -> X; verifier.* -> verifier; devnet.* -> devnet; others: not ours."""
    head, _, rest = module.partition(".")
    if head in ("verifier", "devnet"):
        return head
    if head == "node" and rest:
        return rest.split(".")[0]
    return None


def module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every absolute import in the file, top-level or deferred (`from a import b` may
    name a module a.b: both are returned, the graph keeps those that are files)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def sources() -> dict[str, Path]:
    files = [p for top in ("node", "verifier", "devnet") for p in (ROOT / top).rglob("*.py")]
    return {module_of(p): p for p in files}


def test_every_part_has_a_layer() -> None:
    parts = {p for p in map(part_of, sources()) if p is not None}
    assert parts <= set(RANK), f"parts with no layer in LAYERS: {sorted(parts - set(RANK))}"


def test_no_part_imports_its_own_layer_or_above() -> None:
    bad = []
    for mod, path in sorted(sources().items()):
        src = part_of(mod)
        if src is None:  # node/__init__.py: the package itself
            continue
        for target in imports(path):
            dst = part_of(target)
            if dst is not None and dst != src and RANK[dst] >= RANK[src]:
                bad.append(f"{mod} -> {target} ({src}: layer {RANK[src]}, "
                           f"{dst}: layer {RANK[dst]})")
    assert not bad, "imports against the layering:\n" + "\n".join(sorted(set(bad)))


def test_no_import_cycle_between_files() -> None:
    mods = sources()
    graph: dict[str, set[str]] = defaultdict(set)
    for mod, path in mods.items():
        for target in imports(path):
            # a package's __init__ is not the files under it: `import node.chain.x`
            # runs node.chain's __init__, but nothing in it names x
            if target in mods and target != mod:
                graph[mod].add(target)
    cycles = strongly_connected(graph)
    assert not cycles, "import cycles between files:\n" + "\n".join(
        " -> ".join(sorted(c)) for c in cycles)


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative: the components with more than one file."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[set[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, todo = work[-1]
            if todo:
                w = todo.pop()
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, sorted(graph.get(w, ()))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(comp)
    return out


def test_the_checks_see_a_cycle_and_a_layer_breach() -> None:
    """The checks above can fail: a two-file cycle is found, and roles is above chain."""
    assert strongly_connected({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [{"a", "b"}]
    assert RANK["chain"] < RANK["roles"] and part_of("node.roles.solver") == "roles"
