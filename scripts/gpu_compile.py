"""The GPU check's compile stage: the FlashInfer modules the later stages load (attention for the
check's layouts in bf16, and the fused per-token ops), built ahead of time in one parallel ninja
run and installed where FlashInfer's loader takes them from (kernels/flashinfer_jit.py), timed;
the built libraries archived into OUT by group (xz), within what the run tool carries back and
forth, so a second run carries the archives (.gpu-wheels/aot/) and loads them instead of compiling.

Run through scripts/gpu_check.py --stage compile.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

import torch

from kernels.flashinfer_jit import (
    AttentionLayout,
    build_modules,
    needed_modules,
    pack_libraries,
    unpack_libraries,
)

ARCHIVE_LIMIT_BYTES = 15 << 20  # a file over 16 MiB does not come back from the GPU machine
# All archives together: with the two wheels (about 21 MiB, scripts/gpu_wheels.sh) they must stay
# under gpu_wheels.sh's 56 MiB, which leaves 8 MiB of the 64 MiB a call carries for the tree.
ARCHIVES_BUDGET_BYTES = 34 << 20


def run(report: Any, out: Path, archives: Path | None, layouts: list[AttentionLayout]) -> None:
    jit = importlib.import_module("flashinfer.jit")
    if archives is not None and archives.is_dir():
        for archive in sorted(archives.glob("*.tar.xz")):
            names = unpack_libraries(archive, Path(jit.env.FLASHINFER_AOT_DIR))
            report.info("aot_unpacked", archive=archive.name, modules=len(names))
    modules = needed_modules(layouts, [torch.bfloat16])
    result = build_modules(modules, jit)
    missing = [name for name, path in result.libraries.items() if not path.exists()]
    report.add("flashinfer_compile", not missing, modules=[m.label for m in modules], prebuilt=len(result.prebuilt),
               s=round(result.seconds, 1), max_jobs=os.environ.get("MAX_JOBS", "nproc"), missing=missing)
    groups: dict[str, dict[str, Path]] = {}
    for module in modules:
        name = result.names[module.label]
        if name not in result.prebuilt and name not in missing:
            groups.setdefault(module.group, {})[name] = result.libraries[name]
    archive_groups(report, out, groups)


def archive_groups(report: Any, out: Path, groups: dict[str, dict[str, Path]]) -> None:
    """One xz archive per group, in order, while each fits a returned file and all fit the budget."""
    left = ARCHIVES_BUDGET_BYTES
    for group, libraries in groups.items():
        archive = out / f"aot-{group}.tar.xz"
        size = pack_libraries(libraries, archive)
        library_mb = round(sum(p.stat().st_size for p in libraries.values()) / 2**20, 1)
        if size > min(ARCHIVE_LIMIT_BYTES, left):
            archive.unlink()
            report.info("aot_archive", group=group, left_out_mb=round(size / 2**20, 1), library_mb=library_mb)
            continue
        left -= size
        report.info("aot_archive", group=group, file=archive.name, mb=round(size / 2**20, 2),
                    modules=len(libraries), library_mb=library_mb)

