"""Greedy continuations of radixserve and llama.cpp on the same GGUF file, side by side: the
outside check of our quantized kernels (llama.cpp's own kernels are the reference for its file).

    .venv/bin/python scripts/compare_llamacpp.py                  # the embedded Q4_1 file
    .venv/bin/python scripts/compare_llamacpp.py --gguf F.gguf --max-tokens 48

It starts `llama-server` (the one scripts/bench_peers.sh builds under .peers/; run that script
with --install-only first) and `radixserve serve --load-format gguf` on the file, one after the
other on loopback ports, sends each the same chat prompts through /v1/chat/completions
(temperature 0, one request at a time), and reports per prompt how many leading tokens the two
continuations share (counted with the model's tokenizer), and how many continuations are equal.
One JSON line per run goes to --output-file. Not part of `make test`: it needs llama.cpp built.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LLAMA_SERVER = ROOT / ".peers/src/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-server"
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash table is in two sentences.",
    "List three prime numbers greater than 50.",
    "How do I reverse a list in Python?",
    "What causes the seasons on Earth?",
    "Translate 'good morning' into Spanish and German.",
    "Give me a short tip for writing clear emails.",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as resp:
        return json.loads(resp.read())


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 600) -> None:
    start = time.time()
    while time.time() - start < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} while starting")
        try:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"{url} was not ready after {timeout} s")


def continuations(command: list[str], port: int, max_tokens: int, log: Path) -> list[str]:
    url = f"http://127.0.0.1:{port}"
    with open(log, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_ready(url, proc)
        texts = []
        for prompt in PROMPTS:
            body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                    "temperature": 0, "ignore_eos": True}
            texts.append(post(f"{url}/v1/chat/completions", body)["choices"][0]["message"]["content"] or "")
        return texts
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def common_prefix_tokens(tokenizer, a: str, b: str) -> int:  # type: ignore[no-untyped-def]
    ta, tb = tokenizer.encode(a, add_special_tokens=False), tokenizer.encode(b, add_special_tokens=False)
    n = 0
    while n < min(len(ta), len(tb)) and ta[n] == tb[n]:
        n += 1
    return n


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from runtime.support.default_model import ensure_default_model, gguf_path

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gguf", default=str(gguf_path()), help="the .gguf file (default: the embedded Q4_1 model)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--radixserve-args", default="", help="more flags for radixserve serve")
    p.add_argument("--output-file", default=str(ROOT / "results/compare_llamacpp.jsonl"))
    args = p.parse_args()
    if not LLAMA_SERVER.exists():
        p.error(f"{LLAMA_SERVER} is missing: run scripts/bench_peers.sh --install-only --systems llamacpp-q4")
    logs = ROOT / ".peers/logs"
    logs.mkdir(parents=True, exist_ok=True)
    threads = str(os.cpu_count() or 1)
    port = free_port()
    theirs = continuations([str(LLAMA_SERVER), "-m", args.gguf, "--host", "127.0.0.1", "--port", str(port), "-np", "1",
                            "-c", "4096", "-t", threads, "-tb", threads, "--no-webui"],
                           port, args.max_tokens, logs / "compare-llamacpp.log")
    port = free_port()
    ours = continuations([str(ROOT / ".venv/bin/radixserve"), "serve", "--model-path", args.gguf, "--load-format",
                          "gguf", "--host", "127.0.0.1", "--port", str(port), *args.radixserve_args.split()],
                         port, args.max_tokens, logs / "compare-radixserve.log")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ensure_default_model())
    shared = [common_prefix_tokens(tokenizer, a, b) for a, b in zip(ours, theirs)]
    equal = sum(a == b for a, b in zip(ours, theirs))
    for prompt, n, a, b in zip(PROMPTS, shared, ours, theirs):
        print(f"{n:3d} shared tokens | {prompt}\n    radixserve: {a!r}\n    llama.cpp:  {b!r}")
    print(f"\n{equal} of {len(PROMPTS)} continuations equal; shared leading tokens per prompt {shared} "
          f"(of {args.max_tokens}; mean {sum(shared) / len(shared):.1f})")
    record = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "gguf": args.gguf, "max_tokens": args.max_tokens,
              "radixserve_args": args.radixserve_args, "equal": equal, "prompts": len(PROMPTS),
              "shared_tokens": shared, "ours": ours, "theirs": theirs}
    Path(args.output_file).parent.mkdir(parents=True, exist_ok=True)
    with open(args.output_file, "a") as fh:
        fh.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
