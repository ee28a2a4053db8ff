// The integer kernel's inner loops, compiled once per instruction set: quant_gemm.cpp includes
// this file twice, inside `namespace avx2` under `#pragma GCC target("avx2,...")` and inside
// `namespace avx512` under a target with AVX-512 VNNI, with RS_VNNI set to 0 or 1. Only the
// integer dot product differs: AVX2 multiplies u8 x s8 pairs into int16 and adds pairs into
// int32 (_mm256_maddubs_epi16, _mm256_madd_epi16); VNNI does both in one _mm256_dpbusd_epi32.
//
// The weight layout (kernels/gguf_blocks.py interleave_rows): rows in groups of 8, and per group
// and block the 8 rows' fp16 scales (and q4_1's 8 minimums) first, then the 8 rows' values. So
// one load and one conversion give the 8 rows' scales as a vector, and the 8 rows' integer sums
// are gathered into one vector (a tree of horizontal adds) before one scaled multiply-add: per
// block, the scalar work is per group, not per row.

// The block's 32 values as bytes: unsigned nibbles for q4 formats, signed int8 for q8_0.
template <int F>
inline __m256i load_values(const uint8_t* qs) {
  if constexpr (F == Q8_0) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// Eight int32 partial sums of u . s (u unsigned, s signed bytes).
inline __m256i dot_us(__m256i u, __m256i s) {
#if RS_VNNI
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

template <int F>
inline __m256i dot_block(__m256i w, __m256i a) {
  if constexpr (F == Q8_0) return dot_us(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));  // |w| . a*sign(w)
  return dot_us(w, a);
}

// Lane r of the result = the sum of p[r]'s eight lanes.
inline __m256i sum_each(const __m256i p[GROUP_ROWS]) {
  const __m256i u0 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
  const __m256i u1 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20), _mm256_permute2x128_si256(u0, u1, 0x31));
}

// out[m][r] = row r of the group (at g) times activation row m, for MR activation rows.
template <int F, int MR>
void group_rows(const uint8_t* g, int64_t nblocks, const ActBlock* a, float out[MR][GROUP_ROWS]) {
  constexpr int GB = GROUP_ROWS * Layout<F>::block_bytes;
  __m256 acc[MR];
  __m256 corr[MR];
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m) {
    acc[m] = _mm256_setzero_ps();
    corr[m] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < nblocks; ++b) {
    const uint8_t* p = g + b * GB;
    // The next group's same block, a group ahead: decode streams every weight once, and the
    // hardware prefetcher alone left the kernel at half the memory's bandwidth.
    _mm_prefetch(reinterpret_cast<const char*>(p + nblocks * GB), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(p + nblocks * GB + 64), _MM_HINT_T0);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    __m256 c = _mm256_setzero_ps();  // each row's weight against s_a: -8 d (q4_0), m (q4_1)
    if constexpr (F == Q4_0) c = _mm256_mul_ps(d, _mm256_set1_ps(-8.0f));
    if constexpr (F == Q4_1) c = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * GROUP_ROWS)));
    const uint8_t* qs = p + Layout<F>::group_header;
    __m256i w[GROUP_ROWS];
#pragma GCC unroll 8
    for (int r = 0; r < GROUP_ROWS; ++r) w[r] = load_values<F>(qs + r * Layout<F>::value_bytes);
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) {
      const ActBlock& ab = a[m * nblocks + b];
      const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab.q));
      __m256i sums[GROUP_ROWS];
#pragma GCC unroll 8
      for (int r = 0; r < GROUP_ROWS; ++r) sums[r] = dot_block<F>(w[r], av);
      const __m256 dots = _mm256_cvtepi32_ps(sum_each(sums));
      acc[m] = _mm256_fmadd_ps(dots, _mm256_mul_ps(d, _mm256_set1_ps(ab.d)), acc[m]);
      if constexpr (F != Q8_0) corr[m] = _mm256_fmadd_ps(c, _mm256_set1_ps(ab.s), corr[m]);
    }
  }
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m) _mm256_storeu_ps(out[m], _mm256_add_ps(acc[m], corr[m]));
}

// Groups [g_begin, g_end) against every activation row, stored into y [M, n_total] (+ bias).
template <int F, int MR, typename T>
void groups_into(const uint8_t* w, int64_t nblocks, const ActBlock* act, int64_t m0, int64_t g_begin, int64_t g_end,
                 int64_t n_total, const float* bias, T* y) {
  constexpr int GB = GROUP_ROWS * Layout<F>::block_bytes;
  float out[MR][GROUP_ROWS];
  for (int64_t g = g_begin; g < g_end; ++g) {
    group_rows<F, MR>(w + g * nblocks * GB, nblocks, act + m0 * nblocks, out);
    const int64_t n0 = g * GROUP_ROWS;
    const int rows = static_cast<int>(std::min<int64_t>(GROUP_ROWS, n_total - n0));
    for (int m = 0; m < MR; ++m)
      for (int r = 0; r < rows; ++r)
        store_out(y + (m0 + m) * n_total + n0 + r, out[m][r] + (bias != nullptr ? bias[n0 + r] : 0.0f));
  }
}

// Threads split the groups; each walks its groups for activation rows four at a time (a slice of
// 4 groups is 4-8 KB of weights, which stays in L1 while the activation rows pass it).
template <int F, typename T>
void gemm(const uint8_t* w, int64_t n_total, const ActBlock* act, int64_t nblocks, int64_t m_total, const float* bias,
          T* y) {
  const int64_t groups = (n_total + GROUP_ROWS - 1) / GROUP_ROWS;
  at::parallel_for(0, groups, 4, [&](int64_t begin, int64_t end) {
    for (int64_t gs = begin; gs < end; gs += 4) {
      const int64_t ge = std::min(end, gs + 4);
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
