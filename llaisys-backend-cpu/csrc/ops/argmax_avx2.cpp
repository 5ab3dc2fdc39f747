// The argmax kernel (argmax_kernel.h) compiled for this file's instruction set.
#include "argmax_kernel.h"

namespace llaisys::cpu::LLAISYS_ISA {
int64_t argmax(int dtype, int64_t n, const void* vals) { return argmax_kernel(dtype, n, vals); }
}  // namespace llaisys::cpu::LLAISYS_ISA
