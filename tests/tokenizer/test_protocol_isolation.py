"""No protocol imports another protocol's module: what they share lives in tokenizer/core/."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTOCOLS = {"native": "tokenizer/native", "openai": "tokenizer/openai", "responses": "tokenizer/openai/responses",
             "anthropic": "tokenizer/anthropic"}


def _protocol_of(module: str) -> str | None:
    """The protocol a dotted module belongs to (the most specific folder), or None."""
    path = module.replace(".", "/")
    found = [(len(folder), name) for name, folder in PROTOCOLS.items()
             if path == folder or path.startswith(folder + "/")]
    return max(found)[1] if found else None


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return out


def test_no_protocol_imports_another() -> None:
    crossings = []
    for path in sorted((ROOT / "tokenizer").rglob("*.py")):
        module = str(path.relative_to(ROOT).with_suffix("")).replace("/", ".")
        own = _protocol_of(module)
        if own is None:
            continue
        for imported in _imports(path):
            other = _protocol_of(imported)
            if other is not None and other != own:
                crossings.append(f"{module} imports {imported}")
    assert not crossings, crossings
