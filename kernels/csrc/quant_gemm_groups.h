// The integer kernel's inner loops, compiled once per instruction set: quant_gemm.cpp includes
// this file twice, inside `namespace avx2` under `#pragma GCC target("avx2,...")` and inside
// `namespace avx512` under a target with AVX-512 VNNI, with RS_VNNI set to 0 or 1. What differs
// is the integer dot product (AVX2 multiplies u8 x s8 pairs into int16 and adds pairs into int32,
// _mm256_maddubs_epi16 and _mm256_madd_epi16; VNNI does both in one _mm256_dpbusd_epi32), and
// with it how q8_0's signed values become unsigned and how many accumulators a row keeps.
//
// The weight layout (kernels/gguf_blocks.py interleave_rows): rows in groups of 8, and per group
// and block the 8 rows' fp16 scales (and q4_1's 8 minimums) first, then the values in chunks of
// 4 bytes per row: chunk c holds bytes 4c..4c+3 of row 0, then of row 1, ... of row 7. So one
// 32-byte load holds 4 values of each of the 8 rows, lane r of a vector is row r, and a dot
// product against the activation's matching 4 values broadcast to every lane adds into row r's
// lane directly: no horizontal reduction anywhere (ggml's repacked 8-row layouts work this way).
// A q4 byte holds two values (low nibble j, high nibble j + 16), so a q4 chunk is two chunks of
// values: 4c..4c+3 and 16+4c..16+4c+3.

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
    __m256i sum = _mm256_setzero_si256();
    for (int i = 0; i < 4; ++i) {
      const __m256 r = _mm256_round_ps(_mm256_mul_ps(v[i], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      q[i] = _mm256_cvtps_epi32(r);
      sum = _mm256_add_epi32(sum, q[i]);
    }
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[b].q), _mm256_permutevar8x32_epi32(packed, order));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
    out[b].d = d;
    out[b].s = d * static_cast<float>(_mm_cvtsi128_si32(s4));
  }
}

// Integer partial sums of one group-block against one activation block, lane r for row r.
// VNNI accumulates int32 directly. AVX2's maddubs gives int16 pair sums: q4 ones (at most
// 2 * 15 * 127 = 3810 each) add eight deep in int16 without saturating (30480 < 2^15) before one
// madd widens them; q8_0's (up to 2 * 128 * 127) must widen every time.
template <int F>
inline __m256i dot_add(__m256i acc, __m256i u, __m256i s) {
#if RS_VNNI
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  if constexpr (F == Q8_0) return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
  return _mm256_add_epi16(acc, _mm256_maddubs_epi16(u, s));
#endif
}

template <int F>
inline __m256i dot_finish(__m256i acc) {
#if RS_VNNI
  return acc;
#else
  if constexpr (F == Q8_0) return acc;
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

// Groups [g_begin, g_end) against every activation row, stored into y [M, n_total] (+ bias).
template <int F, int MR, typename T>
void groups_into(const uint8_t* w, int64_t nblocks, const ActBlock* act, int64_t m0, int64_t g_begin, int64_t g_end,
                 int64_t n_total, const float* bias, T* y) {
  constexpr int GB = GROUP_ROWS * Layout<F>::block_bytes;
  int64_t g = g_begin;
#if RS_VNNI
  if constexpr (MR == 4) {
    float pair[MR][2 * GROUP_ROWS];
    for (; g + 2 <= g_end; g += 2) {
      group_pair_rows<F, MR>(w + g * nblocks * GB, w + (g + 1) * nblocks * GB, nblocks, act + m0 * nblocks, pair);
      const int64_t n0 = g * GROUP_ROWS;
      const int rows = static_cast<int>(std::min<int64_t>(2 * GROUP_ROWS, n_total - n0));
      for (int m = 0; m < MR; ++m)
        for (int r = 0; r < rows; ++r)
          store_out(y + (m0 + m) * n_total + n0 + r, pair[m][r] + (bias != nullptr ? bias[n0 + r] : 0.0f));
    }
  }
#endif
  float out[MR][GROUP_ROWS];
  for (; g < g_end; ++g) {
    group_rows<F, MR>(w + g * nblocks * GB, nblocks, act + m0 * nblocks, out);
    const int64_t n0 = g * GROUP_ROWS;
    const int rows = static_cast<int>(std::min<int64_t>(GROUP_ROWS, n_total - n0));
    for (int m = 0; m < MR; ++m)
      for (int r = 0; r < rows; ++r)
        store_out(y + (m0 + m) * n_total + n0 + r, out[m][r] + (bias != nullptr ? bias[n0 + r] : 0.0f));
  }
}

// Threads split the groups; each walks them in slices of about 12 KB of weights (4 groups of a
// 576-wide row), which stay in L1 while the activation rows pass them four at a time. A slice
// holds at least 2 groups (15 KB of a 1536-wide one), the pair group_pair_rows takes. (A fixed 4
// groups was 31 KB for the 1536-wide down projection, L1's whole size; against it, the bound
// measured no different within this machine's noise.)
template <int F, typename T>
void gemm(const uint8_t* w, int64_t n_total, const ActBlock* act, int64_t nblocks, int64_t m_total, const float* bias,
          T* y) {
  const int64_t groups = (n_total + GROUP_ROWS - 1) / GROUP_ROWS;
  const int64_t group_bytes = nblocks * GROUP_ROWS * Layout<F>::block_bytes;
  const int64_t slice = std::clamp<int64_t>((12 << 10) / group_bytes, 2, 8);
  at::parallel_for(0, groups, slice, [&](int64_t begin, int64_t end) {
    for (int64_t gs = begin; gs < end; gs += slice) {
      const int64_t ge = std::min(end, gs + slice);
      int64_t m = 0;
      for (; m + 4 <= m_total; m += 4) groups_into<F, 4>(w, nblocks, act, m, gs, ge, n_total, bias, y);
      if (m + 2 <= m_total) {
        groups_into<F, 2>(w, nblocks, act, m, gs, ge, n_total, bias, y);
        m += 2;
      }
      if (m < m_total) groups_into<F, 1>(w, nblocks, act, m, gs, ge, n_total, bias, y);
    }
  });
}
