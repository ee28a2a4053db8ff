// The quant GEMM's AVX-512 VNNI variant (vpdpbusd), compiled with -march=x86-64-v4 -mavx512vnni
// alone whatever the build's -march (kernels/cpu_ext.py SOURCES); run only where the CPU has them
// (runtime/execution/device.py block_kernel_isa).

#define RS_VARIANT avx512
#define RS_VNNI 1
#include "quant_gemm_groups.h"
