// logprobs: the chosen token's log-probability and the top k (<= 20) of one row of logits under
// softmax(logits / temperature) (backend.h), with the CPU kernel's arithmetic (llaisys-backend-cpu
// csrc/ops/logprobs.cpp): m = max, d_i = (x_i - m) / t in f32, S = sum exp(d_i) (each thread's sum in
// double), log p_i = d_i - log S in double, rounded to f32.
//
// One block: the max (argmax.cuh, which also finds a NaN), one pass for S, then k argmax passes, each over
// the tokens after the previous winner in (logit descending, id ascending) order: k <= 20 reads of a
// 152k-token row, only for the sequences that ask for log-probabilities.
#include <algorithm>

#include "../common/context.h"
#include "../common/launch.h"
#include "argmax.cuh"

namespace llaisys::cuda {
namespace {

template <class T>
__global__ void logprobs_kernel(int64_t n, const T* logits, int64_t chosen, float t, int64_t k, int64_t* top_ids,
                                float* values, KernelErrorRecord* error) {
    __shared__ BlockScratch<ArgBest> best_scratch;
    __shared__ BlockScratch<double> sum_scratch;
    const ArgBest top = block_argmax(logits, n, best_scratch);
    const float m = top.value;
    if (isnan(m) || isinf(m)) {  // the same value in every thread: the whole block leaves
        if (threadIdx.x == 0)
            report_kernel_error(error, kLogprobsNoDistribution, isnan(m) ? 0 : m > 0 ? 1 : 2, top.index, 0);
        return;
    }
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += double(expf((to_float(logits[i]) - m) / t));
    const double log_total = log(block_sum(sum, sum_scratch));
    auto logprob = [&](int64_t i) { return float(double((to_float(logits[i]) - m) / t) - log_total); };
    if (threadIdx.x == 0) values[0] = logprob(chosen);
    ArgBest previous{INFINITY, -1};  // before every token
    for (int64_t j = 0; j < k; ++j) {
        ArgBest best{-INFINITY, n};
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            const float x = to_float(logits[i]);
            if (better(previous.value, previous.index, x, i) && better(x, i, best.value, best.index))
                best = ArgBest{x, i};
        }
        previous = block_best(best, best_scratch);
        if (threadIdx.x == 0) {
            top_ids[j] = previous.index;
            values[1 + j] = logprob(previous.index);
        }
    }
}

}  // namespace
}  // namespace llaisys::cuda

int LLAISYS_FN(logprobs)(int device, void* stream, int dtype, int64_t n, const void* logits, int64_t chosen,
                         double temperature, int64_t k, void* top_ids, void* values) {
    using namespace llaisys::cuda;
    return guard("logprobs", [&] {
        StreamContext& s = stream_context(device, stream);
        if (n <= 0) throw InvalidArgument("logits is empty");
        if (chosen < 0 || chosen >= n)
            throw InvalidArgument("chosen = " + std::to_string(chosen) + " is not a token id in [0, " +
                                  std::to_string(n) + ")");
        if (k < 0 || k > 20 || k > n) throw InvalidArgument("k = " + std::to_string(k) + " is not in [0, min(20, n)]");
        dispatch_float(dtype, [&](auto tag) {
            using T = decltype(tag);
            const int limit = std::min(kMaxBlockThreads, device_context(device).max_threads_per_block) / WARP_SIZE;
            const int threads = int(std::min<int64_t>((n + WARP_SIZE - 1) / WARP_SIZE, limit)) * WARP_SIZE;
            auto kernel = &logprobs_kernel<T>;
            LLAISYS_LAUNCH(kernel, 1, threads, 0, s.stream, n, static_cast<const T*>(logits), chosen,
                           temperature > 0.0 ? float(temperature) : 1.0f, k, static_cast<int64_t*>(top_ids),
                           static_cast<float*>(values), device_context(s.device).error_device);
        });
    });
}
