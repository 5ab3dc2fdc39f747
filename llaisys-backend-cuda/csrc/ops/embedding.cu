// embedding: out[i, :] = weight[index[i], :]. One block per output row copies it (16 bytes per thread
// where rows are aligned). An index outside [0, vocab) leaves its row unwritten and is recorded as a
// kernel error: the next synchronizing call reports it (value, position) as LLAISYS_INVALID_ARGUMENT.
#include "../common/context.h"
#include "../common/dtype.cuh"
#include "../common/launch.h"

namespace llaisys::cuda {
namespace {

// Copies rows of `row_units` units of type U (U is 16 bytes when rows allow it, else the element type).
template <class U>
__global__ void embedding_kernel(int64_t n_index, int64_t row_units, int64_t vocab, U* out, const int64_t* index,
                                 const U* weight, KernelErrorRecord* error) {
    for (int64_t i = blockIdx.x; i < n_index; i += gridDim.x) {
        const int64_t row = index[i];
        if (row < 0 || row >= vocab) {
            if (threadIdx.x == 0) report_kernel_error(error, kEmbeddingIndexOutOfRange, row, i, vocab);
            continue;
        }
        const U* src = weight + row * row_units;
        U* dst = out + i * row_units;
        for (int64_t c = threadIdx.x; c < row_units; c += blockDim.x) dst[c] = src[c];
    }
}

template <class U>
void launch_embedding(StreamContext& s, int64_t n_index, int64_t units, int64_t vocab, void* out, const void* index,
                      const void* weight) {
    const int threads = units >= 256 ? 256 : (units >= 128 ? 128 : 64);
    const unsigned blocks = blocks_for(n_index, 1, int64_t(device_context(s.device).sm_count) * 16);
    auto kernel = &embedding_kernel<U>;
    LLAISYS_LAUNCH(kernel, blocks, threads, 0, s.stream, n_index, units, vocab, static_cast<U*>(out),
                   static_cast<const int64_t*>(index), static_cast<const U*>(weight),
                   device_context(s.device).error_device);
}

}  // namespace
}  // namespace llaisys::cuda

int LLAISYS_FN(embedding)(int device, void* stream, int dtype, int64_t n_index, int64_t dim, int64_t vocab, void* out,
                          const void* index, const void* weight) {
    using namespace llaisys::cuda;
    return guard("embedding", [&] {
        StreamContext& s = stream_context(device, stream);
        if (n_index <= 0 || dim < 0) return;  // empty rows (dim 0) still have their indices checked
        dispatch_float(dtype, [&](auto tag) {
            using T = decltype(tag);
            const int64_t row_bytes = dim * int64_t(sizeof(T));
            if (row_bytes % 16 == 0 && aligned16(out) && aligned16(weight))
                launch_embedding<Pack<T, kPack<T>>>(s, n_index, row_bytes / 16, vocab, out, index, weight);
            else
                launch_embedding<T>(s, n_index, dim, vocab, out, index, weight);
        });
    });
}
