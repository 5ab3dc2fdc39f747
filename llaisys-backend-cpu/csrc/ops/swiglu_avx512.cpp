// The swiglu kernel (swiglu_kernel.h) compiled for this file's instruction set.
#include "swiglu_kernel.h"

namespace llaisys::cpu::LLAISYS_ISA {
void swiglu(int dtype, int64_t n, void* out, const void* gate, const void* up) { swiglu_kernel(dtype, n, out, gate, up); }
}  // namespace llaisys::cpu::LLAISYS_ISA
