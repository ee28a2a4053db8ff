"""The FlashInfer stand-in (tests/kernels/fake_flashinfer.py) is as strict as FlashInfer 0.6.18.post1:
each call the real library (or its kernels) would refuse or get wrong is refused here, on CPU, and
the calls our backend makes still pass. Batches here: 2 requests over pages of 4 tokens."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.kernels import fake_flashinfer as fake

HEADS, KV_HEADS, HEAD_DIM, PAGE = 4, 2, 8, 4
I32 = torch.int32
BATCH = ("indptr", "indices", "last_page_len")  # the decode plan's names for _batch()


def _index(values: list[int], dtype: torch.dtype = I32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def _batch(dtype: torch.dtype = I32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(indptr, indices, last_page_len): request 0 on pages 1, 2 (7 tokens), request 1 on page 3 (1 token)."""
    return _index([0, 2, 3], dtype), _index([1, 2, 3], dtype), _index([3, 1], dtype)


def _cache(dtype: torch.dtype = torch.bfloat16, shape: tuple[int, ...] = (5, PAGE, KV_HEADS, HEAD_DIM)
           ) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)


def _decode(tensor_cores: bool = False, **plan: Any) -> fake.BatchDecodeWithPagedKVCacheWrapper:
    wrapper = fake.BatchDecodeWithPagedKVCacheWrapper(torch.zeros(1024, dtype=torch.uint8), "NHD",
                                                      use_tensor_cores=tensor_cores)
    args: dict[str, Any] = dict(zip(BATCH, _batch()), num_qo_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                                page_size=PAGE, q_data_type=torch.bfloat16)
    wrapper.plan(**{**args, **plan})
    return wrapper


def _q(rows: int = 2, heads: int = HEADS, dtype: torch.dtype = torch.bfloat16, **kw: Any) -> torch.Tensor:
    return torch.randn(rows, heads, HEAD_DIM, **kw).to(dtype)


def test_a_legal_decode_and_prefill_run() -> None:
    out = _decode().run(_q(), _cache())
    assert out.shape == (2, HEADS, HEAD_DIM) and out.dtype == torch.bfloat16
    prefill = fake.BatchPrefillWithPagedKVCacheWrapper(torch.zeros(1024, dtype=torch.uint8), "NHD", backend="fa2")
    prefill.plan(_index([0, 5, 6]), *_batch(), HEADS, KV_HEADS, HEAD_DIM, PAGE, causal=True,
                 q_data_type="bfloat16", kv_data_type=torch.bfloat16)
    assert prefill.run(_q(6), _cache()).shape == (6, HEADS, HEAD_DIM)


# -- signatures: an unknown keyword is a TypeError, as Python raises it for the real ones -------------

def test_unknown_keywords_are_rejected() -> None:
    workspace = torch.zeros(1024, dtype=torch.uint8)
    with pytest.raises(TypeError, match="unexpected keyword argument 'use_tensor_core'"):
        fake.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_core=True)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected keyword argument 'use_tensor_cores'"):
        fake.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=True)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="_plan_impl\\(\\) got an unexpected keyword argument 'causal'"):
        _decode(causal=False)  # the decode plan has no causal (its kwargs go on to _plan_impl)
    with pytest.raises(TypeError, match="unexpected keyword argument 'head_dim'"):
        fake.BatchPrefillWithPagedKVCacheWrapper(workspace).plan(  # type: ignore[call-arg]
            _index([0, 1, 2]), *_batch(), num_qo_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM,
            page_size=PAGE)  # prefill names it head_dim_qk
    with pytest.raises(TypeError, match="unexpected keyword argument 'scale'"):
        _decode().run(_q(), _cache(), scale=1.0)  # type: ignore[call-arg]


def test_decode_plan_takes_its_optional_arguments_by_position_deprecated() -> None:
    wrapper = fake.BatchDecodeWithPagedKVCacheWrapper(torch.zeros(1024, dtype=torch.uint8))
    with pytest.warns(DeprecationWarning):  # pos_encoding_mode, window_left, logits_soft_cap, q_data_type
        wrapper.plan(*_batch(), HEADS, KV_HEADS, HEAD_DIM, PAGE, "NONE", -1, None, torch.bfloat16)
    assert fake.PLANS[-1][1]["q_data_type"] == torch.bfloat16
    with pytest.raises(TypeError, match="multiple values for argument 'window_left'"):
        wrapper.plan(*_batch(), HEADS, KV_HEADS, HEAD_DIM, PAGE, "NONE", -1, window_left=-1)


def test_arguments_the_stand_in_would_ignore_are_refused() -> None:
    with pytest.raises(NotImplementedError, match="pos_encoding_mode='ROPE_LLAMA'"):
        _decode(pos_encoding_mode="ROPE_LLAMA")
    with pytest.raises(NotImplementedError, match="return_lse"):
        _decode().run(_q(), _cache(), return_lse=True)


# -- dtypes -------------------------------------------------------------------------------------------

def test_fp32_is_rejected_in_plan_and_in_run() -> None:
    with pytest.raises(KeyError, match="float32"):  # no fp32 kernels: the real plan's kernel lookup fails
        _decode(q_data_type=torch.float32)
    with pytest.raises(KeyError, match="float32"):
        _decode(kv_data_type="float32")
    with pytest.raises(ValueError, match="does not match the q_data_type"):
        _decode().run(_q(dtype=torch.float32), _cache())


def test_q_and_kv_must_have_the_planned_dtypes() -> None:
    with pytest.raises(ValueError, match="dtype of q torch.float16 does not match"):
        _decode().run(_q(dtype=torch.float16), _cache())
    with pytest.raises(ValueError, match="dtype of k torch.float16 does not match the kv_data_type"):
        _decode().run(_q(), _cache(torch.float16))


@pytest.mark.parametrize("name,called", [("indptr", "kv_indptr"), ("indices", "indices"),
                                         ("last_page_len", "last_page_len")])
def test_index_tensors_must_be_int32(name: str, called: str) -> None:
    int64: dict[str, Any] = {name: _batch(torch.int64)[BATCH.index(name)]}
    with pytest.raises(RuntimeError, match=f"Inconsistency of Tensor type: {called} is torch.int64"):
        _decode(**int64)


# -- GQA groups ---------------------------------------------------------------------------------------

def test_cuda_core_decode_groups() -> None:
    with pytest.raises(RuntimeError, match="Unsupported group_size: 7"):
        _decode(num_qo_heads=14)
    _decode(num_qo_heads=14, tensor_cores=True)  # the tensor-core decode takes any whole group
    _decode(num_qo_heads=12)  # group 6: dispatched by 0.6.18's CUDA-core decode
    with pytest.raises(RuntimeError, match="should be divisible by num_kv_heads"):
        _decode(num_qo_heads=5, tensor_cores=True)


# -- shapes and devices in run() ----------------------------------------------------------------------

def test_q_must_match_the_plan() -> None:
    wrapper = _decode()
    with pytest.raises(ValueError, match="the plan needs \\[tokens, num_qo_heads, head_dim\\] = \\(2, 4, 8\\)"):
        wrapper.run(_q(heads=2), _cache())  # wrong head count
    with pytest.raises(ValueError, match="the plan needs"):
        wrapper.run(_q(rows=3), _cache())  # not one query per request
    with pytest.raises(ValueError, match="the plan needs"):
        wrapper.run(_q().reshape(2, HEADS * HEAD_DIM), _cache())  # not 3-D
    with pytest.raises(ValueError, match="q is on meta, the workspace on cpu"):
        wrapper.run(_q(device="meta"), _cache())


def test_the_paged_cache_must_be_nhd_and_match_the_plan() -> None:
    wrapper = _decode()
    with pytest.raises(ValueError, match="the plan needs NHD"):
        wrapper.run(_q(), _cache(shape=(5, KV_HEADS, PAGE, HEAD_DIM)))  # HND
    with pytest.raises(ValueError, match="the plan needs NHD"):
        wrapper.run(_q(), _cache(shape=(5, 2 * PAGE, KV_HEADS, HEAD_DIM)))  # another page size
    k, v = _cache()
    with pytest.raises(RuntimeError, match="strides differ"):
        wrapper.run(_q(), (k, v.transpose(0, 1).contiguous().transpose(0, 1)))
    with pytest.raises(KeyError, match="Unrecognized paged_kv_cache type"):
        wrapper.run(_q(), [k, v])


# -- the batch layout in plan() -----------------------------------------------------------------------

@pytest.mark.parametrize("bad,match", [
    (dict(indptr=_index([0, 2])), "kv_indptr has 2 entries for a batch of 2"),
    (dict(last_page_len=_index([3])), "kv_indptr has 3 entries for a batch of 1"),
    (dict(indptr=_index([0, 3, 2])), "non-decreasing"),
    (dict(indptr=_index([0, 2, 2])), "every request needs a page"),
    (dict(indices=_index([1, 2])), "2 page indices for kv_indptr\\[-1\\] = 3"),
    (dict(last_page_len=_index([5, 1])), "within \\[1, page_size=4\\]"),
])
def test_plan_rejects_a_broken_layout(bad: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _decode(**bad)


def test_prefill_q_rows_are_qo_indptr_last() -> None:
    prefill = fake.BatchPrefillWithPagedKVCacheWrapper(torch.zeros(1024, dtype=torch.uint8))
    prefill.plan(_index([0, 5, 6]), *_batch(), HEADS, KV_HEADS, HEAD_DIM, PAGE, q_data_type=torch.bfloat16)
    with pytest.raises(ValueError, match="\\(6, 4, 8\\)"):
        prefill.run(_q(5), _cache())
    with pytest.raises(ValueError, match="qo_indptr has 2 entries for a batch of 2"):
        prefill.plan(_index([0, 5]), *_batch(), HEADS, KV_HEADS, HEAD_DIM, PAGE, q_data_type=torch.bfloat16)


# -- host and device: legal copies are recorded -------------------------------------------------------

def test_a_host_page_list_is_a_recorded_upload(monkeypatch: pytest.MonkeyPatch) -> None:
    fake.install(monkeypatch)
    wrapper = fake.BatchDecodeWithPagedKVCacheWrapper(torch.zeros(1024, dtype=torch.uint8, device="meta"))
    wrapper.plan(*_batch(), HEADS, KV_HEADS, HEAD_DIM, PAGE, q_data_type=torch.bfloat16)
    assert fake.COPIES == [("decode", "indices", "to device")]  # FlashInfer copies it: legal, but per batch


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a device that is not the host")
def test_device_indptrs_are_recorded_blocking_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    fake.install(monkeypatch)
    wrapper = fake.BatchDecodeWithPagedKVCacheWrapper(torch.zeros(1024, dtype=torch.uint8, device="cuda"))
    batch = {name: t.cuda() for name, t in zip(BATCH, _batch())}
    wrapper.plan(**batch, num_qo_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, page_size=PAGE,
                 q_data_type=torch.bfloat16)
    assert fake.COPIES == [("decode", "indptr", "to host"), ("decode", "last_page_len", "to host")]


# -- graph mode ---------------------------------------------------------------------------------------

def test_graph_mode_fixes_the_batch_and_runs_from_its_buffers() -> None:
    buffers: dict[str, Any] = dict(paged_kv_indptr_buffer=torch.zeros(3, dtype=I32),
                                   paged_kv_indices_buffer=torch.zeros(8, dtype=I32),
                                   paged_kv_last_page_len_buffer=torch.ones(2, dtype=I32))
    wrapper = fake.BatchDecodeWithPagedKVCacheWrapper(torch.zeros(1024, dtype=torch.uint8), use_cuda_graph=True,
                                                      **buffers)
    wrapper.plan(*_batch(), HEADS, KV_HEADS, HEAD_DIM, PAGE, q_data_type=torch.bfloat16)
    assert buffers["paged_kv_indices_buffer"][:3].tolist() == [1, 2, 3]  # plan() copied the batch in
    q, cache = _q(), _cache()
    planned = wrapper.run(q, cache)
    buffers["paged_kv_indices_buffer"][:3] = torch.tensor([4, 4, 4])  # run() reads the buffers, as a graph does
    assert not torch.equal(wrapper.run(q, cache), planned)
    with pytest.raises(ValueError, match="The batch size should be fixed in cudagraph mode"):
        wrapper.plan(_index([0, 1]), _index([1]), _index([1]), HEADS, KV_HEADS, HEAD_DIM, PAGE)
    with pytest.raises(RuntimeError, match="Inconsistency of Tensor type: the indices buffer"):
        fake.BatchDecodeWithPagedKVCacheWrapper(torch.zeros(1024, dtype=torch.uint8), use_cuda_graph=True,
                                                **{**buffers, "paged_kv_indices_buffer": torch.zeros(8)})
