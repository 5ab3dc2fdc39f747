// rearrange: out[i...] = x[i...] for any shape and strides (in elements) of either side; a byte copy, no
// SIMD paths.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../common/api.h"
#include "../common/thread_pool.h"

using namespace llaisys;

namespace {

struct Dim { int64_t size, dst_stride, src_stride; };

// Drop size-1 dims and merge neighbours that are contiguous on both sides.
std::vector<Dim> coalesce(int ndim, const int64_t* shape, const int64_t* dst_strides, const int64_t* src_strides) {
    std::vector<Dim> dims;
    for (int i = 0; i < ndim; ++i) {
        if (shape[i] == 1) continue;
        Dim d{shape[i], dst_strides[i], src_strides[i]};
        if (!dims.empty()) {
            Dim& prev = dims.back();
            if (prev.dst_stride == d.size * d.dst_stride && prev.src_stride == d.size * d.src_stride) {
                prev = Dim{prev.size * d.size, d.dst_stride, d.src_stride};
                continue;
            }
        }
        dims.push_back(d);
    }
    if (dims.empty()) dims.push_back(Dim{1, 1, 1});
    return dims;
}

// The copy in tiles: a tile is the innermost dim (memcpy when long and contiguous on both sides, else an element
// loop)
// times up to kTileElems / its size of the next one, both walked with pointer increments; the tiles, in order
// over the outer dims, are shared among the team, each thread walking its range with an odometer (one
// division per range, not per row). Small inner dims (a transpose that moves 2- or 4-byte words between 16
// rows, as a GGUF file's blocks become llaisys' blocks) then cost a few instructions per element.
template <class T>
void copy_tiles(const std::vector<Dim>& dims, char* dst, const char* src) {
    constexpr int64_t kTileElems = 512;
    constexpr int kMaxOuter = 16;  // the odometer's dims (core refuses ranks above 16)
    const int nd = int(dims.size());
    if (nd - 2 > kMaxOuter) throw NotSupported("rearrange of more than " + std::to_string(kMaxOuter + 2) + " dims");
    const Dim inner = dims[nd - 1];
    const Dim mid = nd >= 2 ? dims[nd - 2] : Dim{1, 0, 0};
    const int outer_nd = nd >= 2 ? nd - 2 : 0;
    const int64_t mid_step = std::max<int64_t>(1, std::min(mid.size, kTileElems / std::max<int64_t>(inner.size, 1)));
    const int64_t mid_tiles = (mid.size + mid_step - 1) / mid_step;
    int64_t outer = 1;
    for (int i = 0; i < outer_nd; ++i) outer *= dims[i].size;
    // memcpy for long contiguous rows; short ones (a call per few bytes cost ~10 ns an element) by the loop
    const bool dense = inner.dst_stride == 1 && inner.src_stride == 1 && inner.size * int64_t(sizeof(T)) >= 64;
    const int64_t work = outer * mid.size * inner.size;
    T* const d0 = reinterpret_cast<T*>(dst);
    const T* const s0 = reinterpret_cast<const T*>(src);
    llaisys::cpu::run_ranges(outer * mid_tiles, [&](int64_t begin, int64_t end) {
        int64_t idx[kMaxOuter] = {}, dst_off = 0, src_off = 0;  // the outer dims' odometer
        int64_t mt = begin % mid_tiles, rest = begin / mid_tiles;  // (no division per tile: ~1 ns an element)
        for (int i = outer_nd - 1; i >= 0; --i) {
            idx[i] = rest % dims[i].size;
            rest /= dims[i].size;
            dst_off += idx[i] * dims[i].dst_stride;
            src_off += idx[i] * dims[i].src_stride;
        }
        for (int64_t t = begin; t < end; ++t) {
            const int64_t m0 = mt * mid_step, m1 = std::min(mid.size, m0 + mid_step);
            for (int64_t m = m0; m < m1; ++m) {
                T* d = d0 + dst_off + m * mid.dst_stride;
                const T* s = s0 + src_off + m * mid.src_stride;
                if (dense) {
                    std::memcpy(static_cast<void*>(d), s, sizeof(T) * size_t(inner.size));
                } else {
                    for (int64_t j = 0; j < inner.size; ++j) d[j * inner.dst_stride] = s[j * inner.src_stride];
                }
            }
            if (++mt < mid_tiles) continue;
            mt = 0;
            for (int i = outer_nd - 1; i >= 0; --i) {  // next outer index
                dst_off += dims[i].dst_stride;
                src_off += dims[i].src_stride;
                if (++idx[i] < dims[i].size) break;
                dst_off -= dims[i].size * dims[i].dst_stride;
                src_off -= dims[i].size * dims[i].src_stride;
                idx[i] = 0;
            }
        }
    }, work > (1 << 16));
}

template <int N> struct Bytes { char b[N]; };

// A dense innermost dim of n elements of `elem` bytes copied as one element of n * elem bytes (2 to 16) where
// both pointers and every other stride allow it (aligned wider elements): a 4-byte word moved as two 2-byte
// halves becomes one 4-byte copy.
int widen(std::vector<Dim>& dims, int elem, const void* dst, const void* src) {
    const Dim inner = dims.back();
    const int64_t bytes = inner.size * elem;
    if (dims.size() < 2 || inner.dst_stride != 1 || inner.src_stride != 1 || bytes > 16 || (bytes & (bytes - 1)) ||
        reinterpret_cast<uintptr_t>(dst) % uintptr_t(bytes) || reinterpret_cast<uintptr_t>(src) % uintptr_t(bytes))
        return elem;
    for (size_t i = 0; i + 1 < dims.size(); ++i)
        if (dims[i].dst_stride % inner.size || dims[i].src_stride % inner.size) return elem;
    for (size_t i = 0; i + 1 < dims.size(); ++i) {
        dims[i].dst_stride /= inner.size;
        dims[i].src_stride /= inner.size;
    }
    dims.pop_back();
    return int(bytes);
}

}  // namespace

int LLAISYS_FN(rearrange)(int device, void* stream, int elem_size, int ndim, const int64_t* shape, void* dst,
                          const int64_t* dst_strides, const void* src, const int64_t* src_strides) {
    (void)device;
    // shape and strides are the caller's short-lived arrays: read them now, also when the call is recorded
    std::vector<Dim> dims;
    int elem = elem_size;
    const int status = guard("rearrange", [&] {
        dims = coalesce(ndim, shape, dst_strides, src_strides);
        if (elem_size == 1 || elem_size == 2 || elem_size == 4 || elem_size == 8) elem = widen(dims, elem_size, dst, src);
    });
    if (status != kOk) return status;
    return launch("rearrange", stream, [=] {
        auto* d = static_cast<char*>(dst);
        auto* s = static_cast<const char*>(src);
        switch (elem) {
            case 1: copy_tiles<uint8_t>(dims, d, s); break;
            case 2: copy_tiles<uint16_t>(dims, d, s); break;
            case 4: copy_tiles<uint32_t>(dims, d, s); break;
            case 8: copy_tiles<uint64_t>(dims, d, s); break;
            case 16: copy_tiles<Bytes<16>>(dims, d, s); break;
            default: throw NotSupported("element size " + std::to_string(elem) + " bytes");
        }
    });
}
