"""/tokenize and /detokenize (also under /v1/), as SGLang and vLLM serve them: agents count a
history's tokens before they send it.

    POST /tokenize    {"prompt": str | list[str], "add_special_tokens": bool = true}
                      -> {"tokens": [int] | [[int]], "count": int | [int], "max_model_len": int}
    POST /detokenize  {"tokens": [int], "skip_special_tokens": bool = false} -> {"text": str}

A prompt is encoded exactly as /generate encodes its `text` (so `count` is its prompt_tokens).
`model` may be given and is ignored, as on the other routes. Bad input is a 400 naming the field;
/detokenize takes at most 131072 ids (native/spec.py). Long prompts and id lists are
encoded and decoded on the PromptEncoder's worker thread, off the event loop.
"""

from __future__ import annotations

from typing import Any

from runtime.contracts.errors import InvalidRequest
from tokenizer.core.spec import parse
from tokenizer.limits import check_prompt_chars, check_prompt_count
from tokenizer.native.spec import DetokenizeBody, TokenizeBody
from tokenizer.server_state import ServerState


async def tokenize(server: ServerState, body: Any) -> dict[str, Any]:
    parsed = parse(TokenizeBody, body)
    batch = isinstance(parsed.prompt, list)
    prompts = list(parsed.prompt) if isinstance(parsed.prompt, list) else [parsed.prompt]
    tm = server.manager()
    check_prompt_count(len(prompts), server.config.max_prompts_per_request, "prompt")
    for p in prompts:
        check_prompt_chars("prompt", len(p), tm.limits)
    ids = await tm.encoder.encode_texts(prompts, parsed.add_special_tokens)
    counts = [len(i) for i in ids]
    return {"tokens": ids if batch else ids[0], "count": counts if batch else counts[0],
            "max_model_len": server.config.context_length}


async def detokenize(server: ServerState, body: Any) -> dict[str, Any]:
    parsed = parse(DetokenizeBody, body)
    tm = server.manager()
    vocab = tm.scheduler_info.get("vocab_size") or len(tm.tokenizer)
    tokens = list(parsed.tokens)
    if tokens and max(tokens) >= vocab:
        raise InvalidRequest.field("tokens", f"token id {max(tokens)} is outside [0, {vocab})")
    texts = await tm.encoder.decode([tokens], skip_special_tokens=parsed.skip_special_tokens)
    return {"text": texts[0]}
