"""The import check: every import of ours points down the layers of docs/architecture.md, no
module cycle exists (imports inside functions and under TYPE_CHECKING count too), nothing looks
up our own modules by name, and the processes that need no torch import none.

It reads the source (ast), so it sees the delayed imports that a cycle hides behind."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("runtime", "radix", "scheduler", "detokenizer", "tokenizer", "kernels")

# Layer groups, bottom first. A module belongs to the longest prefix that names it; it may import
# its own group and any group of a lower rank (a group of the same rank is a sibling: no arrow).
LAYERS: dict[str, int] = {
    "runtime.contracts": 0,
    "radix": 0,
    "runtime.support": 1,
    "detokenizer.incremental": 1,
    "kernels": 2,
    "runtime.parallel": 3,
    "runtime.models": 4,
    "runtime.execution": 5,
    "scheduler": 6,
    "detokenizer": 6,
    "tokenizer": 7,
}
# Names kept where the README gives them, re-exporting from above or below. Nothing of ours may
# import them, so no cycle can run through them.
FACADES = {"runtime", "runtime.default_model", "runtime.__main__"}

# Modules whose import must leave torch unloaded: the HTTP process, the detokenizer, the
# scheduler's logic (its process entry and the runner it builds are the torch part, and so is the
# KV tier, which copies K/V and is imported only when it is on), the pure data structures and the
# contracts.
TORCH_FREE_GROUPS = ("tokenizer", "detokenizer", "radix", "runtime.contracts", "runtime.support", "scheduler")
TORCH_USERS = {"tokenizer.engine", "scheduler.process", "scheduler.kv_tier"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def our_modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            found[module_name(path)] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ours that `name` imports anywhere in its source (`from a import b` counts as
    a.b when b is a module, else as a)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.add(sub if sub in known else base)
    deps = set()
    for target in targets:
        while target and target not in known:  # `import a.b.c` of a name inside a module
            target = target.rpartition(".")[0]
        if target and target != name:
            deps.add(target)
    return deps


def layer_of(name: str) -> tuple[str, int]:
    for prefix in sorted(LAYERS, key=len, reverse=True):
        if name == prefix or name.startswith(prefix + "."):
            return prefix, LAYERS[prefix]
    raise AssertionError(f"{name} belongs to no layer: add it to LAYERS (and docs/architecture.md)")


def graph() -> dict[str, set[str]]:
    modules = our_modules()
    return {name: imports_of(name, path, set(modules)) for name, path in modules.items()}


def upward_arrows(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for name, deps in edges.items():
        if name in FACADES:
            continue
        group, rank = layer_of(name)
        for dep in deps:
            if dep in FACADES:
                bad.append(f"{name} -> {dep} (a facade: import the module it re-exports)")
                continue
            dep_group, dep_rank = layer_of(dep)
            if dep_group != group and dep_rank >= rank:
                bad.append(f"{name} ({group}, layer {rank}) -> {dep} ({dep_group}, layer {dep_rank})")
    return sorted(bad)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def name_lookups() -> list[str]:
    """importlib lookups whose argument names one of our packages."""
    bad = []
    for name, path in our_modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                    "import_module", "find_spec", "__import__"):
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and str(arg.value).split(".")[0] in PACKAGES:
                        bad.append(f"{name}: {ast.unparse(node)}")
    return bad


def test_every_module_has_a_layer() -> None:
    for name in our_modules():
        if name not in FACADES:
            layer_of(name)


def test_every_import_points_down() -> None:
    assert upward_arrows(graph()) == []


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


def test_no_importlib_lookups_of_our_modules() -> None:
    assert name_lookups() == []


def test_nothing_imports_a_facade() -> None:
    edges = graph()
    assert sorted(f"{n} -> {d}" for n, deps in edges.items() for d in deps & FACADES) == []


def test_the_checks_catch_what_they_look_for() -> None:
    """The check itself can fail: an upward arrow and a two-module cycle are reported."""
    edges = {"radix.tree": {"scheduler.policy"}, "scheduler.policy": {"radix.tree"}}
    assert upward_arrows(edges) == ["radix.tree (radix, layer 0) -> scheduler.policy (scheduler, layer 6)"]
    assert cycles(edges) == [["radix.tree", "scheduler.policy"]]


def test_processes_that_need_no_torch_import_none() -> None:
    names = sorted(n for n in our_modules() if n not in TORCH_USERS and n not in FACADES
                   and layer_of(n)[0] in TORCH_FREE_GROUPS)
    script = ("import importlib, sys\n"
              f"for name in {names!r}:\n"
              "    importlib.import_module(name)\n"
              "    if 'torch' in sys.modules:\n"
              "        sys.exit('importing ' + name + ' loaded torch')\n")
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
