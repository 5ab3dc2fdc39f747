// rearrange: out[i...] = x[i...] for any shape and strides (in elements) of either side; a byte copy, no
// SIMD paths.
#include <cstring>
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

template <class T>
void copy_rows(const std::vector<Dim>& dims, char* dst, const char* src) {
    const Dim inner = dims.back();
    const int outer_ndim = int(dims.size()) - 1;
    int64_t rows = 1;
    for (int i = 0; i < outer_ndim; ++i) rows *= dims[i].size;
    const bool dense = inner.dst_stride == 1 && inner.src_stride == 1;
    const int64_t work = rows * inner.size;
    llaisys::cpu::run_ranges(rows, [&](int64_t row_begin, int64_t row_end) {
        for (int64_t row = row_begin; row < row_end; ++row) {
            int64_t dst_off = 0, src_off = 0, rest = row;
            for (int i = outer_ndim - 1; i >= 0; --i) {
                int64_t idx = rest % dims[i].size;
                rest /= dims[i].size;
                dst_off += idx * dims[i].dst_stride;
                src_off += idx * dims[i].src_stride;
            }
            T* d = reinterpret_cast<T*>(dst) + dst_off;
            const T* s = reinterpret_cast<const T*>(src) + src_off;
            if (dense) {
                std::memcpy(d, s, sizeof(T) * inner.size);
            } else {
                for (int64_t j = 0; j < inner.size; ++j) d[j * inner.dst_stride] = s[j * inner.src_stride];
            }
        }
    }, work > (1 << 16));
}

template <int N> struct Bytes { char b[N]; };

}  // namespace

int LLAISYS_FN(rearrange)(int device, void* stream, int elem_size, int ndim, const int64_t* shape, void* dst,
                          const int64_t* dst_strides, const void* src, const int64_t* src_strides) {
    (void)device;
    // shape and strides are the caller's short-lived arrays: read them now, also when the call is recorded
    std::vector<Dim> dims;
    const int status = guard("rearrange", [&] { dims = coalesce(ndim, shape, dst_strides, src_strides); });
    if (status != kOk) return status;
    return launch("rearrange", stream, [=] {
        auto* d = static_cast<char*>(dst);
        auto* s = static_cast<const char*>(src);
        switch (elem_size) {
            case 1: copy_rows<uint8_t>(dims, d, s); break;
            case 2: copy_rows<uint16_t>(dims, d, s); break;
            case 4: copy_rows<uint32_t>(dims, d, s); break;
            case 8: copy_rows<uint64_t>(dims, d, s); break;
            case 16: copy_rows<Bytes<16>>(dims, d, s); break;
            default: throw NotSupported("element size " + std::to_string(elem_size) + " bytes");
        }
    });
}
