"""The configuration users get: the server started with no flags but the model path (dtype
`auto` for this CPU, all cores, default KV pool and chunking, our C++ kernels) against Hugging
Face transformers.

HF scores our output by teacher forcing (one forward over prompt + our tokens). Wherever HF's
top-2 log-prob margin in the same dtype is clear, our greedy token is HF's argmax. Our reported
log-probs are then compared with the fp32 truth: in fp32 within 2e-3 nats a token; in bf16 on
average as close to it as HF's own bf16 run is (per token they differ from HF's bf16 by the
rounding of both: on the default model 0.02 nats on average, up to ~0.3 at a few positions, on
either side of the fp32 value).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests
import torch
import transformers

from runtime.execution.device import cpu_capability
from tests.tokenizer.http_helpers import RunningServer, post

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three uses of a paperclip.",
    "Explain what a prime number is in one sentence.",
]
MAX_TOKENS = 32
# bf16 rounds every activation (8 bits of mantissa), fp32 only reorders sums.
CLEAR_MARGIN = {"bfloat16": 0.5, "float32": 0.01}  # nats between HF's top two
FP32_TOL = 2e-3  # nats a token, fp32 against fp32
BF16_WORST = 0.4  # nats: no single bf16 log-prob further than this from the fp32 truth


@pytest.fixture(scope="module")
def default_server(default_model_path: str) -> Iterator[RunningServer]:
    running = RunningServer.start(default_model_path, base_args=())
    yield running
    running.stop()


def test_defaults_match_hf_in_the_same_dtype(default_server: RunningServer, default_model_path: str) -> None:
    info = requests.get(default_server.url + "/get_server_info", timeout=30).json()
    dtype = info["dtype"]
    assert dtype == ("bfloat16" if cpu_capability().native_bf16 else "float32")
    assert info["num_threads"] is None  # all cores, as a user gets it
    tok = transformers.AutoTokenizer.from_pretrained(default_model_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(default_model_path, dtype=getattr(torch, dtype)).eval()
    truth = hf if dtype == "float32" else transformers.AutoModelForCausalLM.from_pretrained(
        default_model_path, dtype=torch.float32).eval()
    checked, our_err, hf_err = 0, [], []
    for question in QUESTIONS:
        prompt = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                         add_generation_prompt=True)
        body = {"text": prompt, "return_logprob": True,
                "sampling_params": {"max_new_tokens": MAX_TOKENS, "temperature": 0}}
        out = post(default_server, "/generate", body).json()
        ids, meta = out["output_ids"], out["meta_info"]
        ours = [lp for lp, _, _ in meta["output_token_logprobs"]]
        prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        assert meta["prompt_tokens"] == len(prompt_ids)
        with torch.inference_mode():
            full = torch.tensor([prompt_ids + ids])
            logp = torch.log_softmax(hf(full).logits[0, len(prompt_ids) - 1 : -1].float(), dim=-1)
            true_logp = torch.log_softmax(truth(full).logits[0, len(prompt_ids) - 1 : -1].float(), dim=-1)
        top2 = logp.topk(2, dim=-1)
        for i, token in enumerate(ids):
            margin = float(top2.values[i, 0] - top2.values[i, 1])
            if margin > CLEAR_MARGIN[dtype]:
                assert token == int(top2.indices[i, 0]), (question, i, tok.decode(ids[: i + 1]), margin)
                checked += 1
            true = float(true_logp[i, token])
            our_err.append(abs(ours[i] - true))
            hf_err.append(abs(float(logp[i, token]) - true))
    assert checked >= len(QUESTIONS) * MAX_TOKENS // 2  # most positions are clear-cut
    if dtype == "float32":
        assert max(our_err) <= FP32_TOL, max(our_err)
    else:
        mean_ours, mean_hf = sum(our_err) / len(our_err), sum(hf_err) / len(hf_err)
        assert mean_ours <= 1.5 * mean_hf + 0.005, (mean_ours, mean_hf)
        assert max(our_err) <= BF16_WORST, max(our_err)
