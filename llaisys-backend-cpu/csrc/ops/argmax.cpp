// argmax: max_idx (int64 [1]) and max_val ([1], the element itself) of a 1-D array, torch.argmax's
// rules (first index on ties, NaN is the maximum). Portable path and the exported entry point, which
// picks the AVX-512 / AVX2 / portable build of argmax_kernel.h at run time.
#include <cstring>

#include "argmax_kernel.h"

namespace llaisys::cpu::portable {
int64_t argmax(int dtype, int64_t n, const void* vals) { return argmax_kernel(dtype, n, vals); }
}  // namespace llaisys::cpu::portable

int LLAISYS_FN(argmax)(int device, void* stream, int dtype, int64_t n, void* max_idx, void* max_val,
                                      const void* vals) {
    (void)device; (void)stream;
    return llaisys::guard("argmax", [&] {
        llaisys::cpu::require_float_dtype(dtype);
        if (n <= 0) throw llaisys::InvalidArgument("vals is empty");
        int64_t index = 0;
        LLAISYS_ASSIGN_PER_ISA(index, argmax, dtype, n, vals);
        const size_t elem = dtype == llaisys::kF32 ? 4 : 2;
        std::memcpy(max_val, static_cast<const char*>(vals) + size_t(index) * elem, elem);
        std::memcpy(max_idx, &index, sizeof(index));
    });
}
