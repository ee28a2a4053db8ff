// Paged causal prefill (extend) attention on CPU: each request's new query rows attend to its KV
// slots straight from the pool, with no gather copy, no score matrix and no mask tensor.
//
// Why: the torch path gathers every request's K/V per layer, computes the whole [rows, keys]
// score matrix (half of it masked away), adds a mask and runs a softmax over it in memory. Here
// a tile of query rows walks its visible keys in blocks with an online (flash-style) softmax,
// so only the causal half is computed and the scores of one block stay in L1.
//
// Layout: q [T, H, D]; k_pool, v_pool [S, KVH, D] (one layer of the pool, contiguous); slots
// int64 [N]; request b's query rows are q[q_indptr[b] : q_indptr[b+1]] (n_b rows) and its KV
// slots slots[kv_indptr[b] : kv_indptr[b+1]] (L_b >= n_b: the first L_b - n_b are its cached
// prefix); its row j sees keys 0 .. L_b - n_b + j (with a sliding `window` > 0, only the last
// `window` of them: keys p with q - window < p <= q, Hugging Face's convention). A request with no KV slots is skipped and its
// rows of `out` are left as they are (a mixed batch attends to short extends as decode rows).
// H = KVH * group, D 64 or 128, group 1 to 8; fp32 or bf16 (the pool's dtype must match q's),
// fp32 scores and accumulation; out [T, H, D] in q's dtype.
//
// A tile is kRows query rows (kRows / group positions times the group's heads: every K/V row
// loaded serves all of them). Its rows are the vector lanes (vec8.h): scores are kept as
// S^T [keys, rows] and the output as O^T [D, rows], so both products are broadcast-FMA loops
// (c[x][rows] += a[x][k] * b[k][rows]) with no horizontal sums, and the softmax's running max,
// sum and rescale are per-lane vector operations. Where the CPU has AVX-512 BF16 (a -march=native
// build on Zen 4), both products of a bf16 pool take vdpbf16ps instead: the scores from q and K
// as they are, P.V from P rounded to bf16 (as the torch path's softmax output is) and V's rows
// interleaved by pairs (together they took 35-45% off the kernel's time with fp32 FMAs,
// scripts/bench_prefill_attention.py).

#include "kernels.h"
#include "vec8.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

// vdpbf16ps multiplies bf16 pairs exactly and adds them to fp32 lanes: twice the FMA's rate for
// the scores of a bf16 pool (q and K are bf16 already, so nothing is rounded).
#if defined(__AVX512BF16__) && defined(__AVX512VL__)
#define RS_BF16_DOT 1
#else
#define RS_BF16_DOT 0
#endif

namespace {

using namespace radixserve::vec8;

constexpr int64_t kRowVecs = 6;              // vectors of query rows per tile
constexpr int64_t kRows = kRowVecs * W;      // query rows per tile
constexpr int64_t kKeys = 32;                // keys per block of the online softmax
#ifdef __AVX512F__
constexpr int64_t kX = 4;  // 32 registers: 4 x 6 accumulators, 6 loaded rows, 1 broadcast
#else
constexpr int64_t kX = 2;  // 16 registers: 2 x 6 accumulators and a broadcast; rows from memory
#endif
constexpr float kLowest = std::numeric_limits<float>::lowest();  // -ffast-math: no infinities
// exp() arguments are clamped here: libmvec's vector exp hands every lane that underflows to the
// scalar expf and its error path, and every masked score would take it (profiles showed the
// scalar calls). A masked key then weighs e^-80 (1.8e-35), nothing next to the row's sum (>= 1).
constexpr float kExpFloor = -80.0f;
alignas(64) constexpr float kZeroRow[kRows] = {};  // P^T's row for a key past the block's last

// c[x][:] (+)= sum_k a[x * ax + k * ak] * b[k * kRows + :] for x < X, kRows lanes; c rows kRows apart.
template <int64_t X>
inline void mul_rows(const float* a, int64_t ax, int64_t ak, const float* b, int64_t kn, float* c, bool add) {
  vf acc[X][kRowVecs] = {};
  for (int64_t k = 0; k < kn; ++k) {
    vf bv[kRowVecs];
    for (int64_t v = 0; v < kRowVecs; ++v) bv[v] = load8(b + k * kRows + v * W);
    for (int64_t x = 0; x < X; ++x) {
      const vf s = vf{} + a[x * ax + k * ak];
      for (int64_t v = 0; v < kRowVecs; ++v) acc[x][v] += s * bv[v];
    }
  }
  for (int64_t x = 0; x < X; ++x)
    for (int64_t v = 0; v < kRowVecs; ++v) {
      float* p = c + x * kRows + v * W;
      store8(p, add ? acc[x][v] + load8(p) : acc[x][v]);
    }
}

#if RS_BF16_DOT
// c[x][:] (+)= scale * sum_i a[x * ax + i * ai] . b[i * kRows + :], each a 32-bit pair of bf16.
template <int64_t X>
inline void dot_rows_bf16(const uint32_t* a, int64_t ax, int64_t ai, const uint32_t* b, int64_t kn, float* c,
                          float scale, bool add) {
  __m256 acc[X][kRowVecs] = {};
  for (int64_t i = 0; i < kn; ++i) {
    __m256bh bv[kRowVecs];
    for (int64_t v = 0; v < kRowVecs; ++v)
      bv[v] = (__m256bh)_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i * kRows + v * W));
    for (int64_t x = 0; x < X; ++x) {
      const __m256bh s = (__m256bh)_mm256_set1_epi32(static_cast<int>(a[x * ax + i * ai]));
      for (int64_t v = 0; v < kRowVecs; ++v) acc[x][v] = _mm256_dpbf16_ps(acc[x][v], bv[v], s);
    }
  }
  for (int64_t x = 0; x < X; ++x)
    for (int64_t v = 0; v < kRowVecs; ++v) {
      float* p = c + x * kRows + v * W;
      const __m256 r = acc[x][v] * scale;
      _mm256_storeu_ps(p, add ? _mm256_add_ps(r, _mm256_loadu_ps(p)) : r);
    }
}

// P^T's rows 2i and 2i+1 (fp32, kRows lanes each) as kRows bf16 pairs, rounded to nearest even.
inline void pack_pairs(const float* p0, const float* p1, uint32_t* out) {
  for (int64_t v = 0; v < kRowVecs; ++v) {
    const __m128i a = (__m128i)_mm256_cvtneps_pbh(_mm256_loadu_ps(p0 + v * W));
    const __m128i b = (__m128i)_mm256_cvtneps_pbh(_mm256_loadu_ps(p1 + v * W));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + v * W), _mm_unpacklo_epi16(a, b));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + v * W + 4), _mm_unpackhi_epi16(a, b));
  }
}
#else
template <int64_t X>  // declared for the branch that the build without it discards, never defined
void dot_rows_bf16(const uint32_t* a, int64_t ax, int64_t ai, const uint32_t* b, int64_t kn, float* c, float scale,
                   bool add);
void pack_pairs(const float* p0, const float* p1, uint32_t* out);
#endif

// One thread's scratch, reused by its tiles (about 60 KB at D 64: within L2, mostly L1).
template <int64_t D>
struct Scratch {
  alignas(64) float qt[D * kRows];      // Q^T, scaled; zero lanes past the tile's rows
  alignas(64) float ot[D * kRows];      // O^T, unnormalized
  alignas(64) float kb[kKeys * D];      // a block of K rows, widened
  alignas(64) float vb[kKeys * D];      // and of V rows
  alignas(64) float st[kKeys * kRows];  // S^T, then P^T
  float row_max[kRows], row_sum[kRows], alpha[kRows];
  int64_t last_key[kRows];              // the last key each row sees
  int64_t first_key[kRows];             // and the first (0 without a window)
  alignas(64) uint32_t qp[D / 2 * kRows];  // with vdpbf16ps: Q^T in bf16 pairs, unscaled
  alignas(64) uint32_t kp[kKeys * D / 2];  // and the K rows as they are
  alignas(64) uint32_t vp[kKeys / 2 * D];  // and V's rows 2i and 2i+1 interleaved: pair (i, d) at i * D + d
  alignas(64) uint32_t pp[kKeys / 2 * kRows];  // and P^T in bf16 pairs of keys
};

// One tile: the query rows j0 .. j0 + m - 1 of one request and one KV head.
template <typename T, int64_t D, int64_t G>
struct Tile {
  static constexpr bool kDot = RS_BF16_DOT && std::is_same_v<T, c10::BFloat16>;
  const T* q;       // the request's first query row, at this KV head's first head
  const T* k_base;  // this KV head's column of the pool
  const T* v_base;
  const int64_t* slots;
  T* out;           // like q
  int64_t row_stride, q_stride;  // between slots of the pool; between query rows (H * D)
  int64_t prefix, j0, m;
  float scale;
  // Without a causal mask (shared_prefix_attention): every row sees keys key_begin .. key_end-1,
  // and run() leaves the result in the scratch for store_partial(). Causal: keys from 0.
  bool causal = true;
  int64_t key_begin = 0, key_end = 0;
  int64_t window = 0;  // causal only: a row sees its last `window` keys (0: all)

  void run(Scratch<D>& s) const {
    compute(s);
    const int64_t rows = m * G;
    for (int64_t r = 0; r < rows; ++r) {
      const float inv = 1.0f / s.row_sum[r];
      T* o = out + (j0 + r / G) * q_stride + (r % G) * D;
      for (int64_t d = 0; d < D; ++d) o[d] = static_cast<T>(s.ot[d * kRows + r] * inv);
    }
  }

  // The normalized output in fp32 and the log-sum-exp of each row, laid out like q: o_part [.., H, D],
  // lse_part [.., H] (this KV head's first head at o_part and lse_part).
  void store_partial(const Scratch<D>& s, float* o_part, float* lse_part) const {
    const int64_t heads = q_stride / D;
    for (int64_t r = 0; r < m * G; ++r) {
      const float inv = 1.0f / s.row_sum[r];
      float* o = o_part + (j0 + r / G) * q_stride + (r % G) * D;
      for (int64_t d = 0; d < D; ++d) o[d] = s.ot[d * kRows + r] * inv;
      lse_part[(j0 + r / G) * heads + r % G] = s.row_max[r] + std::log(s.row_sum[r]);
    }
  }

  void compute(Scratch<D>& s) const {
    const int64_t rows = m * G;
    // Keys begin .. end-1; the causal mask applies from key `first` on (never without it).
    // With a window, keys before `windowed` are masked for some rows, and none before `lo` is seen.
    // Blocks start at multiples of kKeys however the rows are tiled (as without a window): a row's
    // sums then do not depend on how its prompt was chunked (batch invariance).
    const bool windowed_tile = causal && window > 0;
    const int64_t lo = windowed_tile ? std::max<int64_t>(0, prefix + j0 - window + 1) / kKeys * kKeys : 0;
    const int64_t begin = causal ? lo : key_begin, end = causal ? prefix + j0 + m : key_end;
    const int64_t first = causal ? prefix + j0 : end;
    const int64_t windowed = windowed_tile ? std::max<int64_t>(0, prefix + j0 + m - window) : 0;
    for (int64_t r = 0; r < kRows; ++r) {
      const int64_t pos = std::min(r / G, m - 1);  // padding lanes copy the last row's limit
      s.last_key[r] = causal ? prefix + j0 + pos : end - 1;
      s.first_key[r] = windowed_tile ? std::max<int64_t>(0, prefix + j0 + pos - window + 1) : 0;
      s.row_max[r] = kLowest;
      s.row_sum[r] = 0.0f;
      const T* qr = q + (j0 + pos) * q_stride + (r % G) * D;
      if constexpr (kDot) load_pairs(s, r, r < rows ? qr : nullptr);
      else for (int64_t d = 0; d < D; ++d) s.qt[d * kRows + r] = r < rows ? static_cast<float>(qr[d]) * scale : 0.0f;
    }
    std::fill(s.ot, s.ot + D * kRows, 0.0f);
    for (int64_t l0 = begin; l0 < end; l0 += kKeys) {
      const int64_t n = std::min(kKeys, end - l0);
      load_block(s, l0, n, end);
      score_block(s, n);
      if (l0 + n - 1 > first || l0 < windowed) mask(s, l0, n);
      softmax_step(s, n);
      value_block(s, n);
    }
  }

  // S^T = K_block Q^T for the block's n keys.
  void score_block(Scratch<D>& s, int64_t n) const {
    if constexpr (kDot) {
      constexpr int64_t P = D / 2;
      for (int64_t l = 0; l < n; l += kX) {
        if (l + kX <= n) dot_rows_bf16<kX>(s.kp + l * P, P, 1, s.qp, P, s.st + l * kRows, scale, false);
        else for (int64_t x = l; x < n; ++x) dot_rows_bf16<1>(s.kp + x * P, P, 1, s.qp, P, s.st + x * kRows, scale, false);
      }
      return;
    }
    for (int64_t l = 0; l < n; l += kX) {
      if (l + kX <= n) mul_rows<kX>(s.kb + l * D, D, 1, s.qt, D, s.st + l * kRows, false);
      else for (int64_t x = l; x < n; ++x) mul_rows<1>(s.kb + x * D, D, 1, s.qt, D, s.st + x * kRows, false);
    }
  }

  // O^T += V_block^T P^T. With vdpbf16ps, P is rounded to bf16 first (as the torch path's bf16
  // softmax output is) and pairs of keys meet pairs of V rows: half the instructions.
  void value_block(Scratch<D>& s, int64_t n) const {
    if constexpr (kDot) {
      const int64_t pairs = (n + 1) / 2;
      for (int64_t i = 0; i < pairs; ++i) {
        if (2 * i + 1 < n) pack_pairs(s.st + 2 * i * kRows, s.st + (2 * i + 1) * kRows, s.pp + i * kRows);
        else pack_pairs(s.st + 2 * i * kRows, kZeroRow, s.pp + i * kRows);  // odd n: the last key alone
      }
      for (int64_t d = 0; d < D; d += kX) dot_rows_bf16<kX>(s.vp + d, 1, D, s.pp, pairs, s.ot + d * kRows, 1.0f, true);
      return;
    }
    for (int64_t d = 0; d < D; d += kX) mul_rows<kX>(s.vb + d, 1, D, s.st, n, s.ot + d * kRows, true);
  }

  // Query row r's bf16 pairs into lane r of Q^T (zeros for a padding lane: qr null).
  static void load_pairs(Scratch<D>& s, int64_t r, const T* qr) {
    for (int64_t i = 0; i < D / 2; ++i) {
      uint32_t pair = 0;
      if (qr != nullptr) std::memcpy(&pair, qr + 2 * i, sizeof pair);
      s.qp[i * kRows + r] = pair;
    }
  }

  // Widen keys l0 .. l0+n-1 into the block buffers (with vdpbf16ps: K as it is, V's rows
  // interleaved by pairs), prefetching the next block's rows.
  void load_block(Scratch<D>& s, int64_t l0, int64_t n, int64_t end) const {
    for (int64_t l = 0; l < n; ++l) {
      const int64_t ahead = l0 + kKeys + l;
      if (ahead < end) {
        prefetch_row(k_base + slots[ahead] * row_stride, D);
        prefetch_row(v_base + slots[ahead] * row_stride, D);
      }
      const T* k = k_base + slots[l0 + l] * row_stride;
      if constexpr (kDot) {
        std::memcpy(s.kp + l * D / 2, k, D * sizeof(T));
      } else {
        const T* v = v_base + slots[l0 + l] * row_stride;
        for (int64_t c = 0; c < D; c += W) store8(s.vb + l * D + c, load8(v + c));
        for (int64_t c = 0; c < D; c += W) store8(s.kb + l * D + c, load8(k + c));
      }
    }
    if constexpr (kDot) {
      static const T kZeros[D] = {};  // the odd block's last pair: a key that is not there
      for (int64_t l = 0; l < n; l += 2) {
        const T* v0 = v_base + slots[l0 + l] * row_stride;
        const T* v1 = l + 1 < n ? v_base + slots[l0 + l + 1] * row_stride : kZeros;
        uint32_t* pairs = s.vp + l / 2 * D;
        for (int64_t d = 0; d < D; d += 8) {  // 8 values of each row -> 8 pairs
          const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v0 + d));
          const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v1 + d));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(pairs + d), _mm_unpacklo_epi16(a, b));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(pairs + d + 4), _mm_unpackhi_epi16(a, b));
        }
      }
    }
  }

  // Keys past a row's last key, or before its first, score kLowest (their weight is 0).
  static void mask(Scratch<D>& s, int64_t l0, int64_t n) {
    for (int64_t l = 0; l < n; ++l)
      for (int64_t r = 0; r < kRows; ++r)
        if (l0 + l > s.last_key[r] || l0 + l < s.first_key[r]) s.st[l * kRows + r] = kLowest;
  }

  // The online softmax over one block: new running max, P^T = exp(S^T - max) in place, the
  // running sum and O^T rescaled by exp(old max - new max). A masked key weighs exp(kExpFloor)
  // against the row's max: nothing, once the row has seen a key. With a window a row may see no
  // key of a whole block: its weights there are zeroed (against a max of kLowest a masked key
  // would weigh 1) and its max reset, so it is left exactly as before the block.
  static void zero_unseen(Scratch<D>& s, int64_t n, const bool* unseen) {
    for (int64_t r = 0; r < kRows; ++r) {
      if (!unseen[r]) continue;
      s.row_max[r] = kLowest;  // as if this block had not been there (the next block's max is its own)
      s.row_sum[r] = 0.0f;
      for (int64_t l = 0; l < n; ++l) s.st[l * kRows + r] = 0.0f;
    }
  }

  static void softmax_step(Scratch<D>& s, int64_t n) {
    float top[kRows];
    std::copy(s.row_max, s.row_max + kRows, top);
    for (int64_t l = 0; l < n; ++l)
#pragma omp simd
      for (int64_t r = 0; r < kRows; ++r) top[r] = std::max(top[r], s.st[l * kRows + r]);
    bool unseen[kRows], any_unseen = false;  // rows that have seen no key yet (windows only)
    for (int64_t r = 0; r < kRows; ++r) {
      unseen[r] = top[r] == kLowest;
      if (unseen[r]) top[r] = 0.0f, any_unseen = true;
    }
#pragma omp simd
    for (int64_t r = 0; r < kRows; ++r) {
      s.alpha[r] = std::exp(std::max(s.row_max[r] - top[r], kExpFloor));  // vectorized by libmvec (needs -ffast-math)
      s.row_max[r] = top[r];
      s.row_sum[r] *= s.alpha[r];
    }
    for (int64_t l = 0; l < n; ++l)
#pragma omp simd
      for (int64_t r = 0; r < kRows; ++r) {
        const float p = std::exp(std::max(s.st[l * kRows + r] - top[r], kExpFloor));
        s.st[l * kRows + r] = p;
        s.row_sum[r] += p;
      }
    if (any_unseen) zero_unseen(s, n, unseen);
    for (int64_t d = 0; d < D; ++d)
#pragma omp simd
      for (int64_t r = 0; r < kRows; ++r) s.ot[d * kRows + r] *= s.alpha[r];
  }
};

struct Item {
  int64_t b, kh, j0, keys;
};

template <typename T, int64_t D, int64_t G>
void prefill_attention_impl(const T* q, const T* k_pool, const T* v_pool, const int64_t* slots,
                            const int64_t* q_indptr, const int64_t* kv_indptr, T* out, int64_t batch,
                            int64_t kv_heads, float scale, int64_t window) {
  constexpr int64_t M = kRows / G;  // query positions per tile
  const int64_t heads = kv_heads * G;
  // Items run longest first, taken one at a time by whichever thread is free: the costs are
  // uneven (a tile's cost is its last key) and the KV heads (3 in the default model) do not
  // divide among 2 threads, so a static split would leave one thread idle.
  std::vector<Item> items;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t n = q_indptr[b + 1] - q_indptr[b], len = kv_indptr[b + 1] - kv_indptr[b];
    if (len == 0) continue;
    for (int64_t j0 = 0; j0 < n; j0 += M)
      for (int64_t kh = 0; kh < kv_heads; ++kh) items.push_back({b, kh, j0, len - n + std::min(j0 + M, n)});
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& x, const Item& y) { return x.keys > y.keys; });
  std::atomic<size_t> next{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    std::vector<Scratch<D>> scratch(1);  // on the heap: a thread's stack may be small
    for (size_t i = next++; i < items.size(); i = next++) {
      const Item& it = items[i];
      const int64_t n = q_indptr[it.b + 1] - q_indptr[it.b], len = kv_indptr[it.b + 1] - kv_indptr[it.b];
      const int64_t q_off = q_indptr[it.b] * heads * D + it.kh * G * D;
      Tile<T, D, G> tile{q + q_off, k_pool + it.kh * D, v_pool + it.kh * D, slots + kv_indptr[it.b],
                         out + q_off, kv_heads * D, heads * D, len - n, it.j0, std::min(M, n - it.j0), scale};
      tile.window = window;
      tile.run(scratch[0]);
    }
  });
}

// Decode rows whose first `keys` KV slots are the same (a cached prefix they share; the cascade of
// kernels/decode_attention.py): the rows of a KV head meet those keys as tiles of query rows with
// no mask, so each key row loaded serves every row that shares it. 16 decode rows of 3 heads are
// one tile per KV head, too few for the threads: the keys are split into `chunks` parts as well,
// each part's result kept apart in part_out [chunks, B, H, D] and part_lse [chunks, B, H] for the
// caller to merge.
template <typename T, int64_t D, int64_t G>
void shared_prefix_impl(const T* q, const T* k_pool, const T* v_pool, const int64_t* slots, int64_t keys,
                        int64_t batch, int64_t kv_heads, float scale, int64_t chunks, float* part_out,
                        float* part_lse) {
  constexpr int64_t M = kRows / G;  // decode rows per tile
  const int64_t heads = kv_heads * G, per_chunk = (keys + chunks - 1) / chunks;
  std::vector<Item> items;  // Item.b: the chunk
  for (int64_t c = 0; c < chunks; ++c)
    for (int64_t j0 = 0; j0 < batch; j0 += M)
      for (int64_t kh = 0; kh < kv_heads; ++kh) items.push_back({c, kh, j0, 0});
  std::atomic<size_t> next{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    std::vector<Scratch<D>> scratch(1);
    for (size_t i = next++; i < items.size(); i = next++) {
      const Item& it = items[i];
      const int64_t begin = it.b * per_chunk;
      const Tile<T, D, G> tile{q + it.kh * G * D, k_pool + it.kh * D, v_pool + it.kh * D, slots, nullptr,
                               kv_heads * D, heads * D, 0, it.j0, std::min(M, batch - it.j0), scale, false, begin,
                               std::min(keys, begin + per_chunk)};
      tile.compute(scratch[0]);
      tile.store_partial(scratch[0], part_out + it.b * batch * heads * D + it.kh * G * D,
                         part_lse + it.b * batch * heads + it.kh * G);
    }
  });
}

template <typename T, int64_t D>
void dispatch_group(int64_t group, const T* q, const T* k, const T* v, const int64_t* slots, const int64_t* q_indptr,
                    const int64_t* kv_indptr, T* out, int64_t batch, int64_t kv_heads, float scale, int64_t window) {
  switch (group) {
#define RS_GROUP(G) \
  case G:                                                                                                        \
    return prefill_attention_impl<T, D, G>(q, k, v, slots, q_indptr, kv_indptr, out, batch, kv_heads, scale, window);
    RS_GROUP(1) RS_GROUP(2) RS_GROUP(3) RS_GROUP(4) RS_GROUP(5) RS_GROUP(6) RS_GROUP(7) RS_GROUP(8)
#undef RS_GROUP
  }
  TORCH_CHECK(false, "prefill_attention: query heads per KV head must be 1 to 8, got ", group);
}

}  // namespace

namespace radixserve {

void prefill_attention(at::Tensor q, at::Tensor k_pool, at::Tensor v_pool, at::Tensor slots, at::Tensor q_indptr,
                       at::Tensor kv_indptr, double scale, at::Tensor out, int64_t window) {
  TORCH_CHECK(window >= 0, "prefill_attention: window must be >= 0 (0: none)");
  TORCH_CHECK(q.dim() == 3 && k_pool.dim() == 3 && v_pool.dim() == 3, "q [T,H,D], pools [S,KVH,D]");
  TORCH_CHECK(q.is_contiguous() && k_pool.is_contiguous() && v_pool.is_contiguous() && out.is_contiguous(),
              "contiguous inputs");
  TORCH_CHECK(k_pool.scalar_type() == q.scalar_type() && v_pool.scalar_type() == q.scalar_type() &&
              out.scalar_type() == q.scalar_type(), "q, the pool and out must share a dtype");
  TORCH_CHECK(slots.scalar_type() == at::kLong && q_indptr.scalar_type() == at::kLong &&
              kv_indptr.scalar_type() == at::kLong, "int64 indices");
  const int64_t heads = q.size(1), head_dim = q.size(2), kv_heads = k_pool.size(1), batch = q_indptr.numel() - 1;
  TORCH_CHECK(heads % kv_heads == 0 && k_pool.size(2) == head_dim && out.sizes() == q.sizes() &&
              kv_indptr.numel() == batch + 1, "shapes");
  const int64_t group = heads / kv_heads;
  // kernels/decode_attention.py kernel_supports() says the same.
  TORCH_CHECK((head_dim == 64 || head_dim == 128) && group >= 1 && group <= 8, "prefill_attention: head_dim 64 or "
              "128 and 1 to 8 query heads per KV head, got ", head_dim, " and ", group);
  auto slots_c = slots.contiguous(), qi = q_indptr.contiguous(), kvi = kv_indptr.contiguous();
  const int64_t *qp = qi.data_ptr<int64_t>(), *kp = kvi.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t n = qp[b + 1] - qp[b], len = kp[b + 1] - kp[b];
    TORCH_CHECK(n >= 0 && (len == 0 || len >= n) && qp[b + 1] <= q.size(0) && kp[b + 1] <= slots.numel(),
                "prefill_attention: request ", b, " has ", n, " query rows and ", len, " KV slots");
  }
  const float s = static_cast<float>(scale);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    auto call = head_dim == 64 ? dispatch_group<T, 64> : dispatch_group<T, 128>;
    call(group, q.data_ptr<T>(), k_pool.data_ptr<T>(), v_pool.data_ptr<T>(), slots_c.data_ptr<int64_t>(), qp, kp,
         out.data_ptr<T>(), batch, kv_heads, s, window);
  };
  if (q.scalar_type() == at::kFloat) {
    run(float{});
  } else {
    TORCH_CHECK(q.scalar_type() == at::kBFloat16, "fp32 or bf16 only");
    run(c10::BFloat16{});
  }
}

// Returns (part_out [chunks, B, H, D] fp32, part_lse [chunks, B, H] fp32): q [B, H, D] against the
// KV slots `slots` [keys] that every row shares, each chunk of the keys apart.
std::vector<at::Tensor> shared_prefix_attention(at::Tensor q, at::Tensor k_pool, at::Tensor v_pool, at::Tensor slots,
                                                double scale) {
  TORCH_CHECK(q.dim() == 3 && k_pool.dim() == 3 && v_pool.dim() == 3, "q [B,H,D], pools [S,KVH,D]");
  TORCH_CHECK(q.is_contiguous() && k_pool.is_contiguous() && v_pool.is_contiguous(), "contiguous inputs");
  TORCH_CHECK(k_pool.scalar_type() == q.scalar_type() && v_pool.scalar_type() == q.scalar_type(),
              "q and the pool must share a dtype");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.numel() > 0, "int64 shared slots, at least one");
  const int64_t batch = q.size(0), heads = q.size(1), head_dim = q.size(2), kv_heads = k_pool.size(1);
  const int64_t keys = slots.numel(), group = heads / kv_heads;
  TORCH_CHECK(heads % kv_heads == 0 && k_pool.size(2) == head_dim, "shapes");
  TORCH_CHECK((head_dim == 64 || head_dim == 128) && group >= 1 && group <= 8, "shared_prefix_attention: head_dim "
              "64 or 128 and 1 to 8 query heads per KV head, got ", head_dim, " and ", group);
  // About 6 items per thread (so that they even out), each at least 128 keys.
  const int64_t tiles = kv_heads * ((batch * group + kRows - 1) / kRows);
  const int64_t wanted = (6 * at::get_num_threads() + tiles - 1) / tiles;
  const int64_t parts = std::clamp<int64_t>(wanted, 1, (keys + 127) / 128);
  const int64_t per_chunk = (keys + parts - 1) / parts;
  const int64_t chunks = (keys + per_chunk - 1) / per_chunk;  // none empty
  at::Tensor part_out = at::empty({chunks, batch, heads, head_dim}, q.options().dtype(at::kFloat));
  at::Tensor part_lse = at::empty({chunks, batch, heads}, q.options().dtype(at::kFloat));
  const at::Tensor slots_c = slots.contiguous();
  const float s = static_cast<float>(scale);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    auto call = [&](auto d_tag, auto g_tag) {
      shared_prefix_impl<T, decltype(d_tag)::value, decltype(g_tag)::value>(
          q.data_ptr<T>(), k_pool.data_ptr<T>(), v_pool.data_ptr<T>(), slots_c.data_ptr<int64_t>(), keys, batch,
          kv_heads, s, chunks, part_out.data_ptr<float>(), part_lse.data_ptr<float>());
    };
    auto by_group = [&](auto d_tag) {
      switch (group) {
#define RS_GROUP(G) \
  case G: return call(d_tag, std::integral_constant<int64_t, G>{});
        RS_GROUP(1) RS_GROUP(2) RS_GROUP(3) RS_GROUP(4) RS_GROUP(5) RS_GROUP(6) RS_GROUP(7) RS_GROUP(8)
#undef RS_GROUP
      }
    };
    if (head_dim == 64) by_group(std::integral_constant<int64_t, 64>{});
    else by_group(std::integral_constant<int64_t, 128>{});
  };
  if (q.scalar_type() == at::kFloat) {
    run(float{});
  } else {
    TORCH_CHECK(q.scalar_type() == at::kBFloat16, "fp32 or bf16 only");
    run(c10::BFloat16{});
  }
  return {part_out, part_lse};
}

}  // namespace radixserve
