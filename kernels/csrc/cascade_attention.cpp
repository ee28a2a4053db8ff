// Decode attention for rows that share a KV prefix (a cached system prompt, an agent's history,
// a benchmark's shared prefix): the prefix once for all rows, then each row's own tokens, merged.
//
// Why: reading the shared prefix per row (decode_attention.cpp) streams the same K/V rows once
// per row with only the row's `group` query heads to use them: 16 rows over a 1024-token prefix
// took about 550 us a layer. Here all rows of a KV head meet the prefix together, as the tiles of
// query rows of prefill_attention.cpp (shared_prefix_attention), and each row's own tokens go
// through decode_attention; the parts are merged by their log-sum-exps (FlashInfer's
// merge_state): out = sum_i e^(lse_i - top) out_i / sum_i e^(lse_i - top).
//
// q [B, H, D]; shared_slots [P] the KV slots every row has first; slots / indptr each row's own
// slots after them (decode_attention.cpp's layout; at least one each: its newest token). Out
// [B, H, D] in q's dtype. The own part arrives rounded to q's dtype (decode_attention's output),
// the prefix parts in fp32; the merge is fp32.

#include "kernels.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

template <typename T>
void merge(const T* own, const float* own_lse, const float* parts, const float* part_lse, int64_t chunks,
           int64_t rows, int64_t head_dim, T* out) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(static_cast<size_t>(head_dim));
    for (int64_t r = begin; r < end; ++r) {
      float top = own_lse[r];
      for (int64_t c = 0; c < chunks; ++c) top = std::max(top, part_lse[c * rows + r]);
      float total = std::exp(own_lse[r] - top);
      for (int64_t d = 0; d < head_dim; ++d) acc[d] = total * static_cast<float>(own[r * head_dim + d]);
      for (int64_t c = 0; c < chunks; ++c) {
        const float w = std::exp(part_lse[c * rows + r] - top);
        const float* p = parts + (c * rows + r) * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) acc[d] += w * p[d];
        total += w;
      }
      const float inv = 1.0f / total;
      for (int64_t d = 0; d < head_dim; ++d) out[r * head_dim + d] = static_cast<T>(acc[d] * inv);
    }
  });
}

}  // namespace

namespace radixserve {

at::Tensor cascade_attention(at::Tensor q, at::Tensor k_pool, at::Tensor v_pool, at::Tensor shared_slots,
                             at::Tensor slots, at::Tensor indptr, double scale) {
  const std::vector<at::Tensor> shared = shared_prefix_attention(q, k_pool, v_pool, shared_slots, scale);
  const std::vector<at::Tensor> own = decode_attention(q, k_pool, v_pool, slots, indptr, scale);
  at::Tensor out = at::empty_like(q);
  const int64_t chunks = shared[0].size(0), rows = q.size(0) * q.size(1), head_dim = q.size(2);
  const float* part = shared[0].data_ptr<float>();
  const float* part_lse = shared[1].data_ptr<float>();
  const float* own_lse = own[1].data_ptr<float>();
  if (q.scalar_type() == at::kFloat) {
    merge(own[0].data_ptr<float>(), own_lse, part, part_lse, chunks, rows, head_dim, out.data_ptr<float>());
  } else {
    merge(own[0].data_ptr<c10::BFloat16>(), own_lse, part, part_lse, chunks, rows, head_dim,
          out.data_ptr<c10::BFloat16>());
  }
  return out;
}

}  // namespace radixserve
