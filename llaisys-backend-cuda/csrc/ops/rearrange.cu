// rearrange: dst[i...] = src[i...] for any shape and strides (elements of 1, 2, 4, 8 or 16 bytes).
// The host first drops size-1 dims and merges dims that are contiguous in both tensors (a transposed
// [S, H, d] copy becomes 3 dims, a plain copy 1), so the kernel's index arithmetic is short; the shape
// and strides travel by value in the kernel's arguments (captured as they are into a graph).
#include <cstring>

#include "../common/context.h"
#include "../common/launch.h"

namespace llaisys::cuda {
namespace {

constexpr int kMaxDims = 16;

struct Layout {
    int ndim;
    int64_t shape[kMaxDims];
    int64_t dst_stride[kMaxDims];  // in elements
    int64_t src_stride[kMaxDims];
};

struct alignas(16) Bytes16 { unsigned char b[16]; };

template <class E>
__global__ void rearrange_kernel(int64_t total, Layout layout, E* dst, const E* src) {
    const int64_t step = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
        int64_t rest = i, d_off = 0, s_off = 0;
        for (int k = layout.ndim - 1; k >= 0; --k) {  // the last dim varies fastest
            const int64_t idx = rest % layout.shape[k];
            rest /= layout.shape[k];
            d_off += idx * layout.dst_stride[k];
            s_off += idx * layout.src_stride[k];
        }
        dst[d_off] = src[s_off];
    }
}

// Drops size-1 dims and merges dim k into k+1 where both tensors step over k exactly as over the whole of k+1.
Layout simplify(int ndim, const int64_t* shape, const int64_t* dst_strides, const int64_t* src_strides) {
    Layout l{};
    for (int k = 0; k < ndim; ++k) {
        if (shape[k] == 1) continue;
        if (l.ndim > 0) {
            const int j = l.ndim - 1;  // the previous kept (outer) dim
            if (l.dst_stride[j] == dst_strides[k] * shape[k] && l.src_stride[j] == src_strides[k] * shape[k]) {
                l.shape[j] *= shape[k];
                l.dst_stride[j] = dst_strides[k];
                l.src_stride[j] = src_strides[k];
                continue;
            }
        }
        l.shape[l.ndim] = shape[k];
        l.dst_stride[l.ndim] = dst_strides[k];
        l.src_stride[l.ndim] = src_strides[k];
        ++l.ndim;
    }
    if (l.ndim == 0) {  // a single element
        l.ndim = 1;
        l.shape[0] = 1;
        l.dst_stride[0] = l.src_stride[0] = 1;
    }
    return l;
}

template <class E>
void launch_rearrange(StreamContext& s, int64_t total, const Layout& layout, void* dst, const void* src) {
    auto kernel = &rearrange_kernel<E>;
    const unsigned blocks = blocks_for(total, 256, int64_t(device_context(s.device).sm_count) * 8);
    LLAISYS_LAUNCH(kernel, blocks, 256, 0, s.stream, total, layout, static_cast<E*>(dst), static_cast<const E*>(src));
}

}  // namespace
}  // namespace llaisys::cuda

int LLAISYS_FN(rearrange)(int device, void* stream, int elem_size, int ndim, const int64_t* shape, void* dst,
                          const int64_t* dst_strides, const void* src, const int64_t* src_strides) {
    using namespace llaisys::cuda;
    return guard("rearrange", [&] {
        StreamContext& s = stream_context(device, stream);
        if (ndim < 0 || ndim > kMaxDims) throw InvalidArgument("ndim " + std::to_string(ndim) + " is not in [0, 16]");
        int64_t total = 1;
        for (int k = 0; k < ndim; ++k) total *= shape[k];
        if (total <= 0) return;
        const Layout layout = simplify(ndim, shape, dst_strides, src_strides);
        switch (elem_size) {
            case 1: launch_rearrange<uint8_t>(s, total, layout, dst, src); break;
            case 2: launch_rearrange<uint16_t>(s, total, layout, dst, src); break;
            case 4: launch_rearrange<uint32_t>(s, total, layout, dst, src); break;
            case 8: launch_rearrange<uint64_t>(s, total, layout, dst, src); break;
            case 16: launch_rearrange<Bytes16>(s, total, layout, dst, src); break;
            default: throw InvalidArgument("element size " + std::to_string(elem_size) + " is not 1, 2, 4, 8 or 16");
        }
    });
}
