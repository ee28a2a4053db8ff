"""Our FlashInfer backend on CPU, over a stand-in module with FlashInfer's signatures and checks
(tests/kernels/fake_flashinfer.py): the wrappers it builds, what it hands plan() and run(), and
the outputs of a runner driving it against the torch backend on the same weights. The real
library is compared the same way by scripts/gpu_check.py on a GPU."""

from __future__ import annotations

import pytest
import torch

from kernels.flashinfer_support import PREFILL_BACKEND
from tests.kernels import fake_flashinfer as fake
from tests.kernels.backend_scenarios import BF16_LOGIT_TOLERANCE, SCENARIOS, max_logit_error, run_scenario
from tests.runtime.execution.tiny_runner import SHAPES, fake_flashinfer, make_runner, write_config  # noqa: F401


@pytest.mark.parametrize("shape,tensor_cores", [("smollm2", False), ("llama-3.2-1b", True), ("qwen2-group7", True)])
def test_wrappers_as_sglang_builds_them(tmp_path, fake_flashinfer, shape: str, tensor_cores: bool) -> None:  # noqa: F811
    runner = make_runner(write_config(tmp_path / "m", *SHAPES[shape]), backend="fake-flashinfer", dtype="bfloat16")
    backend = runner.backend
    assert backend.prefill._backend == PREFILL_BACKEND == "fa2"
    assert backend.decode.use_tensor_cores is tensor_cores
    assert all(not ws.any() for ws in fake.WORKSPACES)  # zeroed, as FlashInfer asks
    for wrapper in (backend.prefill, backend.decode):  # plan staging: the backend's shared pair
        assert any(wrapper._pin_memory_int_workspace_buffer is b for b in backend.staging.buffers)
    runner.warmup()  # a prefill then a decode: group 7 needs the tensor-core decode to plan at all
    kinds = [kind for kind, _ in fake.PLANS]
    assert kinds == ["prefill", "decode"]
    for kind, args in fake.PLANS:  # as handed to plan(): host int32 indptrs, the page list on the device
        for name in ("qo_indptr", "kv_indptr", "last_page_len")[kind == "decode" :]:
            assert args[name].device.type == "cpu" and args[name].dtype == torch.int32, (kind, name)
        assert args["q_data_type"] == torch.bfloat16 and args["kv_data_type"] == torch.bfloat16
        assert args["non_blocking"] is True
        assert args["indices"].device == fake.WORKSPACES[0].device and args["indices"].dtype == torch.int32
    assert fake.COPIES == []  # no blocking copy of the indptrs back to the host, no page list uploaded
    assert fake.PLANS[0][1]["causal"] is True


def test_cuda_core_decode_rejects_group_7_as_flashinfer_does(fake_flashinfer) -> None:  # noqa: F811
    wrapper = fake.BatchDecodeWithPagedKVCacheWrapper(torch.zeros(8), "NHD", use_tensor_cores=False)
    one = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="Unsupported group_size: 7"):
        wrapper.plan(one, one[:1], one[1:], num_qo_heads=14, num_kv_heads=2, head_dim=64, page_size=1)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("shape", ["llama-3.2-1b", "qwen2-group7"])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_runner_on_flashinfer_matches_torch_backend(tmp_path, fake_flashinfer, shape, page_size, scenario) -> None:  # noqa: F811
    path = write_config(tmp_path / "m", *SHAPES[shape])
    # bf16 for both: FlashInfer has no fp32 kernels (the stand-in refuses fp32 as the real one does).
    ours = run_scenario(make_runner(path, backend="fake-flashinfer", page_size=page_size, dtype="bfloat16"), scenario,
                        decode_steps=4)
    torch_backend = run_scenario(make_runner(path, page_size=page_size, dtype="bfloat16"), scenario, decode_steps=4)
    assert max_logit_error(ours, torch_backend) < BF16_LOGIT_TOLERANCE
