"""The FlashInfer stand-ins against the real flashinfer-python wheel the GPU check carries: every
function, method and property the stand-ins offer (so every one our code can call: a call the
stand-ins lack fails the CPU tests first) has the real one's signature, compared with
`inspect.signature` against the wheel's sources, and every attribute exists there.

The wheel comes from tests/kernels/flashinfer_wheel.py (fetched once into the user's cache;
these tests skip without network)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from tests.kernels import fake_flashinfer, fake_flashinfer_jit
from tests.kernels.flashinfer_wheel import WheelSource, as_source, is_property, pinned_wheels, signature

# Private members the stand-ins mirror because the real library's callers reach them (the
# decode plan forwards its keywords to _plan_impl, which rejects unknown ones).
MIRRORED_PRIVATE = {"__init__", "_plan_impl"}
STAGING_ATTR = "_pin_memory_int_workspace_buffer"  # kernels/flashinfer_staging.py swaps it


@pytest.fixture(scope="module")
def wheel() -> WheelSource:
    return WheelSource(pinned_wheels()["flashinfer-python"])


@pytest.fixture(scope="module")
def stand_in_jit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[types.ModuleType]:
    """The installed `flashinfer.jit` stand-in; sys.modules is put back afterwards."""
    names = ["flashinfer.jit", *(f"flashinfer.jit.{sub}" for sub in ("norm", "rope", "sampling", "activation"))]
    saved = {name: sys.modules.get(name) for name in names}
    module = fake_flashinfer_jit.install_module(tmp_path_factory.mktemp("jit"))
    yield module
    for name, old in saved.items():
        if old is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = old


def _class_members(real: str, cls: type) -> list[tuple[str, Any]]:
    """A stand-in class's own functions and properties (their real names under `real`), and its
    dataclass fields; not a dataclass's generated __init__ (no caller builds a JitSpec)."""
    members: list[tuple[str, Any]] = []
    for name in dir(cls):
        static = inspect.getattr_static(cls, name)
        function = static.fget if isinstance(static, property) else static
        ours = (getattr(function, "__module__", None) or "").startswith("tests.kernels.")
        wanted = not name.startswith("_") or name in MIRRORED_PRIVATE
        generated = name == "__init__" and dataclasses.is_dataclass(cls)
        if ours and wanted and not generated and (inspect.isfunction(function)):
            members.append((f"{real}.{name}", static))
    if dataclasses.is_dataclass(cls):
        members += [(f"{real}.{field.name}", field) for field in dataclasses.fields(cls)]
    return members


def _public(module: types.ModuleType) -> list[tuple[str, Any]]:
    return [(name, value) for name, value in vars(module).items() if not name.startswith("_")]


def surface(jit: types.ModuleType) -> list[tuple[str, Any]]:
    """(the real name, the stand-in) for everything the stand-ins offer, and the loaders their
    calls go through (named where FlashInfer defines them)."""
    entries: list[tuple[str, Any]] = []
    for name, value in _public(fake_flashinfer._module()):
        real = f"flashinfer.{name}"
        entries += _class_members(real, value) if isinstance(value, type) else [(real, value)]
    for name, value in _public(jit):
        if name == "env":  # stands for the module flashinfer.jit.env
            entries += [(f"flashinfer.jit.env.{a}", v) for a, v in vars(value).items() if not a.startswith("_")]
        elif name == "JitSpec":  # what the generators return: jit/core.py's JitSpecNvcc
            entries += _class_members("flashinfer.jit.JitSpecNvcc", value)
        elif isinstance(value, types.ModuleType):
            entries += [(f"flashinfer.jit.{name}.{sub}", v) for sub, v in _public(value)]
        else:
            entries.append((f"flashinfer.jit.{name}", value))
    return entries + list(fake_flashinfer_jit.LOADERS.items())


def drift(wheel: WheelSource, real: str, stand_in: Any) -> str | None:
    """How the stand-in differs from the real definition, or None when it does not."""
    try:
        node = wheel.find(real).node
    except LookupError as exc:
        return f"not in the wheel ({exc})"
    if isinstance(stand_in, property):
        return None if is_property(node) else "a property here, not there"
    if inspect.isfunction(stand_in):
        if is_property(node) or not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return f"a function here, a {type(node).__name__} there"
        return _differences(signature(node), as_source(inspect.signature(stand_in)))
    return None  # an attribute or field: existing there is what matters


def _differences(theirs: inspect.Signature, ours: inspect.Signature) -> str | None:
    if theirs == ours:
        return None
    real, stand_in = theirs.parameters, ours.parameters
    changed = [f"{name}: real {real.get(name)}, stand-in {stand_in.get(name)}" for name in {**real, **stand_in}
               if str(real.get(name)) != str(stand_in.get(name))]
    return "; ".join(changed) or f"order or kinds differ: real {theirs}, stand-in {ours}"


def test_every_stand_in_call_has_the_real_signature(wheel: WheelSource, stand_in_jit: types.ModuleType) -> None:
    entries = surface(stand_in_jit)
    compared = {real for real, value in entries if inspect.isfunction(value)}
    # Those our code calls, named here so a stand-in that lost one fails too.
    assert {"flashinfer.BatchPrefillWithPagedKVCacheWrapper.plan", "flashinfer.BatchDecodeWithPagedKVCacheWrapper.run",
            "flashinfer.BatchDecodeWithPagedKVCacheWrapper._plan_impl", "flashinfer.rmsnorm",
            "flashinfer.top_k_top_p_sampling_from_probs", "flashinfer.jit.build_jit_specs",
            "flashinfer.jit.activation.gen_act_and_mul_module", "flashinfer.jit.JitSpecNvcc.build_and_load"} <= compared
    drifts = {real: d for real, value in entries if (d := drift(wheel, real, value)) is not None}
    assert not drifts, "\n".join(f"{real}: {d}" for real, d in drifts.items())


@pytest.mark.parametrize("plant", ["renamed", "dropped_default", "extra_keyword", "keyword_only", "other_default"])
def test_a_planted_drift_is_caught(wheel: WheelSource, plant: str) -> None:
    """The comparison itself: the real decode plan against copies of it changed in one way each."""
    real = "flashinfer.BatchDecodeWithPagedKVCacheWrapper._plan_impl"
    stand_in = fake_flashinfer.BatchDecodeWithPagedKVCacheWrapper._plan_impl
    assert drift(wheel, real, stand_in) is None
    params = list(inspect.signature(stand_in).parameters.values())
    last = params[-1]
    changed = {
        "renamed": params[:-1] + [last.replace(name="q_len")],
        "dropped_default": params[:-1] + [last.replace(default=inspect.Parameter.empty)],
        "extra_keyword": params + [inspect.Parameter("causal", inspect.Parameter.KEYWORD_ONLY, default=False)],
        "keyword_only": params[:7] + [params[7].replace(kind=inspect.Parameter.KEYWORD_ONLY)] + params[8:],
        "other_default": params[:-1] + [last.replace(default=2)],
    }[plant]

    def planted(*args: Any, **kwargs: Any) -> None: ...

    planted.__signature__ = inspect.Signature(changed)  # type: ignore[attr-defined]
    assert drift(wheel, real, planted) is not None


def test_both_wrappers_own_the_staging_buffer_we_swap(wheel: WheelSource) -> None:
    """kernels/flashinfer_staging.py replaces this private attribute, set in each __init__."""
    for cls in ("BatchPrefillWithPagedKVCacheWrapper", "BatchDecodeWithPagedKVCacheWrapper"):
        init = wheel.find(f"flashinfer.{cls}.__init__").node
        assert f"self.{STAGING_ATTR} =" in ast.unparse(init), cls


def test_the_pinned_tvm_ffi_is_the_one_flashinfer_requires(wheel: WheelSource) -> None:
    wheels = pinned_wheels()
    assert set(wheels) == {"flashinfer-python", "apache-tvm-ffi"}
    version = wheels["apache-tvm-ffi"].name.split("-")[1]
    required = [Requirement(line.removeprefix("Requires-Dist: ")) for line in wheel.metadata().splitlines()
                if line.startswith("Requires-Dist: apache-tvm-ffi")]
    assert required and all(version in r.specifier for r in required), (version, required)
    assert Path(wheels["apache-tvm-ffi"]).name.endswith("manylinux_2_28_x86_64.whl")
    assert "-cp312-" in wheels["apache-tvm-ffi"].name
