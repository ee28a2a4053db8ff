// What quant_gemm.cpp shares with the quant GEMM's ISA variants: the block layouts, the activation
// blocks and one entry point per variant. Plain C++ only (no ATen, no c10): each variant is its own
// translation unit compiled with only its own instruction set's flags (kernels/cpu_ext.py
// SOURCES), and an inline function from a shared header would be emitted in it too, where the
// linker may pick that copy, with the variant's instructions, for every caller in the module.

#pragma once

#include <cstdint>

namespace radixserve::quant {

constexpr int QK = 32;  // values per block, in every format here
enum Format : int { Q8_0 = 0, Q4_0 = 1, Q4_1 = 2 };
enum Isa : int { AVX2 = 0, AVX512 = 1 };

constexpr int GROUP_ROWS = 8;  // rows interleaved per group (kernels/gguf_blocks.py GROUP_ROWS)

// Per format: a block's bytes (q8_0: fp16 d, int8 q[32]; q4_0: fp16 d, 32 nibbles, low nibbles
// values 0-15, high 16-31; q4_1: fp16 d, fp16 m, 32 nibbles), the values' bytes per row-block,
// and a group-block's header (the 8 rows' fp16 scales, and for q4_1 their 8 fp16 minimums).
template <int F>
struct Layout {
  static constexpr int value_bytes = F == Q8_0 ? QK : QK / 2;
  static constexpr int block_bytes = (F == Q4_1 ? 4 : 2) + value_bytes;
  static constexpr int group_header = (F == Q4_1 ? 4 : 2) * GROUP_ROWS;
};

// One activation block: its scale, d * sum(q), and its 32 int8 values.
struct ActBlock {
  float d;
  float s;
  int8_t q[QK];
};

// One call's operands: y [m, n] (fp32, or bf16 as uint16 bits) = act [m, nblocks] x w^T (+ bias).
struct GemmCall {
  int fmt;
  const uint8_t* w;  // ceil(n / 8) row groups of nblocks group-blocks
  int64_t n;
  const ActBlock* act;
  int64_t nblocks;
  int64_t m;
  const float* bias;  // nullptr: none
  void* y;
  bool bf16_out;
};

// Row groups [g_begin, g_end) of `call` against all its activation rows (one thread's slice).
namespace avx2 {
void gemm_groups(const GemmCall& call, int64_t g_begin, int64_t g_end);
}
namespace avx512 {
void gemm_groups(const GemmCall& call, int64_t g_begin, int64_t g_end);
}

}  // namespace radixserve::quant
