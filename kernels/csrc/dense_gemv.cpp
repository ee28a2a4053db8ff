// Dense linears for a few rows on plain row-major weights: y[M, N] = x[M, K] @ W[N, K]^T (+ bias),
// M from 1 to 16 (decode steps), W and x each fp32 or bf16.
//
// Why: a decode step of a full-precision model only streams its weights, so its speed is the
// read bandwidth it reaches. oneDNN's packed fp32 linears reached about 15-20 GB/s on a 2-core
// Zen 4 across a whole step (many small calls, each cold in cache) where a plain sum reads about
// 30 GB/s; and their packed layout is opaque, so no kernel of ours can read it. This one reads
// each weight row once, in order, for all M activation rows (held in fp32 in L1).
//
// Vectors are GCC vector extensions of 8 floats (vec8.h: one ymm register, AVX2 and AVX-512
// alike), so one source builds for both CPUs. Threads split the output rows (torch's thread pool).

#include "kernels.h"
#include "vec8.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>

#include <algorithm>
#include <type_traits>

namespace {

using radixserve::vec8::load8;
using radixserve::vec8::vf;
using radixserve::vec8::W;
constexpr int64_t kMaxRows = 16;  // the most rows a call takes (kernels/linear.py GEMV_MAX_ROWS)

inline float hsum(vf v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// One weight row against one or two activation rows: out[r] = x_r . w, with kUnroll
// accumulators per activation row to hide the FMA latency (one row is all a decode step has).
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

// kCols weight rows against kRows activation rows, one accumulator each: out[r][c] = x_r . w_c.
// Each loaded vector feeds several products (kCols + kRows loads for kRows * kCols FMAs): from
// three rows on, the loads from L1, not memory, bound a weight row met row by row. The next
// tile's rows (the kCols rows after these, contiguous) are prefetched in address order as this
// one is read, one sequential stream, as the hardware prefetcher follows best.
template <typename T, int kRows, int kCols>
inline void dot_tile(const T* w, int64_t K, const float* x, float (&out)[kRows][kCols]) {
  vf acc[kRows][kCols] = {};
  const int64_t body = K / W * W;
  const char* next = reinterpret_cast<const char*>(w + kCols * K);
  constexpr int64_t kStepBytes = kCols * W * static_cast<int64_t>(sizeof(T));  // of the next tile, per step
  for (int64_t k = 0; k < body; k += W) {
    const char* p = next + k * kCols * static_cast<int64_t>(sizeof(T));
    for (int64_t off = 0; off < kStepBytes; off += 64) __builtin_prefetch(p + off);
    vf wv[kCols];
    for (int c = 0; c < kCols; ++c) wv[c] = load8(w + c * K + k);
    for (int r = 0; r < kRows; ++r) {
      const vf xv = load8(x + r * K + k);
      for (int c = 0; c < kCols; ++c) acc[r][c] += xv * wv[c];
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kCols; ++c) {
      float s = hsum(acc[r][c]);
      for (int64_t k = body; k < K; ++k) s += x[r * K + k] * static_cast<float>(w[c * K + k]);
      out[r][c] = s;
    }
}

constexpr int kTileRows = 4;  // activation rows a tile holds (4 x kCols accumulators)
// Weight rows a tile holds: 3 with few activation rows (3 is faster than 6 there); 6 from
// kWideFrom activation rows where AVX-512's 32 registers hold 24 accumulators (AVX2 has 16:
// 12 accumulators + 3 weights + 1 activation).
constexpr int kNarrowCols = 3;
#ifdef __AVX512F__
constexpr int kWideCols = 6;
#else
constexpr int kWideCols = 3;
#endif
constexpr int64_t kWideFrom = 5;

// Weight rows w .. w + kCols - 1 against every activation row, kTileRows at a time.
template <typename T, int kCols>
inline void tile_rows(const T* w, int64_t M, int64_t K, const float* x, float (*out)[kCols]) {
  int64_t r = 0;
  auto run = [&](auto rows_tag) {
    constexpr int R = decltype(rows_tag)::value;
    float part[R][kCols];
    dot_tile<T, R, kCols>(w, K, x + r * K, part);
    for (int i = 0; i < R; ++i)
      for (int c = 0; c < kCols; ++c) out[r + i][c] = part[i][c];
    r += R;
  };
  while (r + kTileRows <= M) run(std::integral_constant<int, kTileRows>{});
  switch (M - r) {
    case 3: run(std::integral_constant<int, 3>{}); break;
    case 2: run(std::integral_constant<int, 2>{}); break;
    case 1: run(std::integral_constant<int, 1>{}); break;
    default: break;
  }
}

// Output rows [begin, end) in tiles of kCols weight rows; the range's last few one at a time.
template <typename T, int kCols, typename Store>
inline void run_tiles(const T* w, int64_t M, int64_t K, const float* x, int64_t begin, int64_t end, Store store) {
  float out[kMaxRows][kCols];
  float single[kMaxRows][1];
  for (int64_t n = begin; n < end;) {
    if (n + kCols <= end) {
      tile_rows<T, kCols>(w + n * K, M, K, x, out);
      for (int c = 0; c < kCols; ++c)
        for (int64_t r = 0; r < M; ++r) store(n + c, r, out[r][c]);
      n += kCols;
    } else {
      tile_rows<T, 1>(w + n * K, M, K, x, single);
      for (int64_t r = 0; r < M; ++r) store(n, r, single[r][0]);
      n += 1;
    }
  }
}

// Each thread takes a contiguous range of output rows and reads their weight rows in order.
// Measured on the 2-core Zen 4 over a whole decode step's weights (538 MB fp32,
// scripts/bench_dense_gemv.py): one or two activation rows meet one weight row at a time, a
// single sequential stream per thread, which read 36 GB/s (following 4 or 8 weight rows at once,
// that many streams, read 20-25 GB/s, and software prefetching within the rows only slowed it).
// More activation rows meet a tile of weight rows at once, so that the loads from L1 stop
// bounding the loop; each tile prefetches the next one in address order (dot_tile), which took
// 3 and 4 activation rows from 0.75x to 1.0x oneDNN's packed speed.
template <typename T, typename Out>
void gemv_impl(const T* w, int64_t M, int64_t N, int64_t K, const float* x, const float* bias, Out* y) {
  // At least 64 KB of weight per task: smaller pieces only add the pool's overhead.
  const int64_t grain = std::max<int64_t>(kWideCols, (64 << 10) / (K * static_cast<int64_t>(sizeof(T))));
  auto store = [&](int64_t n, int64_t r, float v) { y[r * N + n] = static_cast<Out>(bias ? v + bias[n] : v); };
  at::parallel_for(0, N, grain, [&](int64_t begin, int64_t end) {
    if (M >= kWideFrom) return run_tiles<T, kWideCols>(w, M, K, x, begin, end, store);
    if (M >= 3) return run_tiles<T, kNarrowCols>(w, M, K, x, begin, end, store);
    float out[2];
    for (int64_t n = begin; n < end; ++n) {
      if (M == 2) dot_row<T, 2>(w + n * K, K, x, out);
      else dot_row<T, 1>(w + n * K, K, x, out);
      for (int64_t r = 0; r < M; ++r) store(n, r, out[r]);
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
  const at::Tensor xf = x.to(at::kFloat).contiguous();  // M * K floats: at most 16 rows, within L1 or L2
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
