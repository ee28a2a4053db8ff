"""A request's `logit_bias` as device tensors (token ids, values), built once per request.

The sampler applies every biased row each step; rebuilding the tensors from the dict each step
cost Python work per entry per step (up to 1024 entries a request). The cache is keyed by the
identity of the request's SamplingParams: the scheduler hands the same object to every step.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from kernels.transfer import upload
from runtime.contracts.sampling import SamplingParams

BIAS_CACHE_ENTRIES = 4096
# A request's logit_bias as (token ids, values) device tensors, built once: keyed by the identity
# of its SamplingParams (the scheduler hands the same object to every step), the object itself
# kept in the entry so that its id cannot be reused while cached.
_cache: OrderedDict[int, tuple[SamplingParams, torch.Tensor, torch.Tensor]] = OrderedDict()


def request_bias(p: SamplingParams, vocab: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    hit = _cache.get(id(p))
    if hit is not None and hit[0] is p and hit[1].device == device:
        _cache.move_to_end(id(p))
        return hit[1], hit[2]
    pairs = [(tid, bias) for tid, bias in p.logit_bias_ids() if 0 <= tid < vocab]
    ids = upload([t for t, _ in pairs], torch.int64, device)
    values = upload([b for _, b in pairs], torch.float32, device)
    _cache[id(p)] = (p, ids, values)
    while len(_cache) > BIAS_CACHE_ENTRIES:
        _cache.popitem(last=False)
    return ids, values
