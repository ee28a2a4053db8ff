// Paged decode attention on CPU: each request's one new query row per head attends to its KV
// slots straight from the pool, with no gather into a padded copy.
//
// Why: torch's CPU SDPA kernel is built for long queries; a decode query (the `group` heads that
// share a KV head: 1 to 8 rows) runs it at a few GFLOP/s, and the padded gather it needs first
// copies every request's whole KV once more per layer. Decode attention only has to stream K and
// V once, so this loop reads each K and V row once for all the query heads that share it.
//
// Layout: q [B, H, D]; k_pool, v_pool [S, KVH, D] (one layer of the pool, contiguous); slots
// int64 [N]: request b's KV slots are slots[indptr[b] : indptr[b+1]]; H = KVH * group, D 64 or
// 128, group 1 to 8. Out [B, H, D] in q's dtype, and the log-sum-exp [B, H] (fp32) for merging with
// another part (cascade). fp32 or bf16 (the pool's dtype must match q's); accumulation is fp32.
//
// Vectors are vec8.h's 8 floats. A score is a dot product over D, so each K row gives one
// vector of partial sums per query row; eight keys' partials are reduced together by a
// transpose-add tree (no horizontal sum per key). With the query rows and accumulators held in
// registers that took the kernel from about 100 to 70-85 cycles per K/V row with the rows in
// cache, which leaves it at the memory's pace (15-19 GB/s on a 2-core Zen 4) when a request's
// slots are contiguous; scattered slots read at 6-10 GB/s (scripts/bench_decode_attention.py).
//
// Built once at setup (scripts/setup.sh runs `python -m kernels.cpu_ext build`); never compiled
// at run time. kernels/cpu_ext.py loads it and falls back to the torch path when it is absent.

#include "kernels.h"
#include "vec8.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

namespace {

using namespace radixserve::vec8;

// [a0+a1, a2+a3, b0+b1, b2+b3, a4+a5, a6+a7, b4+b5, b6+b7] (AVX's hadd).
inline vf hadd(vf a, vf b) {
  return __builtin_shuffle(a, b, vi{0, 2, 8, 10, 4, 6, 12, 14}) + __builtin_shuffle(a, b, vi{1, 3, 9, 11, 5, 7, 13, 15});
}

// Lane j of the result is the sum of p[j]'s eight lanes.
inline vf reduce8(const vf* p) {
  const vf lo = hadd(hadd(p[0], p[1]), hadd(p[2], p[3]));
  const vf hi = hadd(hadd(p[4], p[5]), hadd(p[6], p[7]));
  return __builtin_shuffle(lo, hi, vi{0, 1, 2, 3, 8, 9, 10, 11}) + __builtin_shuffle(lo, hi, vi{4, 5, 6, 7, 12, 13, 14, 15});
}

inline float lane_max(vf v) {
  float m = v[0];
  for (int j = 1; j < W; ++j) m = std::max(m, v[j]);
  return m;
}

// Rows are fetched this many tokens ahead: slots are often scattered, and the compute per row
// is too short for the hardware prefetcher and out-of-order window alone to hide the misses.
constexpr int64_t kPrefetch = 8;

// One (request, KV head): its kGroup query rows against its `len` KV rows. Compile-time sizes
// let the compiler keep the query rows and the accumulators in registers.
template <typename T, int64_t kHeadDim, int64_t kGroup>
struct Task {
  static constexpr int64_t C = kHeadDim / W;  // vectors per row
  const T* k_base;  // this KV head's column of the pool
  const T* v_base;
  int64_t row_stride;
  const int64_t* slots;
  int64_t len;
  float* scores;  // [kGroup, len_padded]
  int64_t stride;  // len rounded up to W

  const T* k_row(int64_t l) const { return k_base + slots[l] * row_stride; }
  const T* v_row(int64_t l) const { return v_base + slots[l] * row_stride; }

  // scores[g][l] = q_g . k_l for every key; returns each row's max.
  void score(const vf (&q)[kGroup][C], float (&row_max)[kGroup]) const {
    vf top[kGroup];
    for (int64_t g = 0; g < kGroup; ++g) top[g] = vf{} + std::numeric_limits<float>::lowest();
    for (int64_t l0 = 0; l0 < len; l0 += W) {
      const int64_t n = std::min(W, len - l0);
      vf part[kGroup][W];
      for (int64_t j = 0; j < W; ++j) {
        if (j >= n) {
          for (int64_t g = 0; g < kGroup; ++g) part[g][j] = vf{};
          continue;
        }
        const int64_t l = l0 + j;
        if (l + kPrefetch < len) prefetch_row(k_row(l + kPrefetch), kHeadDim);
        const T* k = k_row(l);
        vf kv[C];
        for (int64_t c = 0; c < C; ++c) kv[c] = load8(k + c * W);
        for (int64_t g = 0; g < kGroup; ++g) {
          vf a = q[g][0] * kv[0], b = vf{};
          for (int64_t c = 1; c < C; c += 2) {
            b += q[g][c] * kv[c];
            if (c + 1 < C) a += q[g][c + 1] * kv[c + 1];
          }
          part[g][j] = a + b;
        }
      }
      for (int64_t g = 0; g < kGroup; ++g) {
        vf s = reduce8(part[g]);
        if (n < W) {
          for (int64_t j = n; j < W; ++j) s[j] = std::numeric_limits<float>::lowest();  // -ffast-math: no infinities
        }
        std::memcpy(scores + g * stride + l0, &s, sizeof s);
        top[g] = s > top[g] ? s : top[g];
      }
    }
    for (int64_t g = 0; g < kGroup; ++g) row_max[g] = lane_max(top[g]);
  }

  // acc[g] = sum_l w[g][l] * v_l, the weights in `scores`. The row is taken kChunk vectors at a
  // time so that the accumulators of all query rows (at most 12 vectors) stay in registers, AVX2's
  // 16 included. With 2-3 query rows per KV head (the default model has 3) a chunk of a bf16 row
  // of 64 is one cache line, so each line is read once; with more rows, several passes visit a
  // line, the later ones from cache while the request's V fits there.
  static constexpr int64_t kChunk = kGroup == 1 ? 8 : kGroup <= 3 ? 4 : kGroup <= 6 ? 2 : 1;
  static_assert(C % kChunk == 0, "the chunks tile the row");

  void accumulate(vf (&acc)[kGroup][C]) const {
    for (int64_t c0 = 0; c0 < C; c0 += kChunk) {
      vf a[kGroup][kChunk] = {};
      for (int64_t l = 0; l < len; ++l) {
        const T* v = v_row(l) + c0 * W;
        if (l + kPrefetch < len) __builtin_prefetch(v_row(l + kPrefetch) + c0 * W);
        vf vv[kChunk];
        for (int64_t c = 0; c < kChunk; ++c) vv[c] = load8(v + c * W);
        for (int64_t g = 0; g < kGroup; ++g) {
          const float w = scores[g * stride + l];
          for (int64_t c = 0; c < kChunk; ++c) a[g][c] += w * vv[c];
        }
      }
      for (int64_t g = 0; g < kGroup; ++g)
        for (int64_t c = 0; c < kChunk; ++c) acc[g][c0 + c] = a[g][c];
    }
  }
};

template <typename T, int64_t kHeadDim, int64_t kGroup>
void decode_attention_impl(const T* q, const T* k_pool, const T* v_pool, const int64_t* slots,
                           const int64_t* indptr, T* out, float* lse, int64_t batch, int64_t kv_heads, float scale) {
  constexpr int64_t C = kHeadDim / W;
  const int64_t heads = kv_heads * kGroup;
  const int64_t row_stride = kv_heads * kHeadDim;  // between consecutive slots of the pool
  // One task per (request, KV head): its kGroup query rows share every K/V row it reads. A
  // thread takes consecutive requests of one KV head, so a prefix their slots share (a system
  // prompt, a conversation's history) is read from memory once and then from its cache: one KV
  // head's column of 1024 bf16 tokens of 64 is 256 KB of K and V, within a core's L2.
  at::parallel_for(0, batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t kh = t / batch, b = t % batch;
      const int64_t start = indptr[b], len = indptr[b + 1] - start;
      const int64_t stride = (len + W - 1) / W * W;
      scores.resize(kGroup * stride);
      const Task<T, kHeadDim, kGroup> task{k_pool + kh * kHeadDim, v_pool + kh * kHeadDim, row_stride,
                                           slots + start, len, scores.data(), stride};
      const T* q_rows = q + (b * heads + kh * kGroup) * kHeadDim;
      vf qv[kGroup][C];
      for (int64_t g = 0; g < kGroup; ++g)
        for (int64_t c = 0; c < C; ++c) qv[g][c] = load8(q_rows + g * kHeadDim + c * W) * scale;
      float row_max[kGroup], row_sum[kGroup];
      task.score(qv, row_max);
      for (int64_t g = 0; g < kGroup; ++g) {
        float sum = 0.0f;
        float* sg = scores.data() + g * stride;
        const float top = row_max[g];
#pragma omp simd reduction(+ : sum)
        for (int64_t l = 0; l < len; ++l) {
          sg[l] = std::exp(sg[l] - top);  // vectorized by libmvec (needs -ffast-math)
          sum += sg[l];
        }
        row_sum[g] = sum;
      }
      vf acc[kGroup][C];
      task.accumulate(acc);
      for (int64_t g = 0; g < kGroup; ++g) {
        const float inv = 1.0f / row_sum[g];
        T* o = out + (b * heads + kh * kGroup + g) * kHeadDim;
        for (int64_t c = 0; c < C; ++c)
          for (int64_t j = 0; j < W; ++j) o[c * W + j] = static_cast<T>(acc[g][c][j] * inv);
        lse[b * heads + kh * kGroup + g] = row_max[g] + std::log(row_sum[g]);
      }
    }
  });
}

// The instantiation for this head size and group, chosen at run time.
template <typename T, int64_t kHeadDim>
void dispatch_group(int64_t group, const T* q, const T* k, const T* v, const int64_t* slots, const int64_t* indptr,
                    T* out, float* lse, int64_t batch, int64_t kv_heads, float scale) {
  switch (group) {
#define RS_GROUP(G) \
  case G: return decode_attention_impl<T, kHeadDim, G>(q, k, v, slots, indptr, out, lse, batch, kv_heads, scale);
    RS_GROUP(1) RS_GROUP(2) RS_GROUP(3) RS_GROUP(4) RS_GROUP(5) RS_GROUP(6) RS_GROUP(7) RS_GROUP(8)
#undef RS_GROUP
  }
  TORCH_CHECK(false, "decode_attention: query heads per KV head must be 1 to 8, got ", group);
}

}  // namespace

namespace radixserve {

// Returns (out [B, H, D], lse [B, H]).
std::vector<at::Tensor> decode_attention(at::Tensor q, at::Tensor k_pool, at::Tensor v_pool, at::Tensor slots,
                                         at::Tensor indptr, double scale) {
  TORCH_CHECK(q.dim() == 3 && k_pool.dim() == 3 && v_pool.dim() == 3, "q [B,H,D], pools [S,KVH,D]");
  TORCH_CHECK(q.is_contiguous() && k_pool.is_contiguous() && v_pool.is_contiguous(), "contiguous inputs");
  TORCH_CHECK(k_pool.scalar_type() == q.scalar_type() && v_pool.scalar_type() == q.scalar_type(),
              "q and the pool must share a dtype");
  TORCH_CHECK(slots.scalar_type() == at::kLong && indptr.scalar_type() == at::kLong, "int64 indices");
  const int64_t batch = q.size(0), heads = q.size(1), head_dim = q.size(2), kv_heads = k_pool.size(1);
  TORCH_CHECK(heads % kv_heads == 0 && k_pool.size(2) == head_dim && indptr.numel() == batch + 1, "shapes");
  const int64_t group = heads / kv_heads;
  // kernels/decode_attention.py kernel_supports() says the same.
  TORCH_CHECK((head_dim == 64 || head_dim == 128) && group >= 1 && group <= 8, "decode_attention: head_dim 64 or 128 and 1 to 8 query "
              "heads per KV head, got ", head_dim, " and ", group);
  auto out = at::empty_like(q);
  auto lse = at::empty({batch, heads}, q.options().dtype(at::kFloat));
  auto slots_c = slots.contiguous(), indptr_c = indptr.contiguous();
  const float s = static_cast<float>(scale);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    auto args = std::make_tuple(group, q.data_ptr<T>(), k_pool.data_ptr<T>(), v_pool.data_ptr<T>(),
                                slots_c.data_ptr<int64_t>(), indptr_c.data_ptr<int64_t>(), out.data_ptr<T>(),
                                lse.data_ptr<float>(), batch, kv_heads, s);
    if (head_dim == 64) std::apply(dispatch_group<T, 64>, args);
    else std::apply(dispatch_group<T, 128>, args);
  };
  if (q.scalar_type() == at::kFloat) {
    run(float{});
  } else {
    TORCH_CHECK(q.scalar_type() == at::kBFloat16, "fp32 or bf16 only");
    run(c10::BFloat16{});
  }
  return {out, lse};
}

}  // namespace radixserve
