// Linears on GGUF's block-quantized weights (q8_0, q4_0, q4_1), computed from the blocks as they
// are stored: y[M, N] = x[M, K] @ W[N, K]^T (+ bias), W held as N rows of K/32 blocks.
//
// How activations meet the weights (ggml's way, chosen by measurement, docs/benchmarks.md): each
// row of x is quantized once per call to 8-bit blocks of 32 (scale d = max|x| / 127, q =
// round-to-nearest-even(x / d), and s = d * sum(q)), and each weight block meets each activation
// block through an exact integer dot product (u8 x s8 multiply-adds: _mm256_maddubs_epi16 then
// _mm256_madd_epi16), scaled once per block pair in fp32:
//   q8_0 (w = d_w * q):        d_w * d_a * sum(q * a)
//   q4_0 (w = d_w * (u - 8)):  d_w * d_a * sum(u * a) - 8 * d_w * s_a
//   q4_1 (w = d_w * u + m_w):  d_w * d_a * sum(u * a) + m_w * s_a
// The integer sums never saturate: |a| <= 127 and u <= 15 (q4) or |q| <= 127 (q8_0: ggml's and
// our quantizers both clamp to +-127), so a pair of products is at most 2 * 127 * 127 < 2^15.
//
// One build serves both CPUs: the AVX2 and the AVX-512 variants are compiled with function
// target attributes, and the caller (kernels/quant_linear.py, from runtime/execution/device.py's
// reading of the CPU) picks one per call. Threads split the output rows (torch's thread pool).
// Each thread walks tiles of NR weight rows x MR activation rows; a weight tile stays in L1
// while every activation tile passes it.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int QK = 32;  // values per block, in every format here
enum Format : int { Q8_0 = 0, Q4_0 = 1, Q4_1 = 2 };
enum Isa : int { AVX2 = 0, AVX512 = 1 };

int block_bytes(int fmt) {
  switch (fmt) {
    case Q8_0: return 2 + QK;      // fp16 d, int8 q[32]
    case Q4_0: return 2 + QK / 2;  // fp16 d, 32 nibbles: low nibbles are values 0-15, high 16-31
    case Q4_1: return 4 + QK / 2;  // fp16 d, fp16 m, 32 nibbles
    default: TORCH_CHECK(false, "unknown block format ", fmt);
  }
}

// One activation block: its scale, d * sum(q), and its 32 int8 values.
struct ActBlock {
  float d;
  float s;
  int8_t q[QK];
};

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Plain scalar code on purpose: the scale and the rounding must equal the torch reference's
// (kernels/gguf_blocks.py quantize_activations) bit for bit, whatever the compiler vectorizes.
// The build's -ffast-math would turn `amax / 127` into a multiply by 1/127 (not the same
// float), hence the attribute.
__attribute__((optimize("no-fast-math"))) void quantize_row(const float* x, int64_t k, ActBlock* out) {
  for (int64_t b = 0; b < k / QK; ++b) {
    const float* xb = x + b * QK;
    float amax = 0.0f;
    for (int i = 0; i < QK; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int i = 0; i < QK; ++i) {
      const int q = static_cast<int>(std::nearbyint(xb[i] * id));
      out[b].q[i] = static_cast<int8_t>(q);
      sum += q;
    }
    out[b].d = d;
    out[b].s = d * static_cast<float>(sum);
  }
}

// Per weight block: its scale, and its correction weight against s_a (-8 d_w, m_w, or 0).
struct WeightScales {
  float d;
  float c;
};

// ------------------------------------------------------------------------------------ AVX2
#define RS_AVX2 __attribute__((target("avx2,fma,f16c")))

// The scales through F16C's conversion (one instruction; the portable one is a dozen).
template <int F>
RS_AVX2 inline WeightScales weight_scales(const uint8_t* blk) {
  const float d = _cvtsh_ss(load_u16(blk));
  if constexpr (F == Q4_0) return {d, -8.0f * d};
  if constexpr (F == Q4_1) return {d, _cvtsh_ss(load_u16(blk + 2))};
  return {d, 0.0f};
}

// The block's 32 values as bytes: unsigned nibbles for q4 formats, signed int8 for q8_0.
template <int F>
RS_AVX2 inline __m256i load_weight_256(const uint8_t* blk) {
  if constexpr (F == Q8_0) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (F == Q4_1 ? 4 : 2)));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// Eight int32 partial sums of w . a over one block.
template <int F>
RS_AVX2 inline __m256i dot_256(__m256i w, __m256i a) {
  __m256i pairs;
  if constexpr (F == Q8_0) {
    pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
  } else {
    pairs = _mm256_maddubs_epi16(w, a);
  }
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

RS_AVX2 inline float hsum_256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// out[r][m] = the sum over blocks [b_begin, b_end) of row r of W times row m of the activations
// (row m's blocks start at a + m * nblocks), for an NR x MR tile.
template <int F, int NR, int MR>
RS_AVX2 void tile_avx2(const uint8_t* w, int64_t row_bytes, const ActBlock* a, int64_t nblocks, int64_t b_begin,
                       int64_t b_end, float out[NR][MR]) {
  constexpr int BB = F == Q8_0 ? 34 : F == Q4_0 ? 18 : 20;
  __m256 acc[NR][MR];
  float corr[NR][MR];
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      acc[r][m] = _mm256_setzero_ps();
      corr[r][m] = 0.0f;
    }
  for (int64_t b = b_begin; b < b_end; ++b) {
    __m256i wv[NR];
    WeightScales ws[NR];
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      const uint8_t* blk = w + r * row_bytes + b * BB;
      // The next tile's rows (they follow these): a decode step streams every weight from
      // memory once, and the hardware prefetcher alone left the kernel at half the bandwidth.
      _mm_prefetch(reinterpret_cast<const char*>(blk + NR * row_bytes), _MM_HINT_T0);
      wv[r] = load_weight_256<F>(blk);
      ws[r] = weight_scales<F>(blk);
    }
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const ActBlock& ab = a[m * nblocks + b];
      const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab.q));
#pragma GCC unroll 8
      for (int r = 0; r < NR; ++r) {
        const __m256 dot = _mm256_cvtepi32_ps(dot_256<F>(wv[r], av));
        acc[r][m] = _mm256_fmadd_ps(dot, _mm256_set1_ps(ws[r].d * ab.d), acc[r][m]);
        if constexpr (F != Q8_0) corr[r][m] += ws[r].c * ab.s;
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) out[r][m] = hsum_256(acc[r][m]) + corr[r][m];
}

// ---------------------------------------------------------------------------------- AVX-512
// Two blocks per 512-bit register: lanes 0-7 hold block b's partial sums, lanes 8-15 block b+1's.
#define RS_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

template <int F>
RS_AVX512 inline __m512i load_weight_512(const uint8_t* blk0, const uint8_t* blk1) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(load_weight_256<F>(blk0)), load_weight_256<F>(blk1), 1);
}

template <int F>
RS_AVX512 inline __m512i dot_512(__m512i w, __m512i a) {
  __m512i pairs;
  if constexpr (F == Q8_0) {
    // No 512-bit sign instruction: |w| and a with w's sign through masks.
    const __mmask64 neg = _mm512_movepi8_mask(w);
    const __m512i zero = _mm512_setzero_si512();
    const __m512i abs_w = _mm512_abs_epi8(w);
    const __m512i signed_a = _mm512_mask_sub_epi8(a, neg, zero, a);
    pairs = _mm512_maddubs_epi16(abs_w, signed_a);
  } else {
    pairs = _mm512_maddubs_epi16(w, a);
  }
  return _mm512_madd_epi16(pairs, _mm512_set1_epi16(1));
}

template <int F, int NR, int MR>
RS_AVX512 void tile_avx512(const uint8_t* w, int64_t row_bytes, const ActBlock* a, int64_t nblocks,
                           float out[NR][MR]) {
  constexpr int BB = F == Q8_0 ? 34 : F == Q4_0 ? 18 : 20;
  __m512 acc[NR][MR];
  float corr[NR][MR];
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      acc[r][m] = _mm512_setzero_ps();
      corr[r][m] = 0.0f;
    }
  int64_t b = 0;
  for (; b + 1 < nblocks; b += 2) {
    __m512i wv[NR];
    WeightScales ws0[NR], ws1[NR];
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      const uint8_t* blk = w + r * row_bytes + b * BB;
      _mm_prefetch(reinterpret_cast<const char*>(blk + NR * row_bytes), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(blk + NR * row_bytes + BB), _MM_HINT_T0);
      wv[r] = load_weight_512<F>(blk, blk + BB);
      ws0[r] = weight_scales<F>(blk);
      ws1[r] = weight_scales<F>(blk + BB);
    }
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const ActBlock& a0 = a[m * nblocks + b];
      const ActBlock& a1 = a[m * nblocks + b + 1];
      const __m512i av = _mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a0.q))),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a1.q)), 1);
#pragma GCC unroll 8
      for (int r = 0; r < NR; ++r) {
        const __m512 dot = _mm512_cvtepi32_ps(dot_512<F>(wv[r], av));
        const __m512 scale = _mm512_insertf32x8(_mm512_set1_ps(ws0[r].d * a0.d), _mm256_set1_ps(ws1[r].d * a1.d), 1);
        acc[r][m] = _mm512_fmadd_ps(dot, scale, acc[r][m]);
        if constexpr (F != Q8_0) corr[r][m] += ws0[r].c * a0.s + ws1[r].c * a1.s;
      }
    }
  }
  float tail[NR][MR] = {};
  if (b < nblocks) tile_avx2<F, NR, MR>(w, row_bytes, a, nblocks, b, nblocks, tail);  // an odd block count
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) out[r][m] = _mm512_reduce_add_ps(acc[r][m]) + corr[r][m] + tail[r][m];
}

// ------------------------------------------------------------------------------- the driver
// Weight rows per tile: four where one activation row meets them (decode: more independent
// streams), two in AVX2's tiles of several rows (16 registers: 8 accumulators, 2 weights, the
// activation and temporaries), four with AVX-512's 32 registers.
template <int ISA, int MR>
constexpr int tile_rows() {
  return MR == 1 || ISA == AVX512 ? 4 : 2;
}

template <int F, int ISA, int NR, int MR>
void run_tile(const uint8_t* w, int64_t row_bytes, const ActBlock* a, int64_t nblocks, float out[NR][MR]) {
  if constexpr (ISA == AVX512) {
    tile_avx512<F, NR, MR>(w, row_bytes, a, nblocks, out);
  } else {
    tile_avx2<F, NR, MR>(w, row_bytes, a, nblocks, 0, nblocks, out);
  }
}

template <typename T>
inline void store_out(T* dst, float v) { *dst = static_cast<T>(v); }

// Rows [n0, n0 + NR) of W against activation rows [m0, m0 + MR), into y (row stride n_total).
template <int F, int ISA, int NR, int MR, typename T>
void tile_into(const uint8_t* w, int64_t row_bytes, const ActBlock* act, int64_t nblocks, int64_t n0, int64_t m0,
               int64_t n_total, const float* bias, T* y) {
  float out[NR][MR];
  run_tile<F, ISA, NR, MR>(w + n0 * row_bytes, row_bytes, act + m0 * nblocks, nblocks, out);
  for (int r = 0; r < NR; ++r) {
    const float add = bias != nullptr ? bias[n0 + r] : 0.0f;
    for (int m = 0; m < MR; ++m) store_out(y + (m0 + m) * n_total + n0 + r, out[r][m] + add);
  }
}

// Every activation row against the weight rows [n_begin, n_end): full tiles of NR rows, then
// single rows; activation rows four at a time, then the remainder.
template <int F, int ISA, int MR, typename T>
void rows_range(const uint8_t* w, int64_t row_bytes, const ActBlock* act, int64_t nblocks, int64_t m0, int64_t n_begin,
                int64_t n_end, int64_t n_total, const float* bias, T* y) {
  constexpr int NR = tile_rows<ISA, MR>();
  int64_t n = n_begin;
  for (; n + NR <= n_end; n += NR) tile_into<F, ISA, NR, MR>(w, row_bytes, act, nblocks, n, m0, n_total, bias, y);
  for (; n < n_end; ++n) tile_into<F, ISA, 1, MR>(w, row_bytes, act, nblocks, n, m0, n_total, bias, y);
}

template <int F, int ISA, typename T>
void gemm(const uint8_t* w, int64_t row_bytes, int64_t n_total, const ActBlock* act, int64_t nblocks, int64_t m_total,
          const float* bias, T* y) {
  constexpr int NR = 4;  // the unit threads split by (a multiple of every tile_rows)
  const int64_t units = (n_total + NR - 1) / NR;
  at::parallel_for(0, units, 8, [&](int64_t begin, int64_t end) {
    const int64_t n_begin = begin * NR;
    const int64_t n_end = std::min(n_total, end * NR);
    // Weight tiles outer, activation tiles inner, inside rows_range: a chunk of 8 units is at most
    // 32 rows; for long activations walk it in slices so a slice of W stays in cache.
    for (int64_t nb = n_begin; nb < n_end; nb += 16) {
      const int64_t ne = std::min(n_end, nb + 16);
      int64_t m = 0;
      for (; m + 4 <= m_total; m += 4) rows_range<F, ISA, 4>(w, row_bytes, act, nblocks, m, nb, ne, n_total, bias, y);
      switch (m_total - m) {
        case 3: rows_range<F, ISA, 3>(w, row_bytes, act, nblocks, m, nb, ne, n_total, bias, y); break;
        case 2: rows_range<F, ISA, 2>(w, row_bytes, act, nblocks, m, nb, ne, n_total, bias, y); break;
        case 1: rows_range<F, ISA, 1>(w, row_bytes, act, nblocks, m, nb, ne, n_total, bias, y); break;
        default: break;
      }
    }
  });
}

template <int F, typename T>
void gemm_isa(int isa, const uint8_t* w, int64_t row_bytes, int64_t n, const ActBlock* act, int64_t nblocks, int64_t m,
              const float* bias, T* y) {
  if (isa == AVX512) {
    gemm<F, AVX512>(w, row_bytes, n, act, nblocks, m, bias, y);
  } else {
    gemm<F, AVX2>(w, row_bytes, n, act, nblocks, m, bias, y);
  }
}

template <typename T>
void gemm_format(int fmt, int isa, const uint8_t* w, int64_t row_bytes, int64_t n, const ActBlock* act,
                 int64_t nblocks, int64_t m, const float* bias, T* y) {
  switch (fmt) {
    case Q8_0: gemm_isa<Q8_0>(isa, w, row_bytes, n, act, nblocks, m, bias, y); break;
    case Q4_0: gemm_isa<Q4_0>(isa, w, row_bytes, n, act, nblocks, m, bias, y); break;
    case Q4_1: gemm_isa<Q4_1>(isa, w, row_bytes, n, act, nblocks, m, bias, y); break;
    default: TORCH_CHECK(false, "unknown block format ", fmt);
  }
}

std::vector<ActBlock> quantize_activations(const torch::Tensor& x) {
  const torch::Tensor xf = x.to(torch::kFloat).contiguous();
  const int64_t m = xf.size(0), k = xf.size(1), nblocks = k / QK;
  std::vector<ActBlock> act(static_cast<size_t>(m * nblocks));
  const float* src = xf.data_ptr<float>();
  at::parallel_for(0, m, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) quantize_row(src + r * k, k, act.data() + r * nblocks);
  });
  return act;
}

void check_blocks(const torch::Tensor& w, int64_t fmt, int64_t k) {
  TORCH_CHECK(fmt >= Q8_0 && fmt <= Q4_1, "unknown block format ", fmt);
  TORCH_CHECK(k > 0 && k % QK == 0, "in_features must be a positive multiple of ", QK, ", got ", k);
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == torch::kUInt8 && w.is_contiguous(),
              "blocks must be a contiguous uint8 [out, bytes per row] tensor");
  TORCH_CHECK(w.size(1) == k / QK * block_bytes(static_cast<int>(fmt)), "blocks have ", w.size(1),
              " bytes per row; format ", fmt, " with in_features ", k, " needs ", k / QK * block_bytes(static_cast<int>(fmt)));
}

// y [M, N] = x [M, K] @ W^T (+ bias), W as N rows of GGUF blocks; y in x's dtype (fp32 or bf16).
torch::Tensor quant_linear(const torch::Tensor& x, const torch::Tensor& w, int64_t fmt, int64_t isa,
                           const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2, "x must be [rows, in_features]");
  TORCH_CHECK(x.scalar_type() == torch::kFloat || x.scalar_type() == torch::kBFloat16, "x must be fp32 or bf16");
  TORCH_CHECK(isa == AVX2 || isa == AVX512, "isa must be 0 (avx2) or 1 (avx512)");
  const int64_t k = x.size(1);
  check_blocks(w, fmt, k);
  const int64_t m = x.size(0), n = w.size(0), nblocks = k / QK;
  torch::Tensor bias_f;
  if (bias.has_value()) {
    bias_f = bias->to(torch::kFloat).contiguous();
    TORCH_CHECK(bias_f.numel() == n, "bias must have out_features values");
  }
  const float* bias_ptr = bias.has_value() ? bias_f.data_ptr<float>() : nullptr;
  torch::Tensor y = torch::empty({m, n}, x.options());
  if (m == 0) return y;
  const std::vector<ActBlock> act = quantize_activations(x);
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const int64_t row_bytes = w.size(1);
  if (x.scalar_type() == torch::kFloat) {
    gemm_format(static_cast<int>(fmt), static_cast<int>(isa), wp, row_bytes, n, act.data(), nblocks, m, bias_ptr,
                y.data_ptr<float>());
  } else {
    gemm_format(static_cast<int>(fmt), static_cast<int>(isa), wp, row_bytes, n, act.data(), nblocks, m, bias_ptr,
                y.data_ptr<c10::BFloat16>());
  }
  return y;
}

// The activation blocks quant_linear computes for x (fp32 [M, K]): (q int8 [M, K], d [M, K/32],
// s [M, K/32]), for the tests that hold them to the torch reference bit for bit.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> quantize_q8_rows(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) % QK == 0, "x must be [rows, a multiple of 32]");
  const int64_t m = x.size(0), nblocks = x.size(1) / QK;
  const std::vector<ActBlock> act = quantize_activations(x);
  torch::Tensor q = torch::empty({m, nblocks * QK}, torch::kInt8);
  torch::Tensor d = torch::empty({m, nblocks}, torch::kFloat);
  torch::Tensor s = torch::empty({m, nblocks}, torch::kFloat);
  for (int64_t i = 0; i < m * nblocks; ++i) {
    std::memcpy(q.data_ptr<int8_t>() + i * QK, act[i].q, QK);
    d.data_ptr<float>()[i] = act[i].d;
    s.data_ptr<float>()[i] = act[i].s;
  }
  return {q, d, s};
}

// Row r of W decoded into out (fp32, or bf16 rounded to nearest even). Plain loops: they are
// memory-bound, and -O3 vectorizes them for the build's CPU.
template <int F, typename T>
void dequantize_row(const uint8_t* row, int64_t nblocks, T* out) {
  constexpr int BB = F == Q8_0 ? 34 : F == Q4_0 ? 18 : 20;
  for (int64_t b = 0; b < nblocks; ++b) {
    const uint8_t* blk = row + b * BB;
    const float d = c10::detail::fp16_ieee_to_fp32_value(load_u16(blk));
    const float m = F == Q4_1 ? c10::detail::fp16_ieee_to_fp32_value(load_u16(blk + 2)) : 0.0f;
    float v[QK];
    if constexpr (F == Q8_0) {
      for (int i = 0; i < QK; ++i) v[i] = d * static_cast<float>(static_cast<int8_t>(blk[2 + i]));
    } else {
      const uint8_t* qs = blk + (F == Q4_1 ? 4 : 2);
      const float offset = F == Q4_0 ? 8.0f : 0.0f;
      for (int i = 0; i < QK / 2; ++i) {
        v[i] = d * (static_cast<float>(qs[i] & 0x0F) - offset) + m;
        v[i + QK / 2] = d * (static_cast<float>(qs[i] >> 4) - offset) + m;
      }
    }
    for (int i = 0; i < QK; ++i) out[b * QK + i] = static_cast<T>(v[i]);
  }
}

template <typename T>
void dequantize_rows(int fmt, const uint8_t* w, int64_t row_bytes, int64_t n, int64_t nblocks, T* out) {
  at::parallel_for(0, n, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const uint8_t* row = w + r * row_bytes;
      T* dst = out + r * nblocks * QK;
      switch (fmt) {
        case Q8_0: dequantize_row<Q8_0>(row, nblocks, dst); break;
        case Q4_0: dequantize_row<Q4_0>(row, nblocks, dst); break;
        default: dequantize_row<Q4_1>(row, nblocks, dst); break;
      }
    }
  });
}

// W [N, K] decoded from its blocks, in `dtype` (fp32 or bf16): the weight of the batched calls,
// which hand it to the BLAS (kernels/quant_linear.py says when).
torch::Tensor dequantize_blocks(const torch::Tensor& w, int64_t fmt, int64_t k, torch::ScalarType dtype) {
  check_blocks(w, fmt, k);
  TORCH_CHECK(dtype == torch::kFloat || dtype == torch::kBFloat16, "dtype must be fp32 or bf16");
  torch::Tensor out = torch::empty({w.size(0), k}, torch::TensorOptions().dtype(dtype));
  if (dtype == torch::kFloat) {
    dequantize_rows(static_cast<int>(fmt), w.data_ptr<uint8_t>(), w.size(1), w.size(0), k / QK, out.data_ptr<float>());
  } else {
    dequantize_rows(static_cast<int>(fmt), w.data_ptr<uint8_t>(), w.size(1), w.size(0), k / QK,
                    out.data_ptr<c10::BFloat16>());
  }
  return out;
}

}  // namespace

void register_quant_gemm(pybind11::module& m) {
  m.def("quant_linear", &quant_linear,
        "x [M, K] @ W^T (+ bias) with W as rows of GGUF blocks (fmt 0 q8_0, 1 q4_0, 2 q4_1; isa 0 avx2, 1 avx512)",
        pybind11::arg("x"), pybind11::arg("blocks"), pybind11::arg("fmt"), pybind11::arg("isa"),
        pybind11::arg("bias") = pybind11::none());
  m.def("quantize_q8_rows", &quantize_q8_rows, "the activation blocks quant_linear uses: (q, d, s)");
  m.def("dequantize_blocks", &dequantize_blocks, "W [N, K] decoded from its GGUF blocks, fp32 or bf16",
        pybind11::arg("blocks"), pybind11::arg("fmt"), pybind11::arg("in_features"), pybind11::arg("dtype"));
}
