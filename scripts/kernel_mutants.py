"""Planted faults in our C++ kernels: does tests/kernels/csrc catch each one?

    .venv/bin/python scripts/kernel_mutants.py                      # all (one build each, about a minute)
    .venv/bin/python scripts/kernel_mutants.py --list
    .venv/bin/python scripts/kernel_mutants.py --only decode-last-key
    .venv/bin/python scripts/kernel_mutants.py --head               # kernels/ and runtime/ as committed

For each mutation (a file under kernels/csrc/, a snippet that must occur in it exactly once, its
replacement) the repository's files (`git ls-files`: tracked, and untracked ones git does not
ignore, as they are in the working tree) are copied into a temporary directory, the mutation is
applied there, the kernels are built from the copy's root into a temporary cache
(`python -m runtime.execution.cpu_kernels build` with RADIXSERVE_CACHE_DIR) and
`pytest -q -x tests/kernels/csrc` runs there. A failing run (or a crash) means caught; the folder
then runs once more without -x (seconds: the build is there) to list every test file that fails
on the mutation, not only the first. The unmutated copy runs first and must pass. `--head` takes
kernels/ and runtime/ from `git archive HEAD` instead of the working tree (while someone's
half-done build changes break it).

Exit status 1 when the unmutated copy fails, a mutation survives, or a mutation cannot be applied
(its snippet no longer occurs exactly once: the source changed; update the list).
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = ROOT / ".venv" / "bin" / "python"
TESTS = "tests/kernels/csrc"
TIMEOUT_S = 1200  # a build or a test run; a mutation that makes a kernel spin counts as caught


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str  # under kernels/csrc/
    snippet: str
    replacement: str
    description: str
    needs: str | None = None  # a CPU feature (kernels/cpu_ext.py cpu_features) the mutated path runs only with


MUTATIONS = [
    Mutation("qgemm-high-nibble", "quant_gemm_groups.h",
             "high, broadcast4(aq + QK / 2 + 4 * c));", "high, broadcast4(aq + QK / 2 + 4 * c + 1));",
             "8-row kernel: q4 high nibbles meet the activations one value off"),
    Mutation("qgemm-correction-sign", "quant_gemm_groups.h",
             "if constexpr (CORRECTED) acc[m] = _mm256_fmadd_ps(corr,",
             "if constexpr (CORRECTED) acc[m] = _mm256_fnmadd_ps(corr,",
             "8-row kernel: the minimum / offset correction (m s_a, -8 d s_a) subtracted, not added"),
    Mutation("qgemm-last-block", "quant_gemm_groups.h",
             "acc[m] = _mm256_setzero_ps();\n  for (int64_t b = 0; b < nblocks; ++b) {",
             "acc[m] = _mm256_setzero_ps();\n  for (int64_t b = 0; b < nblocks - 1; ++b) {",
             "8-row kernel: the last block of every row skipped"),
    Mutation("qgemm-pair-high-nibble", "quant_gemm_groups.h",
             "high, broadcast4_512(aq + QK / 2 + 4 * c));", "high, broadcast4_512(aq + 4 * c));",
             "VNNI group pairs: q4 high nibbles meet the low values' activations", needs="avx512_vnni"),
    Mutation("decode-last-key", "decode_attention.cpp",
             "for (int64_t l = 0; l < len; ++l) {\n        const T* v = v_row(l)",
             "for (int64_t l = 0; l < len - 1; ++l) {\n        const T* v = v_row(l)",
             "decode: P.V skips each request's last key"),
    Mutation("decode-gqa-kv-head", "decode_attention.cpp",
             "task{k_pool + kh * kHeadDim,", "task{k_pool + (kv_heads - 1 - kh) * kHeadDim,",
             "decode: scores read the K of the mirrored KV head (wrong GQA mapping)"),
    Mutation("decode-lse-sign", "decode_attention.cpp",
             "= row_max[g] + std::log(row_sum[g]);", "= row_max[g] - std::log(row_sum[g]);",
             "decode: the log-sum-exp's log term with the wrong sign"),
    Mutation("prefill-causal-mask", "prefill_attention.cpp",
             "if (l0 + l > s.last_key[r])", "if (l0 + l > s.last_key[r] + 1)",
             "prefill: the causal mask lets each row see the next key"),
    Mutation("prefill-rescale-sign", "prefill_attention.cpp",
             "std::exp(std::max(s.row_max[r] - top[r], kExpFloor))",
             "std::exp(std::max(top[r] - s.row_max[r], kExpFloor))",
             "prefill: the online softmax rescales by exp(new - old max) instead of exp(old - new)"),
    Mutation("cascade-last-chunk", "cascade_attention.cpp",
             "for (int64_t c = 0; c < chunks; ++c) {\n        const float w",
             "for (int64_t c = 0; c < chunks - 1; ++c) {\n        const float w",
             "cascade: the merge drops the shared prefix's last chunk"),
    Mutation("rmsnorm-sum-tail", "elementwise.cpp",
             "for (int64_t i = 0; i < dim; ++i) sum += h[i] * h[i];",
             "for (int64_t i = 0; i < dim - 1; ++i) sum += h[i] * h[i];",
             "RMSNorm: the sum of squares misses the row's last value"),
    Mutation("silu-sign", "elementwise.cpp", "a / (1.0f + std::exp(-a))", "a / (1.0f + std::exp(a))",
             "SiLU: the exponent's sign flipped"),
    Mutation("layer-v-slice", "decode_layer.cpp", "qkv.narrow(1, qk_width, kv_heads * head_dim)",
             "qkv.narrow(1, qk_width - head_dim, kv_heads * head_dim)",
             "decode layer: V is taken one head early in the qkv row (K's last head)"),
    Mutation("gemv-tail", "dense_gemv.cpp",
             "for (int64_t k = body; k < K; ++k) s += x[r * K + k] * static_cast<float>(w[k]);",
             "for (int64_t k = body; k < K - 1; ++k) s += x[r * K + k] * static_cast<float>(w[k]);",
             "dense GEMV, 1-2 rows: the scalar tail stops one value short"),
]


@dataclass(frozen=True)
class Outcome:
    name: str
    verdict: str  # "caught", "SURVIVED", "error", "skipped" (and "passed" for the unmutated copy)
    detail: str
    failing_files: str = ""  # of a caught mutation: every test file that fails on it


def repo_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, check=True).stdout.decode()
    return [p for p in out.split("\0") if p and (ROOT / p).is_file()]


def snapshot(dest: Path, head: bool) -> None:
    """The repository's files into `dest`; with `head`, kernels/ and runtime/ as in HEAD."""
    for rel in repo_files():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)
    if head:
        for folder in ("kernels", "runtime"):
            shutil.rmtree(dest / folder)
        archive = subprocess.run(["git", "archive", "HEAD", "kernels", "runtime"], cwd=ROOT, capture_output=True,
                                 check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(dest, filter="data")


def apply(mutation: Mutation, tree: Path) -> str | None:
    """Mutate the copy at `tree`; the reason when the snippet does not occur exactly once."""
    path = tree / "kernels" / "csrc" / mutation.file
    if not path.is_file():
        return f"kernels/csrc/{mutation.file} does not exist"
    text = path.read_text()
    count = text.count(mutation.snippet)
    if count != 1:
        return f"its snippet occurs {count} times in kernels/csrc/{mutation.file} (expected once)"
    path.write_text(text.replace(mutation.snippet, mutation.replacement))
    return None


def run(cmd: list[str], tree: Path, cache: Path) -> subprocess.CompletedProcess[str] | None:
    env = {**os.environ, "RADIXSERVE_CACHE_DIR": str(cache), "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        return subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None


def failures(output: str) -> list[str]:
    """The failed (or errored) test ids of a pytest -rfE run, in the order they ran."""
    return [line.split(" - ")[0].removeprefix("FAILED ") for line in output.splitlines()
            if line.startswith(("FAILED ", "ERROR "))]


def failing_files(tree: Path, cache: Path) -> str:
    """The test files that fail on the copy at `tree`, from one run of the folder without -x."""
    tests = run([str(PYTHON), "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", TESTS], tree, cache)
    if tests is None:
        return "(the run without -x timed out)"
    names = dict.fromkeys(Path(test.split("::")[0].removeprefix("ERROR ")).name for test in failures(tests.stdout))
    return ", ".join(names) or f"(pytest exit status {tests.returncode}, no test ids)"


def trial(name: str, pristine: Path, scratch: Path, mutation: Mutation | None) -> Outcome:
    """Build and test a copy of `pristine`, mutated by `mutation` (none: as it is)."""
    tree, cache = scratch / f"{name}-tree", scratch / f"{name}-cache"
    shutil.copytree(pristine, tree, symlinks=True)
    try:
        if mutation is not None and (reason := apply(mutation, tree)) is not None:
            return Outcome(name, "error", reason)
        built = run([str(PYTHON), "-m", "runtime.execution.cpu_kernels", "build"], tree, cache)
        if built is None or built.returncode != 0:
            tail = "timed out" if built is None else (built.stderr or built.stdout).strip().splitlines()[-3:]
            return Outcome(name, "error", f"the build failed: {tail}")
        tests = run([str(PYTHON), "-m", "pytest", "-q", "-x", "-rfE", "-p", "no:cacheprovider", TESTS], tree, cache)
        if tests is None:
            return Outcome(name, "passed" if mutation is None else "caught", "the tests timed out")
        failed = (failures(tests.stdout) or [f"pytest exit status {tests.returncode}"])[0]
        if mutation is None:
            summary = tests.stdout.strip().splitlines()[-1] if tests.stdout.strip() else ""
            return Outcome(name, "passed", summary) if tests.returncode == 0 else Outcome(name, "error", failed)
        if tests.returncode == 0:
            return Outcome(name, "SURVIVED", "every test passed")
        return Outcome(name, "caught", failed, failing_files(tree, cache))
    finally:
        shutil.rmtree(tree, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)


def cpu_flags() -> set[str]:
    """This CPU's features by cpuid, as the kernels' loader reads them."""
    from kernels.cpu_ext import cpu_features

    return set(cpu_features())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", metavar="NAME", help="run this mutation alone (after the unmutated copy)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--head", action="store_true", help="kernels/ and runtime/ from HEAD, not the working tree")
    args = parser.parse_args()
    if args.list:
        for m in MUTATIONS:
            print(f"{m.name:24} {m.file:24} {m.description}" + (f" [needs {m.needs}]" if m.needs else ""))
        return 0
    chosen = [m for m in MUTATIONS if args.only in (None, m.name)]
    if not chosen:
        parser.error(f"no mutation {args.only!r}; see --list")
    flags = cpu_flags()
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="kernel-mutants-") as tmp:
        scratch = Path(tmp)
        pristine = scratch / "pristine"
        snapshot(pristine, args.head)
        outcomes.append(trial("unmutated", pristine, scratch, None))
        print(f"{outcomes[-1].name}: {outcomes[-1].verdict} ({outcomes[-1].detail})", flush=True)
        if outcomes[-1].verdict != "passed":
            return 1
        for m in chosen:
            if m.needs is not None and m.needs not in flags:
                outcomes.append(Outcome(m.name, "skipped", f"this CPU lacks {m.needs}"))
            else:
                outcomes.append(trial(m.name, pristine, scratch, m))
            print(f"{m.name}: {outcomes[-1].verdict} ({outcomes[-1].detail})", flush=True)
    print("\n| mutation | result | first failing test | test files failing |\n|---|---|---|---|")
    for o in outcomes:
        print(f"| {o.name} | {o.verdict} | {o.detail} | {o.failing_files} |")
    return 0 if all(o.verdict in ("passed", "caught", "skipped") for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
