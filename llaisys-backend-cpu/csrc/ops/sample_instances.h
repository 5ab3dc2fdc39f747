// The vector passes of sample (sample_kernel.h) defined for the instruction set of the including file.
// Include exactly once per translation unit: sample.cpp (portable), sample_avx2.cpp, sample_avx512.cpp.
#include "sample_kernel.h"

namespace llaisys::cpu::LLAISYS_ISA {
void sample_widen(int dtype, int64_t n, const void* src, float* dst) { sample_widen_kernel(dtype, n, src, dst); }
void sample_exp(int64_t n, const float* v, float max, float temperature, float* p, double* block_sums) {
    sample_exp_kernel(n, v, max, temperature, p, block_sums);
}
int64_t sample_select(int64_t n, const float* v, float threshold, bool inclusive, int64_t base, int64_t* out) {
    return sample_select_kernel(n, v, threshold, inclusive, base, out);
}
double sample_sum_at_least(int64_t n, const float* p, float threshold) { return sample_sum_at_least_kernel(n, p, threshold); }
}  // namespace llaisys::cpu::LLAISYS_ISA
