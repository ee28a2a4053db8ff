// Dense linears for a few rows on plain row-major weights: y[M, N] = x[M, K] @ W[N, K]^T (+ bias),
// M from 1 to 8 (decode steps), W and x each fp32 or bf16.
//
// Why: a decode step of a full-precision model only streams its weights, so its speed is the
// read bandwidth it reaches. oneDNN's packed fp32 linears reached about 15-20 GB/s on a 2-core
// Zen 4 across a whole step (many small calls, each cold in cache) where a plain sum reads about
// 30 GB/s; and their packed layout is opaque, so no kernel of ours can read it. This one reads
// each weight row once, in order, for all M activation rows (held in fp32 in L1).
//
// Vectors are GCC vector extensions of 8 floats (one ymm register, AVX2 and AVX-512 alike, as in
// decode_attention.cpp), so one source builds for both CPUs. Threads split the output rows
// (torch's thread pool).

#include "kernels.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace {

typedef float vf __attribute__((vector_size(32)));  // 8 floats
constexpr int64_t W = 8;
constexpr int64_t kMaxRows = 8;  // kernels/linear.py GEMV_MAX_ROWS

inline vf load8(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline vf load8(const c10::BFloat16* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

inline float hsum(vf v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// One weight row against kRows activation rows: out[r] = x_r . w. kUnroll accumulators per
// activation row hide the FMA latency. The same products are summed in the same order whatever
// the call's row count, so each output is bit for bit independent of the other rows in the call.
constexpr int kUnroll = 4;

template <typename T, int kRows>
inline void dot_row(const T* w, int64_t K, const float* x, float* out) {
  vf acc[kRows][kUnroll] = {};
  constexpr int64_t kStep = kUnroll * W;
  const int64_t body = K / kStep * kStep;
  for (int64_t k = 0; k < body; k += kStep) {
    vf wv[kUnroll];
    for (int u = 0; u < kUnroll; ++u) wv[u] = load8(w + k + u * W);
    for (int r = 0; r < kRows; ++r)
      for (int u = 0; u < kUnroll; ++u) acc[r][u] += load8(x + r * K + k + u * W) * wv[u];
  }
  for (int r = 0; r < kRows; ++r) {
    float s = hsum((acc[r][0] + acc[r][1]) + (acc[r][2] + acc[r][3]));
    for (int64_t k = body; k < K; ++k) s += x[r * K + k] * static_cast<float>(w[k]);
    out[r] = s;
  }
}

// Each thread takes a contiguous range of output rows and reads their weight rows one after
// another: a single sequential stream per thread. Measured on the 2-core Zen 4 over a whole
// decode step's weights (538 MB fp32): 36-39 GB/s this way; 20-25 GB/s following 4 or 8 rows at
// once (that many streams), and software prefetching only slowed it. The activation rows meet a
// weight row two at a time (8 accumulators and the loaded vectors fit AVX2's 16 registers; four
// rows at once spilled and halved the speed); the passes after the first read the row from L1.
template <typename T, typename Out>
void gemv_impl(const T* w, int64_t M, int64_t N, int64_t K, const float* x, const float* bias, Out* y) {
  // At least 64 KB of weight per task: smaller pieces only add the pool's overhead.
  const int64_t grain = std::max<int64_t>(1, (64 << 10) / (K * static_cast<int64_t>(sizeof(T))));
  at::parallel_for(0, N, grain, [&](int64_t begin, int64_t end) {
    float out[kMaxRows];
    for (int64_t n = begin; n < end; ++n) {
      const T* row = w + n * K;
      int64_t r = 0;
      for (; r + 2 <= M; r += 2) dot_row<T, 2>(row, K, x + r * K, out + r);
      if (r < M) dot_row<T, 1>(row, K, x + r * K, out + r);
      for (r = 0; r < M; ++r) y[r * N + n] = static_cast<Out>(bias ? out[r] + bias[n] : out[r]);
    }
  });
}

}  // namespace

namespace radixserve {

at::Tensor dense_gemv(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "dense_gemv: x [M, K], w [N, K]");
  TORCH_CHECK(w.is_contiguous(), "dense_gemv: a row-major weight");
  const int64_t M = x.size(0), N = w.size(0), K = w.size(1);
  TORCH_CHECK(M >= 1 && M <= kMaxRows, "dense_gemv: 1 to ", kMaxRows, " rows, got ", M);
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "dense_gemv: fp32 or bf16 x");
  const at::Tensor xf = x.to(at::kFloat).contiguous();  // M * K floats: at most 8 rows, an L1's worth
  at::Tensor bf;
  if (bias.has_value()) {
    TORCH_CHECK(bias->numel() == N, "dense_gemv: bias [N]");
    bf = bias->to(at::kFloat).contiguous();
  }
  const float* b = bias.has_value() ? bf.data_ptr<float>() : nullptr;
  at::Tensor y = at::empty({M, N}, x.options());
  auto run = [&](auto wtag) {
    using T = decltype(wtag);
    const T* wp = w.data_ptr<T>();
    if (x.scalar_type() == at::kFloat) gemv_impl(wp, M, N, K, xf.data_ptr<float>(), b, y.data_ptr<float>());
    else gemv_impl(wp, M, N, K, xf.data_ptr<float>(), b, y.data_ptr<c10::BFloat16>());
  };
  if (w.scalar_type() == at::kFloat) {
    run(float{});
  } else {
    TORCH_CHECK(w.scalar_type() == at::kBFloat16, "dense_gemv: fp32 or bf16 weight");
    run(c10::BFloat16{});
  }
  return y;
}

}  // namespace radixserve
