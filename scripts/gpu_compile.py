"""The GPU check's compile stage: FlashInfer's attention modules for head sizes 64 and 128 in bf16,
built ahead of time in one parallel ninja run (kernels/flashinfer_jit.py), timed; each built
library archived into OUT (xz, when under the size that comes back from the machine) so a second
run carries the archives (.gpu-wheels/aot/) and loads them instead of compiling.

Run through scripts/gpu_check.py --stage compile.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from kernels.flashinfer_jit import attention_modules, build_attention_modules, pack_library, unpack_libraries

HEAD_DIMS = [64, 128]  # every shape of the check (and of Llama/Qwen2/Qwen3 up to 70B)
ARCHIVE_LIMIT_BYTES = 15 << 20  # a file over 16 MiB does not come back from the GPU machine


def run(report: Any, out: Path, archives: Path | None = None) -> None:
    import flashinfer.jit as jit

    if archives is not None and archives.is_dir():
        for archive in sorted(archives.glob("*.tar.xz")):
            names = unpack_libraries(archive, Path(jit.env.FLASHINFER_AOT_DIR))
            report.info("aot_unpacked", archive=archive.name, modules=len(names))
    modules = attention_modules(HEAD_DIMS, [torch.bfloat16])
    result = build_attention_modules(modules, jit)
    missing = [name for name, path in result.libraries.items() if not path.exists()]
    report.add("flashinfer_compile", not missing, modules=len(modules), prebuilt=len(result.prebuilt),
               s=round(result.seconds, 1), max_jobs=os.environ.get("MAX_JOBS", "nproc"), missing=missing)
    for module in modules:
        name = result.names[module.label]
        if name in result.prebuilt or name in missing:
            continue
        archive = out / f"aot-{module.label}.tar.xz"
        size = pack_library(name, result.libraries[name], archive)
        if size > ARCHIVE_LIMIT_BYTES:
            archive.unlink()
            report.info("aot_archive", module=module.label, left_out_mb=round(size / 2**20, 1))
        else:
            report.info("aot_archive", module=module.label, file=archive.name, mb=round(size / 2**20, 2),
                        library_mb=round(result.libraries[name].stat().st_size / 2**20, 1))
