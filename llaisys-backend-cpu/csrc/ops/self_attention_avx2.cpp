// self_attention, AVX2 + FMA + F16C path (16 ymm registers: blocking sized to fit them).
#include "self_attention.h"
#include "self_attention_simd256.h"
#include "paged_attention.h"

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

// Paged attention (paged_attention.h): 8-lane vectors, 1 or 2 per tile (16 ymm registers).
struct PagedShapes256 {
    static constexpr int kMaxMB = 2;
    static constexpr int kr[3] = {12, 6, 6}, r[3] = {12, 6, 6};
};

void run_paged_avx2(int dtype, const PagedProblem& p) {
    switch (dtype) {
        case 0: paged_attention<V256, PagedShapes256, Cvt256, float>(p); break;
        case 1: paged_attention<V256, PagedShapes256, Cvt256, llaisys::f16_t>(p); break;
        default: paged_attention<V256, PagedShapes256, Cvt256, llaisys::bf16_t>(p); break;
    }
}

}  // namespace llaisys::cpu::attn
