// The inner loops of the formats with a fifth or sixth value bit or with sub-block scales: q5_0,
// q5_1, Q4_K, Q5_K and Q6_K, in the repacked layouts quant_gemm_variants.h KLayout describes.
//
// Included by quant_gemm_groups.h inside its variant's anonymous namespace, after the helpers it
// uses (dot_add, dot_finish, broadcast4); it includes nothing itself, for the reason that file's
// NOTE gives.
//
// Per group of 8 rows and sub-block of 32 values, lane r of a vector is row r as in the q4 formats:
// a chunk of nibbles is widened to its low and high values, each value's high bits are or-ed in
// from the planes (plane byte 4r + k holds chunk c's bits at bits 2c and 2c + 1, so the plane is
// shifted right by 2 per chunk and its bits 0 and 1 moved to bit 4, or 5 for Q6_K's second plane),
// and the two halves of the sub-block keep their own integer sums. The sums are exact; per
// sub-block and activation row they are scaled once in fp32:
//   q5_0  (w = d (u - 16)):          d d_a (dot) - 16 d s_a
//   q5_1  (w = d u + m):             d d_a (dot) + m s_a
//   Q4_K, Q5_K (w = d sc u - dmin m): d d_a (sc dot) - dmin d_a (m S), S = sum(q_a), the
//                                    brackets in int32
//   Q6_K  (w = d sc_h (u - 32), a scale per half h):
//                                    d d_a (sc_0 (dot_0 - 32 S_0) + sc_1 (dot_1 - 32 S_1))
// where S_h is the activation half's integer sum, and Q6_K's bracket is summed in int32 (at most
// 2 * 127 * 16 * 32 * 127, far below 2^31, and exact in the fp32 it is converted to).

// out[m][r] = row r of the group (at g) times activation row m, for MR activation rows.
template <int F, int MR>
void kgroup_rows(const uint8_t* g, int64_t nblocks, const ActBlock* a, float out[MR][GROUP_ROWS]) {
  using L = KLayout<F>;
  const int64_t nsuper = nblocks / L::sub_blocks;
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i bit4 = _mm256_set1_epi8(0x10);
  const __m256i bit5 = _mm256_set1_epi8(0x20);
  __m256 acc[MR];
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < nsuper; ++sb) {
    const uint8_t* p = g + sb * L::super_bytes;
    // The next group's same super-block, a group ahead, as group_rows does.
    for (int line = 0; line < L::super_bytes; line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(p + nsuper * L::super_bytes + line), _MM_HINT_T0);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    __m256 d2 = _mm256_setzero_ps();  // q5_1's minimums or the K-quants' dmin
    if constexpr (L::super_header == 4 * GROUP_ROWS)
      d2 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * GROUP_ROWS)));
    for (int j = 0; j < L::sub_blocks; ++j) {
      const uint8_t* sub = p + L::super_header + j * L::sub_bytes;
      const uint8_t* plane = sub + L::sub_header;
      const uint8_t* qs = plane + 32 * L::planes;
      const int64_t blk = sb * L::sub_blocks + j;
      __m256i sums[MR][2];
#pragma GCC unroll 4
      for (int m = 0; m < MR; ++m) sums[m][0] = sums[m][1] = _mm256_setzero_si256();
      __m256i h0 = _mm256_setzero_si256(), h1 = _mm256_setzero_si256();
      if constexpr (L::planes >= 1) h0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(plane));
      if constexpr (L::planes == 2) h1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(plane + 32));
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
        __m256i low = _mm256_and_si256(raw, nibble);
        __m256i high = _mm256_and_si256(_mm256_srli_epi16(raw, 4), nibble);
        // 16-bit shifts: a byte's target bit only ever comes from the same byte (the other byte's
        // bits land outside the mask), so no 8-bit shift is needed.
        if constexpr (L::planes >= 1) {
          low = _mm256_or_si256(low, _mm256_and_si256(_mm256_slli_epi16(h0, 4), bit4));
          high = _mm256_or_si256(high, _mm256_and_si256(_mm256_slli_epi16(h0, 3), bit4));
          h0 = _mm256_srli_epi16(h0, 2);
        }
        if constexpr (L::planes == 2) {
          low = _mm256_or_si256(low, _mm256_and_si256(_mm256_slli_epi16(h1, 5), bit5));
          high = _mm256_or_si256(high, _mm256_and_si256(_mm256_slli_epi16(h1, 4), bit5));
          h1 = _mm256_srli_epi16(h1, 2);
        }
#pragma GCC unroll 4
        for (int m = 0; m < MR; ++m) {
          const int8_t* aq = a[m * nblocks + blk].q;
          sums[m][0] = dot_add<F>(sums[m][0], low, broadcast4(aq + 4 * c));
          sums[m][1] = dot_add<F>(sums[m][1], high, broadcast4(aq + QK / 2 + 4 * c));
        }
      }
      // Per row: the sub-block's integer scales (and minimums). Every float term below is one
      // per-row vector times one per-activation-row scalar, times an exact integer: a product of
      // three floats could be reassociated under -ffast-math differently per tile size, and then
      // a row's result would depend on the rows beside it.
      __m256 corr = _mm256_setzero_ps();
      __m256i sc0 = _mm256_setzero_si256(), sc1 = _mm256_setzero_si256();
      if constexpr (F == Q5_0) corr = _mm256_mul_ps(d, _mm256_set1_ps(-16.0f));
      if constexpr (F == Q5_1) corr = d2;
      if constexpr (L::k_quant) {
        const auto load8 = [](const uint8_t* q) { return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)); };
        sc0 = F == Q6_K ? _mm256_cvtepi8_epi32(load8(sub)) : _mm256_cvtepu8_epi32(load8(sub));
        sc1 = F == Q6_K ? _mm256_cvtepi8_epi32(load8(sub + GROUP_ROWS)) : _mm256_cvtepu8_epi32(load8(sub + GROUP_ROWS));
      }
#pragma GCC unroll 4
      for (int m = 0; m < MR; ++m) {
        const ActBlock& ab = a[m * nblocks + blk];
        const __m256i dot0 = dot_finish<F>(sums[m][0]);
        const __m256i dot1 = dot_finish<F>(sums[m][1]);
        const __m256 dd = _mm256_mul_ps(d, _mm256_set1_ps(ab.d));
        if constexpr (F == Q6_K) {
          const __m256i t0 = _mm256_mullo_epi32(sc0, _mm256_sub_epi32(dot0, _mm256_set1_epi32(32 * ab.half_sum[0])));
          const __m256i t1 = _mm256_mullo_epi32(sc1, _mm256_sub_epi32(dot1, _mm256_set1_epi32(32 * ab.half_sum[1])));
          acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(t0, t1)), dd, acc[m]);
        } else if constexpr (L::k_quant) {
          // sc * dot <= 63 * 32 * 31 * 127 and m * S <= 63 * 32 * 127: exact in int32 and in fp32.
          const __m256i scaled = _mm256_mullo_epi32(sc0, _mm256_add_epi32(dot0, dot1));
          const __m256i mins = _mm256_mullo_epi32(sc1, _mm256_set1_epi32(ab.half_sum[0] + ab.half_sum[1]));
          acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(scaled), dd, acc[m]);
          acc[m] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_mul_ps(d2, _mm256_set1_ps(ab.d)), acc[m]);
        } else {
          acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(dot0, dot1)), dd, acc[m]);
          acc[m] = _mm256_fmadd_ps(corr, _mm256_set1_ps(ab.s), acc[m]);
        }
      }
    }
  }
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m) _mm256_storeu_ps(out[m], acc[m]);
}

#if RS_VNNI
// Two groups at once in 512-bit vectors (lanes 0-7 the first group's rows, 8-15 the second's), as
// group_pair_rows does for the other formats: each broadcast activation chunk and each per-row
// scale vector then serves 16 rows. The arithmetic per lane is kgroup_rows' exactly (the same
// integer sums, the same fp32 operations in the same order), so a row's result does not depend
// on which of the two paths, or which tile, computed it. Used for the tiles of 4 activation rows.
inline __m512i load_pair8(const uint8_t* a, const uint8_t* b) {  // two groups' 8 bytes, widened
  return _mm512_castsi128_si512(_mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a)),
                                                   _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b))));
}

template <int F, int MR>
void kgroup_pair_rows(const uint8_t* g0, const uint8_t* g1, int64_t nblocks, const ActBlock* a,
                      float out[MR][2 * GROUP_ROWS]) {
  using L = KLayout<F>;
  const int64_t nsuper = nblocks / L::sub_blocks;
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const __m512i bit4 = _mm512_set1_epi8(0x10);
  const __m512i bit5 = _mm512_set1_epi8(0x20);
  __m512 acc[MR];
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < nsuper; ++sb) {
    const uint8_t* p0 = g0 + sb * L::super_bytes;
    const uint8_t* p1 = g1 + sb * L::super_bytes;
    const __m512 d = load_pair_ph(p0, p1);
    __m512 d2 = _mm512_setzero_ps();
    if constexpr (L::super_header == 4 * GROUP_ROWS) d2 = load_pair_ph(p0 + 2 * GROUP_ROWS, p1 + 2 * GROUP_ROWS);
    for (int j = 0; j < L::sub_blocks; ++j) {
      const int64_t at = L::super_header + j * L::sub_bytes;
      const uint8_t* s0 = p0 + at;
      const uint8_t* s1 = p1 + at;
      const int64_t blk = sb * L::sub_blocks + j;
      __m512i sums[MR][2];
#pragma GCC unroll 4
      for (int m = 0; m < MR; ++m) sums[m][0] = sums[m][1] = _mm512_setzero_si512();
      __m512i h0 = _mm512_setzero_si512(), h1 = _mm512_setzero_si512();
      if constexpr (L::planes >= 1) h0 = load_pair(s0 + L::sub_header, s1 + L::sub_header);
      if constexpr (L::planes == 2) h1 = load_pair(s0 + L::sub_header + 32, s1 + L::sub_header + 32);
      const int qs = L::sub_header + 32 * L::planes;
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const __m512i raw = load_pair(s0 + qs + 32 * c, s1 + qs + 32 * c);
        __m512i low = _mm512_and_si512(raw, nibble);
        __m512i high = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nibble);
        if constexpr (L::planes >= 1) {
          low = _mm512_or_si512(low, _mm512_and_si512(_mm512_slli_epi16(h0, 4), bit4));
          high = _mm512_or_si512(high, _mm512_and_si512(_mm512_slli_epi16(h0, 3), bit4));
          h0 = _mm512_srli_epi16(h0, 2);
        }
        if constexpr (L::planes == 2) {
          low = _mm512_or_si512(low, _mm512_and_si512(_mm512_slli_epi16(h1, 5), bit5));
          high = _mm512_or_si512(high, _mm512_and_si512(_mm512_slli_epi16(h1, 4), bit5));
          h1 = _mm512_srli_epi16(h1, 2);
        }
#pragma GCC unroll 4
        for (int m = 0; m < MR; ++m) {
          const int8_t* aq = a[m * nblocks + blk].q;
          sums[m][0] = _mm512_dpbusd_epi32(sums[m][0], low, broadcast4_512(aq + 4 * c));
          sums[m][1] = _mm512_dpbusd_epi32(sums[m][1], high, broadcast4_512(aq + QK / 2 + 4 * c));
        }
      }
      __m512 corr = _mm512_setzero_ps();
      __m512i sc0 = _mm512_setzero_si512(), sc1 = _mm512_setzero_si512();
      if constexpr (F == Q5_0) corr = _mm512_mul_ps(d, _mm512_set1_ps(-16.0f));
      if constexpr (F == Q5_1) corr = d2;
      if constexpr (L::k_quant) {
        const __m128i raw0 = _mm512_castsi512_si128(load_pair8(s0, s1));
        const __m128i raw1 = _mm512_castsi512_si128(load_pair8(s0 + GROUP_ROWS, s1 + GROUP_ROWS));
        sc0 = F == Q6_K ? _mm512_cvtepi8_epi32(raw0) : _mm512_cvtepu8_epi32(raw0);
        sc1 = F == Q6_K ? _mm512_cvtepi8_epi32(raw1) : _mm512_cvtepu8_epi32(raw1);
      }
#pragma GCC unroll 4
      for (int m = 0; m < MR; ++m) {
        const ActBlock& ab = a[m * nblocks + blk];
        const __m512 dd = _mm512_mul_ps(d, _mm512_set1_ps(ab.d));
        if constexpr (F == Q6_K) {
          const __m512i t0 = _mm512_mullo_epi32(sc0, _mm512_sub_epi32(sums[m][0], _mm512_set1_epi32(32 * ab.half_sum[0])));
          const __m512i t1 = _mm512_mullo_epi32(sc1, _mm512_sub_epi32(sums[m][1], _mm512_set1_epi32(32 * ab.half_sum[1])));
          acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(t0, t1)), dd, acc[m]);
        } else if constexpr (L::k_quant) {
          const __m512i scaled = _mm512_mullo_epi32(sc0, _mm512_add_epi32(sums[m][0], sums[m][1]));
          const __m512i mins = _mm512_mullo_epi32(sc1, _mm512_set1_epi32(ab.half_sum[0] + ab.half_sum[1]));
          acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(scaled), dd, acc[m]);
          acc[m] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mins), _mm512_mul_ps(d2, _mm512_set1_ps(ab.d)), acc[m]);
        } else {
          acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(sums[m][0], sums[m][1])), dd, acc[m]);
          acc[m] = _mm512_fmadd_ps(corr, _mm512_set1_ps(ab.s), acc[m]);
        }
      }
    }
  }
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m) _mm512_storeu_ps(out[m], acc[m]);
}
#endif
