// rms_norm: per row, out = x * weight / sqrt(mean(x^2) + eps), HF Qwen2RMSNorm numerics (see
// rms_norm_kernel.h). Portable path and the exported entry point, which picks the AVX-512 / AVX2 /
// portable build at run time.
#include "rms_norm_kernel.h"

namespace llaisys::cpu::portable {
void rms_norm(int dtype, int64_t rows, int64_t dim, double eps, void* out, const void* x, const void* weight) {
    rms_norm_kernel(dtype, rows, dim, eps, out, x, weight);
}
}  // namespace llaisys::cpu::portable

int LLAISYS_FN(rms_norm)(int device, void* stream, int dtype, int numerics, int64_t rows, int64_t dim, double eps,
                         void* out, const void* x, const void* weight) {
    (void)device; (void)stream;
    return llaisys::guard("rms_norm", [&] {
        llaisys::require_exact_numerics(numerics);
        llaisys::cpu::require_float_dtype(dtype);
        if (rows < 0 || dim <= 0) throw llaisys::InvalidArgument("rows and dim must be positive");
        if (!(eps >= 0)) throw llaisys::InvalidArgument("eps must be >= 0, got " + std::to_string(eps));
        LLAISYS_CALL_PER_ISA(rms_norm, dtype, rows, dim, eps, out, x, weight);
    });
}
