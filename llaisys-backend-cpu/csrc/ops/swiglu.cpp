// swiglu: out = up * gate / (1 + exp(-gate)) (same shape and dtype, contiguous). Portable path and the
// exported entry point, which picks the AVX-512 / AVX2 / portable build of swiglu_kernel.h at run time.
#include "swiglu_kernel.h"

namespace llaisys::cpu::portable {
void swiglu(int dtype, int64_t n, void* out, const void* gate, const void* up) { swiglu_kernel(dtype, n, out, gate, up); }
}  // namespace llaisys::cpu::portable

int LLAISYS_FN(swiglu)(int device, void* stream, int dtype, int numerics, int64_t n, void* out, const void* gate,
                       const void* up) {
    (void)device; (void)stream;
    return llaisys::guard("swiglu", [&] {
        llaisys::require_exact_numerics(numerics);
        llaisys::cpu::require_float_dtype(dtype);
        LLAISYS_CALL_PER_ISA(swiglu, dtype, n, out, gate, up);
    });
}
