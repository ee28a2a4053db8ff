"""The GPU check's compile stage: the FlashInfer modules our shapes need (attention for head sizes
64 and 128 in bf16, and the fused per-token ops), built ahead of time in one parallel ninja run
(kernels/flashinfer_jit.py), timed; the built libraries archived into OUT by group (xz, when under
the size that comes back from the machine), so a second run carries the archives
(.gpu-wheels/aot/) and loads them instead of compiling.

Run through scripts/gpu_check.py --stage compile.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

import torch

from kernels.flashinfer_jit import build_modules, needed_modules, pack_libraries, unpack_libraries

HEAD_DIMS = [64, 128]  # every shape of the check (and of Llama/Qwen2/Qwen3 up to 70B)
ARCHIVE_LIMIT_BYTES = 15 << 20  # a file over 16 MiB does not come back from the GPU machine


def run(report: Any, out: Path, archives: Path | None = None) -> None:
    jit = importlib.import_module("flashinfer.jit")
    if archives is not None and archives.is_dir():
        for archive in sorted(archives.glob("*.tar.xz")):
            names = unpack_libraries(archive, Path(jit.env.FLASHINFER_AOT_DIR))
            report.info("aot_unpacked", archive=archive.name, modules=len(names))
    modules = needed_modules(HEAD_DIMS, [torch.bfloat16])
    result = build_modules(modules, jit)
    missing = [name for name, path in result.libraries.items() if not path.exists()]
    report.add("flashinfer_compile", not missing, modules=len(modules), prebuilt=len(result.prebuilt),
               s=round(result.seconds, 1), max_jobs=os.environ.get("MAX_JOBS", "nproc"), missing=missing)
    groups: dict[str, dict[str, Path]] = {}
    for module in modules:
        name = result.names[module.label]
        if name not in result.prebuilt and name not in missing:
            groups.setdefault(module.group, {})[name] = result.libraries[name]
    for group, libraries in groups.items():
        archive = out / f"aot-{group}.tar.xz"
        size = pack_libraries(libraries, archive)
        library_mb = round(sum(p.stat().st_size for p in libraries.values()) / 2**20, 1)
        if size > ARCHIVE_LIMIT_BYTES:
            archive.unlink()
            report.info("aot_archive", group=group, left_out_mb=round(size / 2**20, 1), library_mb=library_mb)
        else:
            report.info("aot_archive", group=group, file=archive.name, mb=round(size / 2**20, 2),
                        modules=len(libraries), library_mb=library_mb)
