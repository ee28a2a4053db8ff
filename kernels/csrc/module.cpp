// The Python module of our CPU kernels: one registration function per source file.

#include <torch/extension.h>

void register_decode_attention(pybind11::module& m);
void register_elementwise(pybind11::module& m);
void register_quant_gemm(pybind11::module& m);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  register_decode_attention(m);
  register_elementwise(m);
  register_quant_gemm(m);
}
