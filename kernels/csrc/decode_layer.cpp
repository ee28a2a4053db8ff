// One decoder layer of a decode step in one call: the norms, the four linears on GGUF blocks,
// the rotary, the KV write and the decode attention, each by the same kernel the layer's Python
// path calls (runtime/models/decode_stack.py says when this path applies).
//
// Why: at one decode row the kernels of a layer take about 140 us and the Python around them
// (module calls, views, the KV write's two index_copy_ and their casts) about as much again: 30
// layers of it were a third of a Q4_1 step. Here the same kernels run back to back from C++, so
// the results are the Python path's bit for bit (tests/runtime/models/test_decode_stack.py).

#include "kernels.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/index_copy.h>

namespace {

// One of the layer's linears: x [B, K] -> [B, out], through the block kernel, part by part for a
// fused linear whose parts are stored in different formats (their outputs side by side).
struct BlockLinear {
  std::vector<at::Tensor> blocks;
  std::vector<int64_t> formats;
  std::vector<int64_t> out_features;
  std::vector<at::Tensor> biases;  // empty tensor: none

  at::Tensor operator()(const at::Tensor& x, int64_t isa) const {
    std::vector<at::Tensor> outs;
    for (size_t i = 0; i < blocks.size(); ++i) {
      const at::Tensor& b = biases[i];
      const c10::optional<at::Tensor> bias = b.defined() && b.numel() > 0 ? c10::optional<at::Tensor>(b) : c10::nullopt;
      outs.push_back(radixserve::quant_linear(x, blocks[i], formats[i], isa, out_features[i], bias));
    }
    return outs.size() == 1 ? outs[0] : at::cat(outs, 1);
  }
};

// The 4 linears from the flat per-part lists; parts[i] is linear i's count (empty: one each).
std::vector<BlockLinear> linears_of(const std::vector<at::Tensor>& blocks, const std::vector<int64_t>& formats,
                                    const std::vector<int64_t>& out_features, const std::vector<at::Tensor>& biases,
                                    std::vector<int64_t> parts) {
  if (parts.empty()) parts.assign(4, 1);
  int64_t total = 0;
  for (const int64_t n : parts) total += n;
  TORCH_CHECK(parts.size() == 4 && blocks.size() == static_cast<size_t>(total) && formats.size() == blocks.size() &&
              out_features.size() == blocks.size() && biases.size() == blocks.size(),
              "decode_layer: 4 linears (qkv, o, gate_up, down), each given as `parts` block tensors");
  std::vector<BlockLinear> linears;
  size_t at = 0;
  for (const int64_t n : parts) {
    TORCH_CHECK(n >= 1, "decode_layer: every linear has at least one part");
    const auto first = static_cast<std::ptrdiff_t>(at), last = static_cast<std::ptrdiff_t>(at + n);
    linears.push_back({{blocks.begin() + first, blocks.begin() + last}, {formats.begin() + first, formats.begin() + last},
                       {out_features.begin() + first, out_features.begin() + last},
                       {biases.begin() + first, biases.begin() + last}});
    at += static_cast<size_t>(n);
  }
  return linears;
}

}  // namespace

namespace radixserve {

// h [B, hidden] and the residual stream (None before the first layer: h is the residual); norms
// [in, post]; blocks, formats, out_features and biases (empty tensor: none) of [qkv, o, gate_up,
// down], part by part where `parts` gives a linear several (empty: one each); table [B, 2 * head_dim] (rotary.cpp's); the layer's pools [S, kv_heads, head_dim], each
// row's new slot out_loc [B] and its KV slots slots/indptr (decode_attention.cpp's; with
// shared_slots, the slots every row has before its own: cascade_attention.cpp's). Returns the
// layer's output and the residual stream, as DecoderLayer.forward does.
std::vector<at::Tensor> decode_layer(at::Tensor h, c10::optional<at::Tensor> residual, std::vector<at::Tensor> norms,
                                     double eps, std::vector<at::Tensor> blocks, std::vector<int64_t> formats,
                                     std::vector<int64_t> out_features, std::vector<at::Tensor> biases, int64_t isa,
                                     at::Tensor table, int64_t num_heads, at::Tensor k_pool, at::Tensor v_pool,
                                     at::Tensor out_loc, at::Tensor slots, at::Tensor indptr, double scale,
                                     c10::optional<at::Tensor> shared_slots, std::vector<int64_t> parts) {
  TORCH_CHECK(norms.size() == 2, "decode_layer: 2 norms (input, post-attention)");
  TORCH_CHECK(h.dim() == 2 && k_pool.dim() == 3, "decode_layer: h [B, hidden], pools [S, kv_heads, head_dim]");
  const std::vector<BlockLinear> linears = linears_of(blocks, formats, out_features, biases, std::move(parts));
  const BlockLinear& qkv_proj = linears[0];
  const BlockLinear& o_proj = linears[1];
  const BlockLinear& gate_up_proj = linears[2];
  const BlockLinear& down_proj = linears[3];
  const int64_t rows = h.size(0), kv_heads = k_pool.size(1), head_dim = k_pool.size(2);

  std::vector<at::Tensor> normed = rms_norm(h, residual, norms[0], eps);
  at::Tensor stream = residual.has_value() ? normed[1] : h;
  const at::Tensor qkv = qkv_proj(normed[0], isa);
  const int64_t qk_width = (num_heads + kv_heads) * head_dim;
  TORCH_CHECK(qkv.size(1) == qk_width + kv_heads * head_dim, "decode_layer: qkv's width is the heads'");
  // q and k rotate together, as Attention.forward does; v is the rest of qkv.
  const at::Tensor qk = rotary(qkv.narrow(1, 0, qk_width).view({rows, num_heads + kv_heads, head_dim}), table);
  const at::Tensor v = qkv.narrow(1, qk_width, kv_heads * head_dim).view({rows, kv_heads, head_dim});
  k_pool.index_copy_(0, out_loc, qk.narrow(1, num_heads, kv_heads));
  v_pool.index_copy_(0, out_loc, v);
  const at::Tensor q = qk.narrow(1, 0, num_heads).contiguous();
  const at::Tensor attn = (shared_slots.has_value()
                               ? cascade_attention(q, k_pool, v_pool, *shared_slots, slots, indptr, scale)
                               : decode_attention(q, k_pool, v_pool, slots, indptr, scale)[0])
                              .view({rows, num_heads * head_dim});

  normed = rms_norm(o_proj(attn, isa), stream, norms[1], eps);
  const at::Tensor act = silu_mul(gate_up_proj(normed[0], isa));
  return {down_proj(act, isa), normed[1]};
}

}  // namespace radixserve
