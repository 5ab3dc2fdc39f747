// The check of a grouped expert linear's expert ids (moe_linear, moe_linear_q), on the device.
#pragma once

#include "../common/context.h"
#include "../common/launch.h"

namespace llaisys::cuda {
namespace {

// Reports the first pair whose expert id is outside [0, E) (its output row is left unwritten).
__global__ void moe_check_ids_kernel(int64_t pairs, int64_t k, int64_t E, const int64_t* experts,
                                     KernelErrorRecord* error) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < pairs; r += stride)
        if (experts[r] < 0 || experts[r] >= E)
            report_kernel_error(error, kMoeExpertOutOfRange, experts[r], r / k, r % k);
}

}  // namespace
}  // namespace llaisys::cuda
