// self_attention, AVX2 + FMA + F16C path (16 ymm registers: blocking sized to fit them).
#include "self_attention.h"
#include "self_attention_simd256.h"

namespace llaisys::cpu::attn {

namespace {
template <class T>
void go(const Problem& p) {
    const int64_t queries_per_group = p.L * (p.H / p.Hkv);
    // 1..4 queries per kv head: the row form (lanes along the head dim) idles no lanes;
    // from 5 on, the lane form (queries in lanes) wins (measured on Zen 4, both ISAs)
    if (queries_per_group <= 4 && p.d % 8 == 0 && p.dv % 8 == 0)
        attention_rows<V256, 4, Cvt256, T>(p);
    else if (queries_per_group <= 8)
        attention<V256, 1, 12, 12, Cvt256, T>(p);  // 12 + 2 registers
    else
        attention<V256, 2, 6, 6, Cvt256, T>(p);    // 12 + 3 registers
}
}  // namespace

void run_avx2(int dtype, const Problem& p) {
    switch (dtype) {
        case 0: go<float>(p); break;
        case 1: go<llaisys::f16_t>(p); break;
        default: go<llaisys::bf16_t>(p); break;
    }
}

}  // namespace llaisys::cpu::attn
