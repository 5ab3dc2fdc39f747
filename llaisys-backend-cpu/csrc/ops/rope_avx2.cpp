// The rope cos/sin table and rotation (rope_kernel.h) compiled for this file's instruction set.
#include "rope_kernel.h"

namespace llaisys::cpu::LLAISYS_ISA {
void rope_table(int64_t seq, int64_t half, const float* inv_freq, const int64_t* pos_ids, float* table) {
    rope_table_kernel(seq, half, inv_freq, pos_ids, table);
}
void rope(int dtype, int64_t seq, int64_t heads, int64_t head_dim, const float* table, void* out, const void* x) {
    rope_kernel(dtype, seq, heads, head_dim, table, out, x);
}
}  // namespace llaisys::cpu::LLAISYS_ISA
