// penalize_logits: logits [vocab] adjusted in place at n token ids (backend.h): the logit bias, then HF's
// repetition penalty (prompt + generated tokens), then OpenAI's frequency and presence penalties (generated
// tokens), in f32 and rounded once to the dtype, with the semantics of the CPU kernel (llaisys-backend-cpu
// csrc/ops/penalize_logits.cpp): products unfused (__fmul_rn), as the CPU rounds them.
//
// One block: n is a sequence's distinct tokens (thousands at most). Every thread first checks its entries
// (id in range and above the one before, counts >= 0); if any is bad, nothing is written and thread 0
// records the first bad entry as a kernel error (reported at the next synchronizing call). Then each entry is
// one read-modify-write of its own logit: the ids are distinct, so no two threads touch one element.
#include "../common/context.h"
#include "../common/dtype.cuh"
#include "../common/launch.h"
#include "../common/reduce.cuh"

namespace llaisys::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ bool bad_entry(int64_t i, int64_t vocab, const int64_t* ids, const int64_t* counts) {
    return ids[i] < 0 || ids[i] >= vocab || (i > 0 && ids[i] <= ids[i - 1]) || counts[2 * i] < 0 ||
           counts[2 * i + 1] < 0;
}

template <class T>
__global__ void __launch_bounds__(kThreads) penalize_kernel(int64_t vocab, int64_t n, T* logits, const int64_t* ids,
                                                            const int64_t* counts, const float* bias,
                                                            float repetition, float frequency, float presence,
                                                            KernelErrorRecord* error) {
    __shared__ BlockScratch<int> scratch;
    int bad = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) bad += bad_entry(i, vocab, ids, counts) ? 1 : 0;
    if (block_sum(bad, scratch) > 0) {
        if (threadIdx.x == 0) {
            int64_t i = 0;
            while (!bad_entry(i, vocab, ids, counts)) ++i;
            const int64_t id = ids[i];
            const int code = id < 0 || id >= vocab ? kPenaltyIdOutOfRange
                             : i > 0 && id <= ids[i - 1] ? kPenaltyIdsNotIncreasing
                                                         : kPenaltyNegativeCount;
            report_kernel_error(error, code, code == kPenaltyNegativeCount ? (long long)counts[2 * i]
                                                                           : (long long)id,
                                i, code == kPenaltyIdOutOfRange ? vocab
                                   : code == kPenaltyIdsNotIncreasing ? ids[i - 1]
                                                                      : counts[2 * i + 1]);
        }
        return;
    }
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const int64_t prompt = counts[2 * i], generated = counts[2 * i + 1];
        float x = to_float(logits[ids[i]]);
        if (bias != nullptr) x += bias[i];
        if (prompt + generated > 0) x = x < 0.0f ? __fmul_rn(x, repetition) : x / repetition;
        x -= __fmul_rn(float(generated), frequency);
        if (generated > 0) x -= presence;
        logits[ids[i]] = from_float<T>(x);
    }
}

}  // namespace
}  // namespace llaisys::cuda

int LLAISYS_FN(penalize_logits)(int device, void* stream, int dtype, int64_t vocab, int64_t n, void* logits,
                                const void* ids, const void* counts, const void* bias, double repetition,
                                double frequency, double presence) {
    using namespace llaisys::cuda;
    return guard("penalize_logits", [&] {
        StreamContext& s = stream_context(device, stream);
        dispatch_float(dtype, [&](auto tag) {
            using T = decltype(tag);
            if (n <= 0) return;
            auto kernel = &penalize_kernel<T>;
            LLAISYS_LAUNCH(kernel, 1, kThreads, 0, s.stream, vocab, n, static_cast<T*>(logits),
                           static_cast<const int64_t*>(ids), static_cast<const int64_t*>(counts),
                           static_cast<const float*>(bias), float(repetition), float(frequency), float(presence),
                           device_context(s.device).error_device);
        });
    });
}
