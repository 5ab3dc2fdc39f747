// LLAISYS_LAUNCH(kernel, grid, block, shared_bytes, stream, args...): the one way kernels are launched.
// On a GPU it is kernel<<<grid, block, shared_bytes, stream>>>(args...) followed by a launch-error check
// that names the kernel; under LLAISYS_HOST_EXEC (tests) the host-execution header runs the same kernel
// body on CPU threads. `kernel` is a __global__ function (a template instance may be passed through a
// pointer variable, since a macro argument cannot hold a bare comma). Empty grids launch nothing.
#pragma once

#include <string>
#include <utility>

#include "../compat.h"
#include "check.h"

namespace llaisys::cuda {

#if !defined(LLAISYS_HOST_EXEC)
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                   const char* name, Args&&... args) {
    if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
    if (block.x * block.y * block.z > unsigned(kMaxBlockThreads))
        throw std::logic_error(std::string("launch of ") + name + ": more than 1024 threads per block");
    kernel<<<grid, block, shared_bytes, stream>>>(Params(std::forward<Args>(args))...);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) throw_cuda_error(err, name);
}
#define LLAISYS_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
    ::llaisys::cuda::launch_kernel(kernel, grid, block, shared_bytes, stream, "launch of " #kernel, __VA_ARGS__)
#else
#define LLAISYS_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
    ::llaisys_host_exec::launch(kernel, grid, block, shared_bytes, stream, "launch of " #kernel, __VA_ARGS__)
#endif

// Blocks of `threads` covering n items, one item per thread, capped at `max_blocks` (grid-stride loops
// do the rest).
inline unsigned blocks_for(int64_t n, int threads, int64_t max_blocks) {
    int64_t blocks = (n + threads - 1) / threads;
    if (blocks > max_blocks) blocks = max_blocks;
    return unsigned(blocks < 1 ? 1 : blocks);
}

}  // namespace llaisys::cuda
