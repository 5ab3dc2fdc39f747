// The add kernel (add_kernel.h) compiled for this file's instruction set.
#include "add_kernel.h"

namespace llaisys::cpu::LLAISYS_ISA {
void add(int dtype, int64_t n, void* c, const void* a, const void* b) { add_kernel(dtype, n, c, a, b); }
}  // namespace llaisys::cpu::LLAISYS_ISA
