// What quant_gemm.cpp shares with the quant GEMM's ISA variants: the block layouts, the activation
// blocks and one entry point per variant. Plain C++ only (no ATen, no c10): each variant is its own
// translation unit compiled with only its own instruction set's flags (kernels/cpu_ext.py
// SOURCES), and an inline function from a shared header would be emitted in it too, where the
// linker may pick that copy, with the variant's instructions, for every caller in the module.

#pragma once

#include <cstdint>

namespace radixserve::quant {

constexpr int QK = 32;  // values per block (and per K-quant sub-block), in every format here
constexpr int QK_K = 256;  // values per K-quant super-block
enum Format : int { Q8_0 = 0, Q4_0 = 1, Q4_1 = 2, Q5_0 = 3, Q5_1 = 4, Q4_K = 5, Q5_K = 6, Q6_K = 7 };
constexpr int FORMATS = 8;
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

// The repacked layouts of q5_0, q5_1, Q4_K, Q5_K and Q6_K (kernels/gguf_blocks.py repack_rows holds
// the byte-level definition): per group of 8 rows and super-block (32 values for q5_x, 256 for the
// K-quants), a header of the 8 rows' fp16 scales (d; then q5_1's minimums m or Q4_K/Q5_K's dmin),
// then per sub-block of 32: Q4_K/Q5_K's 8 u8 scales then 8 u8 minimums, or Q6_K's 8 int8 scales
// of values 0-15 then 8 of values 16-31; then `planes` 32-byte high-bit planes; then the 8 rows'
// low nibbles in q4_0's chunks. Byte 4r + k of a plane holds, in bit 2c + s, that plane's bit
// (value bit 4, then bit 5) of row r's value 4c + k + 16s: the bits of chunk c's low (s = 0) and
// high (s = 1) nibbles. Every value bit of the file is kept; the 6-bit scales are widened to bytes.
template <int F>
struct KLayout {
  static constexpr bool k_quant = F == Q4_K || F == Q5_K || F == Q6_K;
  static constexpr int sub_blocks = k_quant ? QK_K / QK : 1;
  static constexpr int super_header = (F == Q5_1 || F == Q4_K || F == Q5_K ? 4 : 2) * GROUP_ROWS;
  static constexpr int sub_header = k_quant ? 2 * GROUP_ROWS : 0;
  static constexpr int planes = F == Q4_K ? 0 : (F == Q6_K ? 2 : 1);
  static constexpr int sub_bytes = sub_header + 32 * planes + GROUP_ROWS * QK / 2;
  static constexpr int super_bytes = super_header + sub_blocks * sub_bytes;
};

// Per format: values per super-block and a group-superblock's bytes (8 rows).
template <int F>
constexpr int super_values() {
  if constexpr (F <= Q4_1) return QK; else return KLayout<F>::sub_blocks * QK;
}
template <int F>
constexpr int super_bytes() {
  if constexpr (F <= Q4_1) return GROUP_ROWS * Layout<F>::block_bytes; else return KLayout<F>::super_bytes;
}

// One activation block: its scale, d * sum(q), the integer sums of q's two halves (values 0-15
// and 16-31: Q6_K's sub-blocks of 16 take their offset against them), and its 32 int8 values.
struct ActBlock {
  float d;
  float s;
  int32_t half_sum[2];
  int8_t q[QK];
};

// One call's operands: y [m, n] (fp32, or bf16 as uint16 bits) = act [m, nblocks] x w^T (+ bias).
struct GemmCall {
  int fmt;
  const uint8_t* w;  // ceil(n / 8) row groups of nblocks * 32 / super_values group-superblocks
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
