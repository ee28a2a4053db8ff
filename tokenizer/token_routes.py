"""/tokenize and /detokenize (also under /v1/), as SGLang and vLLM serve them: agents count a
history's tokens before they send it.

    POST /tokenize    {"prompt": str | list[str], "add_special_tokens": bool = true}
                      -> {"tokens": [int] | [[int]], "count": int | [int], "max_model_len": int}
    POST /detokenize  {"tokens": [int], "skip_special_tokens": bool = false} -> {"text": str}

A prompt is encoded exactly as /generate encodes its `text` (so `count` is its prompt_tokens).
`model` may be given and is ignored, as on the other routes. Bad input is a 400 naming the field;
/detokenize takes at most MAX_DETOKENIZE_IDS (131072) ids. Long prompts and id lists are
encoded and decoded on the PromptEncoder's worker thread, off the event loop.
"""

from __future__ import annotations

from typing import Any

from runtime.contracts.errors import InvalidRequest
from tokenizer.server_state import ServerState

# A long context's worth of ids: more than any prompt or output this server can hold, and
# small enough that its validation (on the loop, before the decode leaves it) stays short.
MAX_DETOKENIZE_IDS = 1 << 17


async def tokenize(server: ServerState, body: Any) -> dict[str, Any]:
    body = _object(body)
    prompt = body.get("prompt")
    batch = isinstance(prompt, list)
    prompts = prompt if batch else [prompt]
    if not prompts or not all(isinstance(p, str) for p in prompts):
        raise InvalidRequest("prompt must be a string or a non-empty list of strings", param="prompt")
    limit = server.config.max_prompts_per_request
    if len(prompts) > limit:
        raise InvalidRequest(f"{len(prompts)} prompts; at most {limit} (--max-prompts-per-request)", param="prompt")
    add_special = body.get("add_special_tokens", True)
    if not isinstance(add_special, bool):
        raise InvalidRequest("add_special_tokens must be a boolean", param="add_special_tokens")
    ids = await server.manager().encoder.encode_texts(prompts, add_special)
    counts = [len(i) for i in ids]
    return {"tokens": ids if batch else ids[0], "count": counts if batch else counts[0],
            "max_model_len": server.config.context_length}


async def detokenize(server: ServerState, body: Any) -> dict[str, Any]:
    body = _object(body)
    tokens = body.get("tokens")
    tm = server.manager()
    vocab = tm.scheduler_info.get("vocab_size") or len(tm.tokenizer)
    if isinstance(tokens, list) and len(tokens) > MAX_DETOKENIZE_IDS:  # NOTE: before walking them
        raise InvalidRequest(f"tokens has {len(tokens)} ids; at most {MAX_DETOKENIZE_IDS}", param="tokens")
    # type() is int: JSON booleans are not ids; min/max run in C.
    if (not isinstance(tokens, list) or not all(type(t) is int for t in tokens)
            or (tokens and (min(tokens) < 0 or max(tokens) >= vocab))):
        raise InvalidRequest(f"tokens must be a list of at most {MAX_DETOKENIZE_IDS} token ids in [0, {vocab})",
                             param="tokens")
    skip = body.get("skip_special_tokens", False)
    if not isinstance(skip, bool):
        raise InvalidRequest("skip_special_tokens must be a boolean", param="skip_special_tokens")
    texts = await tm.encoder.decode([tokens], skip_special_tokens=skip)
    return {"text": texts[0]}


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    return body
