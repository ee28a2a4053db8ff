// Linears on GGUF's block-quantized weights (q8_0, q4_0, q4_1), computed from the blocks as they
// are stored: y[M, N] = x[M, K] @ W[N, K]^T (+ bias), W held as N rows of K/32 blocks, the rows
// interleaved by 8 at load (kernels/gguf_blocks.py interleave_rows: the same bytes, reordered so
// that 8 rows' scales sit together and 8 rows' values share each vector; quant_gemm_groups.h).
//
// How activations meet the weights (ggml's way, chosen by measurement, docs/benchmarks.md): each
// row of x is quantized once per call to 8-bit blocks of 32 (scale d = max|x| / 127, q =
// round-to-nearest-even(x / d), and s = d * sum(q)), and each weight block meets each activation
// block through an exact integer dot product (u8 x s8 multiply-adds), scaled once per block pair
// in fp32:
//   q8_0 (w = d_w * q):        d_w * d_a * sum(q * a)   (AVX2: |q| . a * sign(q))
//                              d_w * d_a * sum((q + 128) * a) - 128 * d_w * s_a   (VNNI)
//   q4_0 (w = d_w * (u - 8)):  d_w * d_a * sum(u * a) - 8 * d_w * s_a
//   q4_1 (w = d_w * u + m_w):  d_w * d_a * sum(u * a) + m_w * s_a
// The integer sums never overflow: |a| <= 127 and u <= 15 (q4) or |q| <= 127 (q8_0: ggml's and
// our quantizers both clamp to +-127), so an AVX2 pair of products is at most 2 * 127 * 127 <
// 2^15; VNNI adds its u8 x s8 products straight into int32.
//
// One build serves both CPUs: quant_gemm_groups.h is compiled twice, for AVX2 and for AVX-512
// VNNI, under target pragmas, and the caller (kernels/quant_linear.py, from
// runtime/execution/device.py's reading of the CPU) picks one per call. Threads split the row
// groups (torch's thread pool).

#include "kernels.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

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

int block_bytes(int fmt) {
  switch (fmt) {
    case Q8_0: return Layout<Q8_0>::block_bytes;
    case Q4_0: return Layout<Q4_0>::block_bytes;
    case Q4_1: return Layout<Q4_1>::block_bytes;
    default: TORCH_CHECK(false, "unknown block format ", fmt);
  }
}

// One activation block: its scale, d * sum(q), and its 32 int8 values.
struct ActBlock {
  float d;
  float s;
  int8_t q[QK];
};

template <typename T>
inline void store_out(T* dst, float v) { *dst = static_cast<T>(v); }


#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {
#define RS_VNNI 0
#include "quant_gemm_groups.h"
#undef RS_VNNI
}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")
namespace avx512 {
#define RS_VNNI 1
#include "quant_gemm_groups.h"
#undef RS_VNNI
}  // namespace avx512
#pragma GCC pop_options

template <typename T>
void gemm_format(int fmt, int isa, const uint8_t* w, int64_t n, const ActBlock* act, int64_t nblocks, int64_t m,
                 const float* bias, T* y) {
  switch (fmt * 2 + isa) {
    case Q8_0 * 2 + AVX2: avx2::gemm<Q8_0>(w, n, act, nblocks, m, bias, y); break;
    case Q4_0 * 2 + AVX2: avx2::gemm<Q4_0>(w, n, act, nblocks, m, bias, y); break;
    case Q4_1 * 2 + AVX2: avx2::gemm<Q4_1>(w, n, act, nblocks, m, bias, y); break;
    case Q8_0 * 2 + AVX512: avx512::gemm<Q8_0>(w, n, act, nblocks, m, bias, y); break;
    case Q4_0 * 2 + AVX512: avx512::gemm<Q4_0>(w, n, act, nblocks, m, bias, y); break;
    case Q4_1 * 2 + AVX512: avx512::gemm<Q4_1>(w, n, act, nblocks, m, bias, y); break;
    default: TORCH_CHECK(false, "unknown block format ", fmt, " or isa ", isa);
  }
}

// x fp32 or bf16 [M, K]: bf16 is read as it is (a prefill's [2048, 1536] activation took 3.7 ms
// to convert to fp32 first, 10% of the step).
std::vector<ActBlock> quantize_activations(const at::Tensor& x) {
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  const at::Tensor xc = bf16 ? x.contiguous() : x.to(at::kFloat).contiguous();
  const int64_t m = xc.size(0), k = xc.size(1), nblocks = k / QK;
  std::vector<ActBlock> act(static_cast<size_t>(m * nblocks));
  // AVX2's variant for both: the AVX-512 kernels read the same blocks (the values are the same
  // either way, bit for bit).
  at::parallel_for(0, m, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      if (bf16) {
        avx2::quantize_row(xc.data_ptr<c10::BFloat16>() + r * k, k, act.data() + r * nblocks);
      } else {
        avx2::quantize_row(xc.data_ptr<float>() + r * k, k, act.data() + r * nblocks);
      }
    }
  });
  return act;
}

// Checks the grouped blocks of an [n, k] weight (kernels/gguf_blocks.py interleave_rows):
// [ceil(n / 8), k / 32 * 8 * block bytes] uint8.
void check_blocks(const at::Tensor& w, int64_t fmt, int64_t k, int64_t n) {
  TORCH_CHECK(fmt >= Q8_0 && fmt <= Q4_1, "unknown block format ", fmt);
  TORCH_CHECK(k > 0 && k % QK == 0, "in_features must be a positive multiple of ", QK, ", got ", k);
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kByte && w.is_contiguous(),
              "blocks must be a contiguous uint8 [row groups, bytes per group] tensor");
  const int64_t group_bytes = k / QK * GROUP_ROWS * block_bytes(static_cast<int>(fmt));
  TORCH_CHECK(w.size(0) == (n + GROUP_ROWS - 1) / GROUP_ROWS && w.size(1) == group_bytes, "blocks are [", w.size(0),
              ", ", w.size(1), "]; format ", fmt, " with ", n, " rows of ", k, " needs [",
              (n + GROUP_ROWS - 1) / GROUP_ROWS, ", ", group_bytes, "] (rows grouped by 8)");
}

}  // namespace

namespace radixserve {

// y [M, N] = x [M, K] @ W^T (+ bias), W as N rows of GGUF blocks grouped by 8; y in x's dtype.
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& w, int64_t fmt, int64_t isa, int64_t out_features,
                        const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2, "x must be [rows, in_features]");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "x must be fp32 or bf16");
  TORCH_CHECK(isa == AVX2 || isa == AVX512, "isa must be 0 (avx2) or 1 (avx512)");
  const int64_t k = x.size(1), m = x.size(0), n = out_features, nblocks = k / QK;
  check_blocks(w, fmt, k, n);
  at::Tensor bias_f;
  if (bias.has_value()) {
    bias_f = bias->to(at::kFloat).contiguous();
    TORCH_CHECK(bias_f.numel() == n, "bias must have out_features values");
  }
  const float* bias_ptr = bias.has_value() ? bias_f.data_ptr<float>() : nullptr;
  at::Tensor y = at::empty({m, n}, x.options());
  if (m == 0) return y;
  const std::vector<ActBlock> act = quantize_activations(x);
  const uint8_t* wp = w.data_ptr<uint8_t>();
  if (x.scalar_type() == at::kFloat) {
    gemm_format(static_cast<int>(fmt), static_cast<int>(isa), wp, n, act.data(), nblocks, m, bias_ptr,
                y.data_ptr<float>());
  } else {
    gemm_format(static_cast<int>(fmt), static_cast<int>(isa), wp, n, act.data(), nblocks, m, bias_ptr,
                y.data_ptr<c10::BFloat16>());
  }
  return y;
}

// The activation blocks quant_linear computes for x (fp32 or bf16 [M, K]): (q int8 [M, K], d [M, K/32],
// s [M, K/32]), for the tests that hold them to the torch reference bit for bit.
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_q8_rows(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) % QK == 0, "x must be [rows, a multiple of 32]");
  const int64_t m = x.size(0), nblocks = x.size(1) / QK;
  const std::vector<ActBlock> act = quantize_activations(x);
  at::Tensor q = at::empty({m, nblocks * QK}, at::kChar);
  at::Tensor d = at::empty({m, nblocks}, at::kFloat);
  at::Tensor s = at::empty({m, nblocks}, at::kFloat);
  for (int64_t i = 0; i < m * nblocks; ++i) {
    std::memcpy(q.data_ptr<int8_t>() + i * QK, act[i].q, QK);
    d.data_ptr<float>()[i] = act[i].d;
    s.data_ptr<float>()[i] = act[i].s;
  }
  return {q, d, s};
}

}  // namespace radixserve
