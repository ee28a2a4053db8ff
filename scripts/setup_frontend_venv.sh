#!/usr/bin/env bash
# Create .venv-frontend (Python 3.11) in the repo root with SGLang's program frontend
# (`sgl.function`, `gen`, `select`, `fork`, `RuntimeEndpoint`) and nothing of its GPU runtime.
# tests/frontend runs tests/frontend/programs.py with it against our server.
#
# sglang==0.4.6.post5 is the last release whose `import sglang` does not import the whole GPU
# runtime: installed with --no-deps, plus the few packages the frontend imports.
#
# Idempotent: .venv-frontend/.radixserve-frontend-setup holds a hash of this script. When it
# matches, nothing is printed and the script exits at once. Delete the stamp to force a rerun.
# Needs PyPI (about 30-60 s the first time).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-frontend"
STAMP="$VENV/.radixserve-frontend-setup"
SGLANG="sglang==0.4.6.post5"
DEPS=(requests numpy tqdm aiohttp IPython setproctitle pydantic)
cd "$ROOT"

want="$(cat scripts/setup_frontend_venv.sh scripts/venv_common.sh | sha256sum | cut -d' ' -f1)"
if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
    exit 0
fi

SETUP_NAME="frontend setup"
# shellcheck source=scripts/venv_common.sh
source "$ROOT/scripts/venv_common.sh"
make_py311_venv "$SGLANG frontend, about a minute"


pip_install --no-deps "$SGLANG"
pip_install "${DEPS[@]}"

# The frontend must import without torch: `sglang.function` and the HTTP backend.
check='import sglang; sglang.function; sglang.RuntimeEndpoint; sglang.gen; sglang.select'
if ! "$VPY" -c "$check" >/dev/null 2>&1; then
    say "the installed $SGLANG frontend does not import:"
    "$VPY" -c "$check" >&2 || true
    exit 1
fi

echo "$want" >"$STAMP"
say "done: $VENV"
