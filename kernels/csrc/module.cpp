// The Python module of our CPU kernels: every entry point of kernels.h, registered here. Only
// pybind11 and torch's type casters are included (torch/csrc/utils/pybind.h, about 12 s to
// compile), not <torch/extension.h> (about 38 s: the whole C++ frontend, which nothing here uses).

#include <torch/csrc/utils/pybind.h>

#include "kernels.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using pybind11::arg;
  m.def("cascade_attention", &radixserve::cascade_attention,
        "decode attention for rows sharing a KV prefix: the prefix once for all rows, merged with each row's own slots",
        arg("q"), arg("k_pool"), arg("v_pool"), arg("shared_slots"), arg("slots"), arg("indptr"), arg("scale"));
  m.def("decode_attention", &radixserve::decode_attention,
        "paged decode attention over one layer of the KV pool: (out, lse)");
  m.def("decode_layer", &radixserve::decode_layer,
        "one decoder layer of a decode step on GGUF-block linears: (h, residual)", arg("h"), arg("residual"),
        arg("norms"), arg("eps"), arg("blocks"), arg("formats"), arg("out_features"), arg("biases"), arg("isa"),
        arg("table"), arg("num_heads"), arg("k_pool"), arg("v_pool"), arg("out_loc"), arg("slots"), arg("indptr"),
        arg("scale"), arg("shared_slots") = pybind11::none(), arg("parts") = std::vector<int64_t>());
  m.def("dense_gemv", &radixserve::dense_gemv, "x [M <= 16, K] @ W^T (+ bias) on a plain row-major fp32 or bf16 weight",
        arg("x"), arg("w"), arg("bias") = pybind11::none());
  m.def("prefill_attention", &radixserve::prefill_attention,
        "paged causal prefill attention over one layer of the KV pool (a row sees its last `window` keys; 0: all), "
        "into out [T, H, D]", arg("q"), arg("k_pool"), arg("v_pool"), arg("slots"), arg("q_indptr"), arg("kv_indptr"),
        arg("scale"), arg("out"), arg("window") = 0);
  m.def("rotary", &radixserve::rotary, "rotate_half rotary embedding of x [T, H, D] by a [T, 2D] cos/sin table");
  m.def("rms_norm", &radixserve::rms_norm, "(norm(x [+ residual]) * weight, x [+ residual]); fp32 math", arg("x"),
        arg("residual"), arg("weight"), arg("eps"));
  m.def("silu_mul", &radixserve::silu_mul, "SiLU(gate) * up of a fused gate_up row block");
  m.def("quant_linear", &radixserve::quant_linear,
        "x [M, K] @ W^T (+ bias) with W as GGUF blocks grouped by 8 rows (fmt: kernels/gguf_blocks.py; isa 0 avx2, 1 avx512)",
        arg("x"), arg("blocks"), arg("fmt"), arg("isa"), arg("out_features"), arg("bias") = pybind11::none());
  m.def("quantize_q8_rows", &radixserve::quantize_q8_rows, "the activation blocks quant_linear uses: (q, d, s)");
}
