// Linears on GGUF's block-quantized weights (q8_0, q4_0, q4_1; q5_0, q5_1 and the K-quants Q4_K, Q5_K,
// Q6_K through quant_gemm_kgroups.h), computed from the blocks as they
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
// One build serves both CPUs: the inner loops (quant_gemm_groups.h) are compiled twice, for AVX2
// and for AVX-512 VNNI, each in its own translation unit (quant_gemm_avx2.cpp,
// quant_gemm_avx512.cpp) with only its own flags, and the caller (kernels/quant_linear.py, from
// runtime/execution/device.py's reading of the CPU) picks one per call. This file holds what both
// share: the activations' quantization, the checks and the threads, which split the row groups
// (torch's thread pool).

#include "kernels.h"
#include "quant_gemm_variants.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using namespace radixserve::quant;

template <int F>
int64_t group_bytes_of(int64_t k) { return k / super_values<F>() * super_bytes<F>(); }

// The bytes of one group of 8 rows of k values (k a multiple of values_per_super(fmt)).
int64_t group_bytes(int fmt, int64_t k) {
  switch (fmt) {
    case Q8_0: return group_bytes_of<Q8_0>(k);
    case Q4_0: return group_bytes_of<Q4_0>(k);
    case Q4_1: return group_bytes_of<Q4_1>(k);
    case Q5_0: return group_bytes_of<Q5_0>(k);
    case Q5_1: return group_bytes_of<Q5_1>(k);
    case Q4_K: return group_bytes_of<Q4_K>(k);
    case Q5_K: return group_bytes_of<Q5_K>(k);
    case Q6_K: return group_bytes_of<Q6_K>(k);
    default: TORCH_CHECK(false, "unknown block format ", fmt);
  }
}

int64_t values_per_super(int fmt) { return fmt == Q4_K || fmt == Q5_K || fmt == Q6_K ? QK_K : QK; }

// One row of activations to 8-bit blocks: per block of 32, d = max|x| / 127, q =
// round-half-even(x * (1 / d)), s = d * sum(q). Vectorized, and equal bit for bit to the torch
// reference (kernels/gguf_blocks.py quantize_activations): the two divisions are scalar IEEE
// ones (the build's -ffast-math would turn `amax / 127` into a multiply by 1/127, not the same
// float, hence the attribute), the product is one IEEE multiply per value and the rounding
// _mm256_round_ps's nearest-even. A NaN is skipped by the maximum as std::max(amax, x) skips it.
// bf16 rows are widened in registers (exact: a bf16 is the top half of its fp32), so they give the
// blocks of their fp32 copy without a pass that makes one.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) {
  const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}

inline int32_t hsum(__m256i v) {
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
  return _mm_cvtsi128_si32(s4);
}

template <typename T>
__attribute__((optimize("no-fast-math"))) inline void quantize_row(const T* x, int64_t k, ActBlock* out) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  // q0[0..3] q1[0..3] q2[0..3] q3[0..3] | q0[4..7] ... after the two packs, per 4-byte lane.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < k / QK; ++b) {
    const T* xb = x + b * QK;
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = load8(xb + 8 * i);
      amax = _mm256_max_ps(_mm256_andnot_ps(sign, v[i]), amax);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float d = _mm_cvtss_f32(m4) / 127.0f;
    const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    __m256i q[4];
    for (int i = 0; i < 4; ++i) {
      const __m256 r = _mm256_round_ps(_mm256_mul_ps(v[i], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      q[i] = _mm256_cvtps_epi32(r);
    }
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[b].q), _mm256_permutevar8x32_epi32(packed, order));
    out[b].half_sum[0] = hsum(_mm256_add_epi32(q[0], q[1]));  // values 0-15
    out[b].half_sum[1] = hsum(_mm256_add_epi32(q[2], q[3]));  // values 16-31
    out[b].d = d;
    out[b].s = d * static_cast<float>(out[b].half_sum[0] + out[b].half_sum[1]);
  }
}

// Threads split the groups; each walks them in slices of about 12 KB of weights (4 groups of a
// 576-wide row), which stay in L1 while the activation rows pass them four at a time. A slice
// holds at least 2 groups (15 KB of a 1536-wide one), the pair the AVX-512 variant's 4-row tiles
// take. (A fixed 4 groups was 31 KB for the 1536-wide down projection, L1's whole size; against
// it, the bound measured no different within this machine's noise.)
void gemm(const GemmCall& call, int isa) {
  const auto slice_fn = isa == AVX512 ? avx512::gemm_groups : avx2::gemm_groups;
  const int64_t groups = (call.n + GROUP_ROWS - 1) / GROUP_ROWS;
  const int64_t slice = std::clamp<int64_t>((12 << 10) / group_bytes(call.fmt, call.nblocks * QK), 2, 8);
  at::parallel_for(0, groups, slice, [&](int64_t begin, int64_t end) {
    for (int64_t gs = begin; gs < end; gs += slice) slice_fn(call, gs, std::min(end, gs + slice));
  });
}

// x fp32 or bf16 [M, K]: bf16 is read as it is (a prefill's [2048, 1536] activation took 3.7 ms
// to convert to fp32 first, 10% of the step).
std::vector<ActBlock> quantize_activations(const at::Tensor& x) {
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  const at::Tensor xc = bf16 ? x.contiguous() : x.to(at::kFloat).contiguous();
  const int64_t m = xc.size(0), k = xc.size(1), nblocks = k / QK;
  std::vector<ActBlock> act(static_cast<size_t>(m * nblocks));
  at::parallel_for(0, m, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      if (bf16) {
        quantize_row(xc.data_ptr<c10::BFloat16>() + r * k, k, act.data() + r * nblocks);
      } else {
        quantize_row(xc.data_ptr<float>() + r * k, k, act.data() + r * nblocks);
      }
    }
  });
  return act;
}

// Checks the grouped blocks of an [n, k] weight (kernels/gguf_blocks.py interleave_rows):
// [ceil(n / 8), k / 32 * 8 * block bytes] uint8.
void check_blocks(const at::Tensor& w, int64_t fmt, int64_t k, int64_t n) {
  TORCH_CHECK(fmt >= 0 && fmt < FORMATS, "unknown block format ", fmt);
  const int64_t per_super = values_per_super(static_cast<int>(fmt));
  TORCH_CHECK(k > 0 && k % per_super == 0, "in_features must be a positive multiple of ", per_super, ", got ", k);
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kByte && w.is_contiguous(),
              "blocks must be a contiguous uint8 [row groups, bytes per group] tensor");
  const int64_t bytes = group_bytes(static_cast<int>(fmt), k);
  TORCH_CHECK(w.size(0) == (n + GROUP_ROWS - 1) / GROUP_ROWS && w.size(1) == bytes, "blocks are [", w.size(0),
              ", ", w.size(1), "]; format ", fmt, " with ", n, " rows of ", k, " needs [",
              (n + GROUP_ROWS - 1) / GROUP_ROWS, ", ", bytes, "] (rows grouped by 8)");
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
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  const GemmCall call{static_cast<int>(fmt), w.data_ptr<uint8_t>(), n, act.data(), nblocks, m, bias_ptr,
                      bf16 ? static_cast<void*>(y.data_ptr<c10::BFloat16>()) : static_cast<void*>(y.data_ptr<float>()),
                      bf16};
  gemm(call, static_cast<int>(isa));
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
