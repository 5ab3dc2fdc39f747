// The rms_norm kernel (rms_norm_kernel.h) compiled for this file's instruction set.
#include "rms_norm_kernel.h"

namespace llaisys::cpu::LLAISYS_ISA {
void rms_norm(int dtype, int64_t rows, int64_t dim, double eps, void* out, const void* x, const void* weight) {
    rms_norm_kernel(dtype, rows, dim, eps, out, x, weight);
}
}  // namespace llaisys::cpu::LLAISYS_ISA
