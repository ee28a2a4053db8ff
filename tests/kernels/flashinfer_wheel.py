"""The real wheels the GPU check carries (scripts/gpu_wheels.sh), for CPU tests that read them:
fetched once by that script into the user's cache (runtime.contracts.env.cache_dir(), under
gpu-wheels/), then read in place. flashinfer-python is never installed here (its install pulls
in CUDA packages): its Python sources are parsed from the wheel's zip, and `signature` builds an
`inspect.Signature` from a definition's source. Without network the tests that need it skip.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from runtime.contracts.env import cache_dir

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_wheels.sh"


def pins() -> dict[str, str]:
    """gpu_wheels.sh's pinned wheels: distribution name -> version."""
    match = re.search(r"^PINS=\(([^)]*)\)", SCRIPT.read_text(), re.MULTILINE)
    assert match, f"no PINS=(...) line in {SCRIPT}"
    return dict(pin.split("==") for pin in match.group(1).split())


def wheel_path(folder: Path, name: str, version: str) -> Path | None:
    found = sorted(folder.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
    return found[0] if found else None


def pinned_wheels() -> dict[str, Path]:
    """The pinned wheels as gpu_wheels.sh fetches them, run into the cache once (skips without network)."""
    folder = cache_dir() / "gpu-wheels"
    wanted = pins()
    found = {name: wheel_path(folder, name, version) for name, version in wanted.items()}
    if None in found.values():
        _fetch(folder)
        found = {name: wheel_path(folder, name, version) for name, version in wanted.items()}
    assert None not in found.values(), (folder, found)
    return {name: path for name, path in found.items() if path is not None}


def _fetch(folder: Path) -> None:
    """Run gpu_wheels.sh into a folder of this process, then move it into place whole (the script
    clears its folder first: a test run beside this one may be reading the cached one)."""
    staging = folder.with_name(f"{folder.name}.{os.getpid()}")
    env = {**os.environ, "GPU_WHEELS_DIR": str(staging), "PYTHON": sys.executable}
    run = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=300)
    if run.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        pytest.skip(f"could not fetch the pinned wheels {pins()} (no network?): {run.stderr.strip()[-400:]}")
    shutil.rmtree(folder, ignore_errors=True)
    try:
        staging.rename(folder)
    except OSError:  # another process put its copy there first
        shutil.rmtree(staging, ignore_errors=True)


@dataclass(frozen=True)
class Definition:
    """Where a public name leads in the wheel's sources: its defining module and node."""

    module: str
    node: ast.AST


class WheelSource:
    """A wheel's Python sources, parsed from its zip on demand."""

    def __init__(self, wheel: Path) -> None:
        self.zip = zipfile.ZipFile(wheel)
        self.files = set(self.zip.namelist())
        self.parsed: dict[str, ast.Module] = {}

    def metadata(self) -> str:
        (name,) = [f for f in self.files if f.endswith(".dist-info/METADATA")]
        return self.zip.read(name).decode()

    def module_file(self, module: str) -> str | None:
        base = module.replace(".", "/")
        return next((f for f in (f"{base}.py", f"{base}/__init__.py") if f in self.files), None)

    def tree(self, module: str) -> ast.Module:
        if module not in self.parsed:
            file = self.module_file(module)
            assert file is not None, module
            self.parsed[module] = ast.parse(self.zip.read(file), file)
        return self.parsed[module]

    def find(self, dotted: str) -> Definition:
        """The definition `dotted` (a module path, then names) reaches, following re-exports and,
        for class members, the class's bases. LookupError when there is none."""
        parts = dotted.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            module = ".".join(parts[:cut])
            if self.module_file(module):
                found = self._top_level(module, parts[cut])
                for name in parts[cut + 1 :]:
                    found = self._member(found, name)
                return found
        raise LookupError(dotted)

    def _top_level(self, module: str, name: str) -> Definition:
        found: Definition | None = None
        for stmt in _statements(self.tree(module).body):
            if _defines(stmt, name):
                found = Definition(module, stmt)
            elif isinstance(stmt, ast.ImportFrom) and any((a.asname or a.name) == name for a in stmt.names):
                alias = next(a for a in stmt.names if (a.asname or a.name) == name)
                source = _absolute(module, self.module_file(module) or "", stmt)
                if self.module_file(f"{source}.{alias.name}"):
                    found = Definition(f"{source}.{alias.name}", self.tree(f"{source}.{alias.name}"))
                else:
                    found = self._top_level(source, alias.name)
        if found is None:
            raise LookupError(f"{module}.{name}")
        return found

    def _member(self, owner: Definition, name: str) -> Definition:
        if isinstance(owner.node, ast.Module):
            return self._top_level(owner.module, name)
        if not isinstance(owner.node, ast.ClassDef):
            raise LookupError(f"{name} of a {type(owner.node).__name__}")
        body = [stmt for stmt in owner.node.body if _defines(stmt, name)]
        if body:
            return Definition(owner.module, body[-1])
        for base in owner.node.bases:
            if isinstance(base, ast.Name):
                try:
                    return self._member(self._top_level(owner.module, base.id), name)
                except LookupError:
                    continue
        raise LookupError(f"{owner.node.name}.{name}")


def _statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """A module's top-level statements, those under if/try blocks too."""
    out: list[ast.stmt] = []
    for stmt in body:
        if isinstance(stmt, ast.If | ast.Try):
            blocks = [stmt.body, stmt.orelse] + ([h.body for h in stmt.handlers] if isinstance(stmt, ast.Try) else [])
            for block in blocks:
                out += _statements(block)
        else:
            out.append(stmt)
    return out


def _defines(stmt: ast.stmt, name: str) -> bool:
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
        return stmt.name == name and not any(_decorator_name(d) == "overload" for d in stmt.decorator_list)
    if isinstance(stmt, ast.ClassDef):
        return stmt.name == name
    if isinstance(stmt, ast.AnnAssign):
        return isinstance(stmt.target, ast.Name) and stmt.target.id == name
    if isinstance(stmt, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets)
    return False


def _decorator_name(node: ast.expr) -> str:
    node = node.func if isinstance(node, ast.Call) else node
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def _absolute(module: str, file: str, stmt: ast.ImportFrom) -> str:
    if stmt.level == 0:
        return stmt.module or ""
    package = module if file.endswith("__init__.py") else module.rpartition(".")[0]
    for _ in range(stmt.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{stmt.module}" if stmt.module else package


def is_property(node: ast.AST) -> bool:
    return isinstance(node, ast.FunctionDef) and any(
        _decorator_name(d) in ("property", "cached_property") for d in node.decorator_list)


@dataclass(frozen=True)
class SourceDefault:
    """A default value as source text (`'NHD'`, `None`, `torch.float16`), comparable across sides."""

    text: str

    def __repr__(self) -> str:
        return self.text


def signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> inspect.Signature:
    """The signature a definition declares: names, kinds and defaults (as source), no annotations."""
    a = node.args
    positional = [*a.posonlyargs, *a.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    params = [inspect.Parameter(arg.arg, inspect.Parameter.POSITIONAL_ONLY if i < len(a.posonlyargs)
                                else inspect.Parameter.POSITIONAL_OR_KEYWORD, default=_source_default(d))
              for i, (arg, d) in enumerate(zip(positional, defaults, strict=True))]
    if a.vararg:
        params.append(inspect.Parameter(a.vararg.arg, inspect.Parameter.VAR_POSITIONAL))
    params += [inspect.Parameter(arg.arg, inspect.Parameter.KEYWORD_ONLY, default=_source_default(d))
               for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)]
    if a.kwarg:
        params.append(inspect.Parameter(a.kwarg.arg, inspect.Parameter.VAR_KEYWORD))
    return inspect.Signature(params)


def _source_default(node: ast.expr | None) -> object:
    return inspect.Parameter.empty if node is None else SourceDefault(ast.unparse(node))


def as_source(sig: inspect.Signature) -> inspect.Signature:
    """A live signature in `signature`'s terms: no annotations, each default as its source text."""
    params = [p.replace(annotation=inspect.Parameter.empty,
                        default=p.default if p.default is inspect.Parameter.empty else SourceDefault(_text(p.default)))
              for p in sig.parameters.values()]
    return inspect.Signature(params)


def _text(value: object) -> str:
    """How a default is written in source: repr for literals, `torch.float16` for a dtype."""
    return str(value) if type(value).__name__ == "dtype" else repr(value)
