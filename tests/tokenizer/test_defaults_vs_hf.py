"""The configuration users get: the server started with no flags but the model path (dtype
`auto` for this CPU, all cores, default KV pool and chunking) against Hugging Face transformers
in the same dtype.

HF scores our output by teacher forcing (one forward over prompt + our tokens): wherever HF's
top-2 log-prob margin is clear, our greedy token is HF's argmax, and our reported log-probs stay
within the dtype's tolerance of HF's.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests
import torch
import transformers

from runtime.device import cpu_capability
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
LOGPROB_TOL = {"bfloat16": 0.25, "float32": 2e-3}  # nats, per token


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
    checked = 0
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
            logits = hf(torch.tensor([prompt_ids + ids])).logits[0, len(prompt_ids) - 1 : -1].float()
        logp = torch.log_softmax(logits, dim=-1)
        top2 = logp.topk(2, dim=-1)
        for i, token in enumerate(ids):
            margin = float(top2.values[i, 0] - top2.values[i, 1])
            if margin > CLEAR_MARGIN[dtype]:
                assert token == int(top2.indices[i, 0]), (question, i, tok.decode(ids[: i + 1]), margin)
                checked += 1
            assert abs(ours[i] - float(logp[i, token])) <= LOGPROB_TOL[dtype], (question, i, ours[i], float(logp[i, token]))
    assert checked >= len(QUESTIONS) * MAX_TOKENS // 2  # most positions are clear-cut
