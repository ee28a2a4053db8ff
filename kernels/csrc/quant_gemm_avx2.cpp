// The quant GEMM's AVX2 variant (u8 x s8 products through maddubs + madd), compiled with
// -march=x86-64-v3 alone whatever the build's -march (kernels/cpu_ext.py SOURCES), so it runs on
// every CPU with AVX2 and FMA and holds no AVX-512 instruction.

#define RS_VARIANT avx2
#define RS_VNNI 0
#include "quant_gemm_groups.h"
