// The entry points of our CPU kernels, one block per source file; module.cpp registers them with
// Python. The kernel sources include this and ATen's light headers, never <torch/extension.h>:
// that header (pybind11 and the whole C++ frontend) took about 38 s to compile per file, most of
// a build's time.

#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <cstdint>
#include <tuple>
#include <vector>

namespace radixserve {

// cascade_attention.cpp
at::Tensor cascade_attention(at::Tensor q, at::Tensor k_pool, at::Tensor v_pool, at::Tensor shared_slots,
                             at::Tensor slots, at::Tensor indptr, double scale);

// decode_attention.cpp
std::vector<at::Tensor> decode_attention(at::Tensor q, at::Tensor k_pool, at::Tensor v_pool, at::Tensor slots,
                                         at::Tensor indptr, double scale);

// decode_layer.cpp
std::vector<at::Tensor> decode_layer(at::Tensor h, c10::optional<at::Tensor> residual, std::vector<at::Tensor> norms,
                                     double eps, std::vector<at::Tensor> blocks, std::vector<int64_t> formats,
                                     std::vector<int64_t> out_features, std::vector<at::Tensor> biases, int64_t isa,
                                     at::Tensor table, int64_t num_heads, at::Tensor k_pool, at::Tensor v_pool,
                                     at::Tensor out_loc, at::Tensor slots, at::Tensor indptr, double scale,
                                     c10::optional<at::Tensor> shared_slots, std::vector<int64_t> parts);

// dense_gemv.cpp
at::Tensor dense_gemv(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias);

// prefill_attention.cpp (prefill_attention writes `out`)
void prefill_attention(at::Tensor q, at::Tensor k_pool, at::Tensor v_pool, at::Tensor slots, at::Tensor q_indptr,
                       at::Tensor kv_indptr, double scale, at::Tensor out, int64_t window);
std::vector<at::Tensor> shared_prefix_attention(at::Tensor q, at::Tensor k_pool, at::Tensor v_pool, at::Tensor slots,
                                                double scale);

// elementwise.cpp
std::vector<at::Tensor> rms_norm(at::Tensor x, c10::optional<at::Tensor> residual, at::Tensor weight, double eps);
at::Tensor silu_mul(at::Tensor gate_up);
at::Tensor rotary(at::Tensor x, at::Tensor table);

// quant_gemm.cpp
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& w, int64_t fmt, int64_t isa, int64_t out_features,
                        const c10::optional<at::Tensor>& bias);
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_q8_rows(const at::Tensor& x);

}  // namespace radixserve
