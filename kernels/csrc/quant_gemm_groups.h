// The integer kernel's inner loops, compiled once per instruction set: quant_gemm_avx2.cpp and
// quant_gemm_avx512.cpp each define RS_VARIANT (the namespace) and RS_VNNI (0 or 1) and include
// this file, each in its own translation unit with only its own ISA's flags (kernels/cpu_ext.py),
// so the AVX2 variant cannot hold an AVX-512 instruction. What differs is the integer dot product
// (AVX2 multiplies u8 x s8 pairs into int16 and adds pairs into int32, _mm256_maddubs_epi16 and
// _mm256_madd_epi16; VNNI does both in one _mm256_dpbusd_epi32), and with it how q8_0's signed
// values become unsigned and how many accumulators a row keeps.
//
// NOTE: everything but the entry point is in an anonymous namespace and nothing here calls a
// function of another header (std::min, c10's bf16) that the compiler might emit out of line: such
// a copy, compiled with this variant's ISA, could be the one the linker keeps for the module.
//
// The weight layout (kernels/gguf_blocks.py interleave_rows): rows in groups of 8, and per group
// and block the 8 rows' fp16 scales (and q4_1's 8 minimums) first, then the values in chunks of
// 4 bytes per row: chunk c holds bytes 4c..4c+3 of row 0, then of row 1, ... of row 7. So one
// 32-byte load holds 4 values of each of the 8 rows, lane r of a vector is row r, and a dot
// product against the activation's matching 4 values broadcast to every lane adds into row r's
// lane directly: no horizontal reduction anywhere (ggml's repacked 8-row layouts work this way).
// A q4 byte holds two values (low nibble j, high nibble j + 16), so a q4 chunk is two chunks of
// values: 4c..4c+3 and 16+4c..16+4c+3.

#include "quant_gemm_variants.h"

#include <immintrin.h>

#include <cstring>

namespace radixserve::quant::RS_VARIANT {
namespace {

inline int64_t lesser(int64_t a, int64_t b) { return a < b ? a : b; }

inline void store_out(float* dst, float v) { *dst = v; }
// bf16 by round-to-nearest-even (NaN to the quiet NaN 0x7FC0), as c10::BFloat16 rounds.
inline void store_out(uint16_t* dst, float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  *dst = (u & 0x7FFFFFFFu) > 0x7F800000u ? uint16_t{0x7FC0} : static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// Integer partial sums of one group-block against one activation block, lane r for row r.
// VNNI accumulates int32 directly. AVX2's maddubs gives int16 pair sums: q4 ones (at most
// 2 * 15 * 127 = 3810 each) add eight deep in int16 without saturating (30480 < 2^15) before one
// madd widens them, and q5 ones (2 * 31 * 127 = 7874) four deep (quant_gemm_kgroups.h keeps a
// sub-block's halves apart); q8_0's (up to 2 * 128 * 127) and Q6_K's (2 * 63 * 127, two deep at
// most) widen every time.
template <int F>
constexpr bool widens_each_dot() { return F == Q8_0 || F == Q6_K; }

template <int F>
inline __m256i dot_add(__m256i acc, __m256i u, __m256i s) {
#if RS_VNNI
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  if constexpr (widens_each_dot<F>())
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
  return _mm256_add_epi16(acc, _mm256_maddubs_epi16(u, s));
#endif
}

template <int F>
inline __m256i dot_finish(__m256i acc) {
#if RS_VNNI
  return acc;
#else
  if constexpr (widens_each_dot<F>()) return acc;
  return _mm256_madd_epi16(acc, _mm256_set1_epi16(1));
#endif
}

// The 4 activation values at q, in every lane.
inline __m256i broadcast4(const int8_t* q) {
  int32_t v;
  std::memcpy(&v, q, 4);
  return _mm256_set1_epi32(v);
}

// Independent integer accumulators per activation row. vpdpbusd adds into its destination, so
// one accumulator chains every dot of a block through the instruction's latency; at one
// activation row that chain, not memory, bounded the kernel (measured: 4 chains made a one-row
// call 1.5-2x faster). AVX2's chain is a one-cycle add, so one is enough there.
template <int MR>
constexpr int chains() { return RS_VNNI ? (MR == 1 ? 4 : 2) : 1; }

// out[m][r] = row r of the group (at g) times activation row m, for MR activation rows.
template <int F, int MR>
void group_rows(const uint8_t* g, int64_t nblocks, const ActBlock* a, float out[MR][GROUP_ROWS]) {
  constexpr int GB = GROUP_ROWS * Layout<F>::block_bytes;
  constexpr int CHUNKS = Layout<F>::value_bytes / 4;
  constexpr int A = chains<MR>();
  __m256 acc[MR];
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nblocks; ++b) {
    const uint8_t* p = g + b * GB;
    // The next group's same block, a group ahead: decode streams every weight once, and the
    // hardware prefetcher alone left the kernel at half the memory's bandwidth.
#pragma GCC unroll 8
    for (int line = 0; line < GB; line += 64) _mm_prefetch(reinterpret_cast<const char*>(p + nblocks * GB + line), _MM_HINT_T0);
    const uint8_t* qs = p + Layout<F>::group_header;
    __m256i sums[MR][A];
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
      for (int i = 0; i < A; ++i) sums[m][i] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int c = 0; c < CHUNKS; ++c) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
      if constexpr (F == Q8_0 && RS_VNNI) {
        const __m256i shifted = _mm256_xor_si256(raw, _mm256_set1_epi8(static_cast<char>(0x80)));  // q + 128, u8
#pragma GCC unroll 4
        for (int m = 0; m < MR; ++m)
          sums[m][c % A] = dot_add<F>(sums[m][c % A], shifted, broadcast4(a[m * nblocks + b].q + 4 * c));
      } else if constexpr (F == Q8_0) {
        const __m256i magnitude = _mm256_sign_epi8(raw, raw);  // |w| . a*sign(w) = w . a, u8 x s8
#pragma GCC unroll 4
        for (int m = 0; m < MR; ++m) {
          const __m256i av = broadcast4(a[m * nblocks + b].q + 4 * c);
          sums[m][c % A] = dot_add<F>(sums[m][c % A], magnitude, _mm256_sign_epi8(av, raw));
        }
      } else {
        const __m256i nibble = _mm256_set1_epi8(0x0F);
        const __m256i low = _mm256_and_si256(raw, nibble);
        const __m256i high = _mm256_and_si256(_mm256_srli_epi16(raw, 4), nibble);
#pragma GCC unroll 4
        for (int m = 0; m < MR; ++m) {
          const int8_t* aq = a[m * nblocks + b].q;
          sums[m][2 * c % A] = dot_add<F>(sums[m][2 * c % A], low, broadcast4(aq + 4 * c));
          sums[m][(2 * c + 1) % A] = dot_add<F>(sums[m][(2 * c + 1) % A], high, broadcast4(aq + QK / 2 + 4 * c));
        }
      }
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    // Each row's weight against s_a: -8 d (q4_0), m (q4_1), -128 d (q8_0 with VNNI, whose u8 x s8
    // product takes the values shifted to unsigned: a sign per activation row cost more).
    constexpr bool CORRECTED = F != Q8_0 || RS_VNNI;
    __m256 corr = _mm256_setzero_ps();
    if constexpr (F == Q4_0) corr = _mm256_mul_ps(d, _mm256_set1_ps(-8.0f));
    if constexpr (F == Q8_0) corr = _mm256_mul_ps(d, _mm256_set1_ps(-128.0f));
    if constexpr (F == Q4_1) corr = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * GROUP_ROWS)));
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) {
      const ActBlock& ab = a[m * nblocks + b];
      __m256i sum = sums[m][0];
#pragma GCC unroll 4
      for (int i = 1; i < A; ++i) sum = _mm256_add_epi32(sum, sums[m][i]);
      const __m256 dots = _mm256_cvtepi32_ps(dot_finish<F>(sum));
      acc[m] = _mm256_fmadd_ps(dots, _mm256_mul_ps(d, _mm256_set1_ps(ab.d)), acc[m]);
      if constexpr (CORRECTED) acc[m] = _mm256_fmadd_ps(corr, _mm256_set1_ps(ab.s), acc[m]);
    }
  }
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m) _mm256_storeu_ps(out[m], acc[m]);
}

#if RS_VNNI
// Two groups at once in 512-bit vectors, lanes 0-7 the first group's rows and 8-15 the second's:
// each broadcast activation chunk then feeds 16 rows, which halves the broadcasts, the scale
// conversions and the per-block epilogue per product against group_rows (the instruction count,
// not the VNNI units, bounded a call of many rows). Used for the tiles of 4 activation rows.
inline __m512i load_pair(const uint8_t* a, const uint8_t* b) {
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)), 1);
}
inline __m512 load_pair_ph(const uint8_t* a, const uint8_t* b) {
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a));
  return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1));
}
inline __m512i broadcast4_512(const int8_t* q) {
  int32_t v;
  std::memcpy(&v, q, 4);
  return _mm512_set1_epi32(v);
}

template <int F, int MR>
void group_pair_rows(const uint8_t* g0, const uint8_t* g1, int64_t nblocks, const ActBlock* a,
                     float out[MR][2 * GROUP_ROWS]) {
  constexpr int GB = GROUP_ROWS * Layout<F>::block_bytes;
  constexpr int CHUNKS = Layout<F>::value_bytes / 4;
  __m512 acc[MR];
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nblocks; ++b) {
    const uint8_t* p0 = g0 + b * GB;
    const uint8_t* p1 = g1 + b * GB;
    const uint8_t* q0 = p0 + Layout<F>::group_header;
    const uint8_t* q1 = p1 + Layout<F>::group_header;
    __m512i sums[MR][2];
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) sums[m][0] = sums[m][1] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int c = 0; c < CHUNKS; ++c) {
      const __m512i raw = load_pair(q0 + 32 * c, q1 + 32 * c);
      if constexpr (F == Q8_0) {
        const __m512i shifted = _mm512_xor_si512(raw, _mm512_set1_epi8(static_cast<char>(0x80)));  // q + 128
#pragma GCC unroll 4
        for (int m = 0; m < MR; ++m)
          sums[m][c % 2] = _mm512_dpbusd_epi32(sums[m][c % 2], shifted, broadcast4_512(a[m * nblocks + b].q + 4 * c));
      } else {
        const __m512i nibble = _mm512_set1_epi8(0x0F);
        const __m512i low = _mm512_and_si512(raw, nibble);
        const __m512i high = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nibble);
#pragma GCC unroll 4
        for (int m = 0; m < MR; ++m) {
          const int8_t* aq = a[m * nblocks + b].q;
          sums[m][0] = _mm512_dpbusd_epi32(sums[m][0], low, broadcast4_512(aq + 4 * c));
          sums[m][1] = _mm512_dpbusd_epi32(sums[m][1], high, broadcast4_512(aq + QK / 2 + 4 * c));
        }
      }
    }
    const __m512 d = load_pair_ph(p0, p1);
    __m512 corr;  // as in group_rows: every format here is corrected under VNNI
    if constexpr (F == Q4_0) corr = _mm512_mul_ps(d, _mm512_set1_ps(-8.0f));
    if constexpr (F == Q8_0) corr = _mm512_mul_ps(d, _mm512_set1_ps(-128.0f));
    if constexpr (F == Q4_1) corr = load_pair_ph(p0 + 2 * GROUP_ROWS, p1 + 2 * GROUP_ROWS);
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) {
      const ActBlock& ab = a[m * nblocks + b];
      const __m512 dots = _mm512_cvtepi32_ps(_mm512_add_epi32(sums[m][0], sums[m][1]));
      acc[m] = _mm512_fmadd_ps(dots, _mm512_mul_ps(d, _mm512_set1_ps(ab.d)), acc[m]);
      acc[m] = _mm512_fmadd_ps(corr, _mm512_set1_ps(ab.s), acc[m]);
    }
  }
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m) _mm512_storeu_ps(out[m], acc[m]);
}
#endif

#include "quant_gemm_kgroups.h"  // kgroup_rows (and kgroup_pair_rows): q5_0, q5_1, the K-quants

// Groups [g_begin, g_end) against every activation row, stored into y [M, n_total] (+ bias).
template <int F, int MR, typename T>
void groups_into(const uint8_t* w, int64_t nblocks, const ActBlock* act, int64_t m0, int64_t g_begin, int64_t g_end,
                 int64_t n_total, const float* bias, T* y) {
  const int64_t stride = nblocks * QK / super_values<F>() * super_bytes<F>();  // one group's bytes
  int64_t g = g_begin;
#if RS_VNNI
  if constexpr (MR == 4) {
    float pair[MR][2 * GROUP_ROWS];
    for (; g + 2 <= g_end; g += 2) {
      if constexpr (F <= Q4_1) {
        group_pair_rows<F, MR>(w + g * stride, w + (g + 1) * stride, nblocks, act + m0 * nblocks, pair);
      } else {
        kgroup_pair_rows<F, MR>(w + g * stride, w + (g + 1) * stride, nblocks, act + m0 * nblocks, pair);
      }
      const int64_t n0 = g * GROUP_ROWS;
      const int rows = static_cast<int>(lesser(2 * GROUP_ROWS, n_total - n0));
      for (int m = 0; m < MR; ++m)
        for (int r = 0; r < rows; ++r)
          store_out(y + (m0 + m) * n_total + n0 + r, pair[m][r] + (bias != nullptr ? bias[n0 + r] : 0.0f));
    }
  }
#endif
  float out[MR][GROUP_ROWS];
  for (; g < g_end; ++g) {
    if constexpr (F <= Q4_1) {
      group_rows<F, MR>(w + g * stride, nblocks, act + m0 * nblocks, out);
    } else {
      kgroup_rows<F, MR>(w + g * stride, nblocks, act + m0 * nblocks, out);
    }
    const int64_t n0 = g * GROUP_ROWS;
    const int rows = static_cast<int>(lesser(GROUP_ROWS, n_total - n0));
    for (int m = 0; m < MR; ++m)
      for (int r = 0; r < rows; ++r)
        store_out(y + (m0 + m) * n_total + n0 + r, out[m][r] + (bias != nullptr ? bias[n0 + r] : 0.0f));
  }
}

// Groups [g_begin, g_end) against every activation row: tiles of 4 rows, then 2, then 1.
template <int F, typename T>
void slice_rows(const GemmCall& c, int64_t g_begin, int64_t g_end) {
  const auto* w = c.w;
  T* y = static_cast<T*>(c.y);
  int64_t m = 0;
  for (; m + 4 <= c.m; m += 4) groups_into<F, 4>(w, c.nblocks, c.act, m, g_begin, g_end, c.n, c.bias, y);
  if (m + 2 <= c.m) {
    groups_into<F, 2>(w, c.nblocks, c.act, m, g_begin, g_end, c.n, c.bias, y);
    m += 2;
  }
  if (m < c.m) groups_into<F, 1>(w, c.nblocks, c.act, m, g_begin, g_end, c.n, c.bias, y);
}

template <int F>
void slice_format(const GemmCall& c, int64_t g_begin, int64_t g_end) {
  if (c.bf16_out) {
    slice_rows<F, uint16_t>(c, g_begin, g_end);
  } else {
    slice_rows<F, float>(c, g_begin, g_end);
  }
}

}  // namespace

void gemm_groups(const GemmCall& call, int64_t g_begin, int64_t g_end) {
  switch (call.fmt) {
    case Q8_0: slice_format<Q8_0>(call, g_begin, g_end); break;
    case Q4_0: slice_format<Q4_0>(call, g_begin, g_end); break;
    case Q4_1: slice_format<Q4_1>(call, g_begin, g_end); break;
    case Q5_0: slice_format<Q5_0>(call, g_begin, g_end); break;
    case Q5_1: slice_format<Q5_1>(call, g_begin, g_end); break;
    case Q4_K: slice_format<Q4_K>(call, g_begin, g_end); break;
    case Q5_K: slice_format<Q5_K>(call, g_begin, g_end); break;
    case Q6_K: slice_format<Q6_K>(call, g_begin, g_end); break;
    default: break;  // quant_gemm.cpp checked the format
  }
}

}  // namespace radixserve::quant::RS_VARIANT
