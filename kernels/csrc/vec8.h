// Vectors of 8 floats shared by our attention kernels: GCC vector extensions, so one source
// builds for AVX2 and AVX-512 alike (one ymm register either way: Zen 4 runs a zmm op as two
// ymm halves, so wider vectors would not add throughput there).

#pragma once

#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace radixserve::vec8 {

typedef float vf __attribute__((vector_size(32)));     // 8 floats
typedef int32_t vi __attribute__((vector_size(32)));   // shuffle masks
constexpr int64_t W = 8;

// Eight values from a row, widened to fp32 (a bf16 is the high half of an fp32).
inline vf load8(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline vf load8(const c10::BFloat16* p) {
  // AVX2's one-instruction widening (GCC splits __builtin_convertvector into 4-lane halves).
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

inline void store8(float* p, vf v) { std::memcpy(p, &v, sizeof v); }

// Prefetch the cache lines of a row of n values.
template <typename T>
inline void prefetch_row(const T* row, int64_t n) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t off = 0; off < n * static_cast<int64_t>(sizeof(T)); off += 64) __builtin_prefetch(p + off);
}

}  // namespace radixserve::vec8
