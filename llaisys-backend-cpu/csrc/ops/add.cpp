// add: c = a + b (same shape and dtype, contiguous). Portable path and the exported entry point,
// which picks the AVX-512 / AVX2 / portable build of add_kernel.h at run time.
#include "add_kernel.h"

namespace llaisys::cpu::portable {
void add(int dtype, int64_t n, void* c, const void* a, const void* b) { add_kernel(dtype, n, c, a, b); }
}  // namespace llaisys::cpu::portable

int LLAISYS_FN(add)(int device, void* stream, int dtype, int64_t n, void* c, const void* a,
                                   const void* b) {
    (void)device; (void)stream;
    return llaisys::guard("add", [&] {
        llaisys::cpu::require_float_dtype(dtype);
        LLAISYS_CALL_PER_ISA(add, dtype, n, c, a, b);
    });
}
