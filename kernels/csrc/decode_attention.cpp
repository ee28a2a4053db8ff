// Paged decode attention on CPU: each request's one new query row per head attends to its KV
// slots straight from the pool, with no gather into a padded copy.
//
// Why: torch's CPU SDPA kernel is built for long queries; a decode query (the `group` heads that
// share a KV head: 1 to 8 rows) runs it at a few GFLOP/s, and the padded gather it needs first
// copies every request's whole KV once more per layer. Decode attention only has to stream K and
// V once, so this loop reads each K and V row once for all the query heads that share it.
//
// Layout: q [B, H, D]; k_pool, v_pool [S, KVH, D] (one layer of the pool, contiguous); slots
// int64 [N]: request b's KV slots are slots[indptr[b] : indptr[b+1]]; H = KVH * group. Out
// [B, H, D] in q's dtype, and the log-sum-exp [B, H] (fp32) for merging with another part
// (cascade). fp32 or bf16 (the pool's dtype must match q's); accumulation is fp32.
//
// Built once at setup (scripts/setup.sh runs `python -m kernels.cpu_ext build`); never compiled
// at run time. kernels/cpu_ext.py loads it and falls back to the torch path when it is absent.

#include "kernels.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/BFloat16.h>

#include <cmath>
#include <tuple>
#include <limits>
#include <vector>

namespace {

// Widen one row to fp32 (for bf16: the 16 bits become the high half of an fp32, which
// vectorizes, unlike a per-element conversion call).
inline void load_row(const float* src, float* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
}
inline void load_row(const c10::BFloat16* src, float* dst, int64_t n) {
  const uint16_t* raw = reinterpret_cast<const uint16_t*>(src);
  uint32_t* bits = reinterpret_cast<uint32_t*>(dst);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) bits[i] = static_cast<uint32_t>(raw[i]) << 16;
}

// Rows are fetched this many tokens ahead: slots are often scattered, and the compute per row
// is too short for the hardware prefetcher and out-of-order window alone to hide the misses.
constexpr int64_t kPrefetch = 8;

template <typename T>
inline void prefetch_row(const T* row, int64_t n) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t off = 0; off < n * static_cast<int64_t>(sizeof(T)); off += 64) __builtin_prefetch(p + off);
}

template <typename T, int64_t kHeadDim, int64_t kGroup>
void decode_attention_impl(const T* q, const T* k_pool, const T* v_pool, const int64_t* slots,
                           const int64_t* indptr, T* out, float* lse, int64_t batch,
                           int64_t kv_heads, int64_t group_arg, int64_t head_dim_arg, float scale) {
  // Compile-time sizes (kHeadDim, kGroup > 0) let the compiler keep a row in registers.
  const int64_t head_dim = kHeadDim > 0 ? kHeadDim : head_dim_arg;
  const int64_t group = kGroup > 0 ? kGroup : group_arg;
  const int64_t heads = kv_heads * group;
  const int64_t row_stride = kv_heads * head_dim;  // between consecutive slots of the pool
  // One task per (request, KV head): its `group` query rows share every K/V row it reads.
  at::parallel_for(0, batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(group * head_dim), acc(group * head_dim), scores, kv(head_dim);
    std::vector<float> row_max(group), row_sum(group);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / kv_heads, kh = task % kv_heads;
      const int64_t start = indptr[b], len = indptr[b + 1] - start;
      const T* q_rows = q + (b * heads + kh * group) * head_dim;
      load_row(q_rows, qf.data(), group * head_dim);
      for (int64_t i = 0; i < group * head_dim; ++i) qf[i] *= scale;
      scores.assign(group * len, 0.0f);
      for (int64_t g = 0; g < group; ++g) row_max[g] = std::numeric_limits<float>::lowest();
      // Scores: each K row is read once and dotted with every query row of the group.
      for (int64_t l = 0; l < len; ++l) {
        if (l + kPrefetch < len) prefetch_row(k_pool + slots[start + l + kPrefetch] * row_stride + kh * head_dim, head_dim);
        const T* k_row = k_pool + slots[start + l] * row_stride + kh * head_dim;
        load_row(k_row, kv.data(), head_dim);
        for (int64_t g = 0; g < group; ++g) {
          const float* qg = qf.data() + g * head_dim;
          float s = 0.0f;
#pragma omp simd reduction(+ : s)
          for (int64_t d = 0; d < head_dim; ++d) s += qg[d] * kv[d];
          scores[g * len + l] = s;
          row_max[g] = std::max(row_max[g], s);
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        float sum = 0.0f;
        float* sg = scores.data() + g * len;
        const float top = row_max[g];
#pragma omp simd reduction(+ : sum)
        for (int64_t l = 0; l < len; ++l) {
          sg[l] = std::exp(sg[l] - top);  // vectorized by libmvec (needs -ffast-math)
          sum += sg[l];
        }
        row_sum[g] = sum;
      }
      // Values: each V row read once, accumulated into every query row with its weight.
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t l = 0; l < len; ++l) {
        if (l + kPrefetch < len) prefetch_row(v_pool + slots[start + l + kPrefetch] * row_stride + kh * head_dim, head_dim);
        const T* v_row = v_pool + slots[start + l] * row_stride + kh * head_dim;
        load_row(v_row, kv.data(), head_dim);
        for (int64_t g = 0; g < group; ++g) {
          const float w = scores[g * len + l];
          float* ag = acc.data() + g * head_dim;
#pragma omp simd
          for (int64_t d = 0; d < head_dim; ++d) ag[d] += w * kv[d];
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        const float inv = 1.0f / row_sum[g];
        T* o = out + (b * heads + kh * group + g) * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) o[d] = static_cast<T>(acc[g * head_dim + d] * inv);
        lse[b * heads + kh * group + g] = row_max[g] + std::log(row_sum[g]);
      }
    }
  });
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
  auto out = at::empty_like(q);
  auto lse = at::empty({batch, heads}, q.options().dtype(at::kFloat));
  auto slots_c = slots.contiguous(), indptr_c = indptr.contiguous();
  const float s = static_cast<float>(scale);
  const int64_t group = heads / kv_heads;
  auto run = [&](auto tag) {
    using T = decltype(tag);
    auto args = std::make_tuple(q.data_ptr<T>(), k_pool.data_ptr<T>(), v_pool.data_ptr<T>(),
                                slots_c.data_ptr<int64_t>(), indptr_c.data_ptr<int64_t>(), out.data_ptr<T>(),
                                lse.data_ptr<float>(), batch, kv_heads, group, head_dim, s);
    if (head_dim == 64 && group == 3) std::apply(decode_attention_impl<T, 64, 3>, args);
    else if (head_dim == 64 && group == 4) std::apply(decode_attention_impl<T, 64, 4>, args);
    else if (head_dim == 128 && group == 4) std::apply(decode_attention_impl<T, 128, 4>, args);
    else if (head_dim == 128 && group == 8) std::apply(decode_attention_impl<T, 128, 8>, args);
    else if (head_dim == 64) std::apply(decode_attention_impl<T, 64, 0>, args);
    else if (head_dim == 128) std::apply(decode_attention_impl<T, 128, 0>, args);
    else std::apply(decode_attention_impl<T, 0, 0>, args);
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
