// Fused per-token ops of the decoder layer on CPU: (residual add +) RMSNorm, SiLU(gate) * up, and
// the rotary embedding.
//
// Why: in torch each is 3-5 separate ops (casts to fp32 and back, the norm's internals, the
// weight multiply; SiLU then a multiply), each one a dispatch and a pass over memory. At decode
// the dispatch dominates (about a third of a batch-16 step went to such small ops); at prefill
// the passes do. Numerics follow Hugging Face's (and our torch path's) order of rounding: the
// residual sum in the activation dtype, the normalisation in fp32, rounded, then times the weight;
// SiLU rounded to the activation dtype before the multiply.

#include "kernels.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/BFloat16.h>

#include <cmath>
#include <cstring>
#include <vector>

namespace {

inline float widen(float x) { return x; }
inline float widen(c10::BFloat16 x) {
  uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
// Round to the activation dtype and back (round to nearest even, as c10::BFloat16 does).
inline float round_to(float x, float) { return x; }
inline float round_to(float x, c10::BFloat16) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  bits = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
inline void store(float* dst, float x) { *dst = x; }
inline void store(c10::BFloat16* dst, float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  dst->x = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

template <typename T>
void rms_norm_impl(const T* x, const T* residual, const T* weight, T* out, T* residual_out, int64_t rows,
                   int64_t dim, float eps) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> h(dim);
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * dim;
      float sum = 0.0f;
      if (residual != nullptr) {
        const T* rr = residual + r * dim;
        T* ro = residual_out + r * dim;
        for (int64_t i = 0; i < dim; ++i) {
          const float v = round_to(widen(xr[i]) + widen(rr[i]), T{});
          store(ro + i, v);
          h[i] = v;
        }
      } else {
        for (int64_t i = 0; i < dim; ++i) h[i] = widen(xr[i]);
      }
#pragma omp simd reduction(+ : sum)
      for (int64_t i = 0; i < dim; ++i) sum += h[i] * h[i];
      const float inv = 1.0f / std::sqrt(sum / static_cast<float>(dim) + eps);
      T* o = out + r * dim;
      for (int64_t i = 0; i < dim; ++i) store(o + i, round_to(h[i] * inv, T{}) * widen(weight[i]));
    }
  });
}

template <typename T>
void silu_mul_impl(const T* gate_up, T* out, int64_t rows, int64_t inter) {
  at::parallel_for(0, rows, 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* g = gate_up + r * 2 * inter;
      const T* u = g + inter;
      T* o = out + r * inter;
#pragma omp simd
      for (int64_t i = 0; i < inter; ++i) {
        const float a = widen(g[i]);
        const float silu = round_to(a / (1.0f + std::exp(-a)), T{});
        store(o + i, silu * widen(u[i]));
      }
    }
  });
}

// out[t, h] = round(round(x * cos) + rotate_half(x) * sin): HF's rotate_half form, with the sign
// folded into the sin table (sin = [-sin, sin]) as kernels/rotary.py stores it.
template <typename T>
void rotary_impl(const T* x, int64_t row_stride, const T* table, T* out, int64_t tokens, int64_t heads,
                 int64_t dim) {
  const int64_t half = dim / 2;
  at::parallel_for(0, tokens, 8, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const T* c = table + t * 2 * dim;  // the token's row: cos, then the sign-folded sin
      const T* s = c + dim;
      for (int64_t h = 0; h < heads; ++h) {
        const T* xr = x + t * row_stride + h * dim;
        T* o = out + (t * heads + h) * dim;
#pragma omp simd
        for (int64_t i = 0; i < dim; ++i) {
          const float rot = widen(xr[i < half ? i + half : i - half]);
          store(o + i, round_to(widen(xr[i]) * widen(c[i]), T{}) + rot * widen(s[i]));
        }
      }
    }
  });
}

void check_rows(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.dim() == 2 && t.is_contiguous(), what, " must be a contiguous [rows, dim] tensor");
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, what,
              ": fp32 or bf16 only");
}

}  // namespace

namespace radixserve {

// (norm(x + residual) * weight, x + residual), or (norm(x) * weight, x) without a residual.
std::vector<at::Tensor> rms_norm(at::Tensor x, c10::optional<at::Tensor> residual, at::Tensor weight, double eps) {
  check_rows(x, "x");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type() && weight.numel() == x.size(1), "weight [dim], x's dtype");
  auto out = at::empty_like(x);
  at::Tensor summed = x;
  const bool has_residual = residual.has_value();
  if (has_residual) {
    check_rows(*residual, "residual");
    TORCH_CHECK(residual->sizes() == x.sizes() && residual->scalar_type() == x.scalar_type(), "residual like x");
    summed = at::empty_like(x);
  }
  auto w = weight.contiguous();
  const float e = static_cast<float>(eps);
  if (x.scalar_type() == at::kFloat) {
    rms_norm_impl<float>(x.data_ptr<float>(), has_residual ? residual->data_ptr<float>() : nullptr,
                         w.data_ptr<float>(), out.data_ptr<float>(),
                         has_residual ? summed.data_ptr<float>() : nullptr, x.size(0), x.size(1), e);
  } else {
    using bf16 = c10::BFloat16;
    rms_norm_impl<bf16>(x.data_ptr<bf16>(), has_residual ? residual->data_ptr<bf16>() : nullptr,
                        w.data_ptr<bf16>(), out.data_ptr<bf16>(),
                        has_residual ? summed.data_ptr<bf16>() : nullptr, x.size(0), x.size(1), e);
  }
  return {out, summed};
}

// gate_up [rows, 2 * inter] (gate then up) -> SiLU(gate) * up [rows, inter].
at::Tensor silu_mul(at::Tensor gate_up) {
  check_rows(gate_up, "gate_up");
  TORCH_CHECK(gate_up.size(1) % 2 == 0, "gate_up has an odd width");
  const int64_t inter = gate_up.size(1) / 2;
  auto out = at::empty({gate_up.size(0), inter}, gate_up.options());
  if (gate_up.scalar_type() == at::kFloat) {
    silu_mul_impl<float>(gate_up.data_ptr<float>(), out.data_ptr<float>(), gate_up.size(0), inter);
  } else {
    silu_mul_impl<c10::BFloat16>(gate_up.data_ptr<c10::BFloat16>(), out.data_ptr<c10::BFloat16>(),
                                 gate_up.size(0), inter);
  }
  return out;
}

// x [T, H, D] (rows may be strided, e.g. the q/k columns of a fused qkv output), table [T, 2D]
// (each token's cos, then sign-folded sin) -> the rotated x, contiguous [T, H, D].
at::Tensor rotary(at::Tensor x, at::Tensor table) {
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1 && x.stride(1) == x.size(2), "x [T, H, D] with contiguous heads");
  TORCH_CHECK(table.dim() == 2 && table.is_contiguous() && table.size(0) == x.size(0) &&
              table.size(1) == 2 * x.size(2) && x.size(2) % 2 == 0, "table [T, 2 * D], contiguous");
  TORCH_CHECK(table.scalar_type() == x.scalar_type(), "x and the table share a dtype");
  auto out = at::empty({x.size(0), x.size(1), x.size(2)}, x.options());
  if (x.scalar_type() == at::kFloat) {
    rotary_impl<float>(x.data_ptr<float>(), x.stride(0), table.data_ptr<float>(), out.data_ptr<float>(),
                       x.size(0), x.size(1), x.size(2));
  } else {
    TORCH_CHECK(x.scalar_type() == at::kBFloat16, "fp32 or bf16 only");
    using bf16 = c10::BFloat16;
    rotary_impl<bf16>(x.data_ptr<bf16>(), x.stride(0), table.data_ptr<bf16>(), out.data_ptr<bf16>(), x.size(0),
                      x.size(1), x.size(2));
  }
  return out;
}

}  // namespace radixserve
