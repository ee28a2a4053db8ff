#!/usr/bin/env bash
# The K-quant GGUF files that issue 39's kernels are measured on, made from the default model:
# an f32 GGUF by llama.cpp's convert_hf_to_gguf.py, then Q4_K_M, Q5_K_M and Q6_K by its
# llama-quantize, as a self-hoster's files are made.
#
# NOTE: K-quants pack 256-value super-blocks, so llama-quantize gives a tensor whose rows are not a
# multiple of 256 long a fallback type (q5_0, or q8_0 where it wanted q6_K). SmolLM2-135M's hidden
# size is 576: only ffn_down (1536 columns) gets a K-quant in these files; every other linear is
# q5_0 or q8_0 (the quantize logs under .peers/logs list each tensor's type).
#
#   scripts/make_kquants.sh            # prints the paths of the files, making what is missing
#
# Needs llama.cpp's sources and the vLLM venv (its Python runs the converter) under .peers/:
# `scripts/bench_peers.sh --install-only --systems vllm,llamacpp` puts them there. llama-quantize
# is built here from those sources (about a minute on 2 cores: the libraries are already built).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PEERS="$ROOT/.peers"
LLAMA_SRC="$PEERS/src/llama_cpp_python-0.3.36/vendor/llama.cpp"
VPY="$PEERS/vllm-venv/bin/python"
QUANTIZE="$LLAMA_SRC/build/bin/llama-quantize"
TYPES=(Q4_K_M Q5_K_M Q6_K)

say() { echo "make_kquants: $*" >&2; }
die() { say "error: $*"; exit 1; }

[[ -d "$LLAMA_SRC/build" && -x "$VPY" ]] ||
    die "no llama.cpp build or vLLM venv under .peers: run scripts/bench_peers.sh --install-only --systems vllm,llamacpp"
mkdir -p "$PEERS/logs" "$PEERS/models"
if [[ ! -x "$QUANTIZE" ]]; then
    say "building llama-quantize (log: $PEERS/logs/build-llama-quantize.log)"
    cmake --build "$LLAMA_SRC/build" -j"$(nproc)" --target llama-quantize >"$PEERS/logs/build-llama-quantize.log" 2>&1 ||
        die "llama-quantize build failed: see $PEERS/logs/build-llama-quantize.log"
fi

HF_DIR="$("$ROOT/.venv/bin/radixserve" model-path)"
NAME="$(basename "$HF_DIR")"
F32="$PEERS/models/$NAME-f32.gguf"
if [[ ! -f "$F32" ]]; then
    say "converting $HF_DIR to an f32 GGUF"
    (cd "$LLAMA_SRC" && PYTHONPATH="$LLAMA_SRC/gguf-py" "$VPY" convert_hf_to_gguf.py "$HF_DIR" --outtype f32 \
        --outfile "$F32.part") >"$PEERS/logs/convert-gguf-f32.log" 2>&1 || die "see $PEERS/logs/convert-gguf-f32.log"
    mv "$F32.part" "$F32"
fi
echo "$F32"
for type in "${TYPES[@]}"; do
    out="$PEERS/models/$NAME-$type.gguf"
    if [[ ! -f "$out" || "$out" -ot "$F32" ]]; then
        say "quantizing to $type"
        "$QUANTIZE" "$F32" "$out.part" "$type" >"$PEERS/logs/quantize-$type.log" 2>&1 || die "see $PEERS/logs/quantize-$type.log"
        mv "$out.part" "$out"
    fi
    echo "$out"
done
