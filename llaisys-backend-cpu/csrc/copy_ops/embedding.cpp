// embedding: out[i, :] = weight[index[i], :] for int64 index [n], weight [vocab, dim], out [n, dim].
// Every index is checked against [0, vocab) before anything is copied (the one check a kernel keeps: core
// cannot see the data): a bad one is INVALID_ARGUMENT naming its value and position, and out is left
// untouched. Rows are memcpy'd, in parallel when there is enough to copy.
#include <cstring>

#include "../common/api.h"
#include "../common/index_check.h"
#include "../common/thread_pool.h"

namespace {

constexpr int64_t kParallelElements = int64_t(1) << 17;  // below this, waking threads costs more

size_t element_size(int dtype) {
    switch (dtype) {
        case LLAISYS_F32: return 4;
        case LLAISYS_F16:
        case LLAISYS_BF16: return 2;
        default: llaisys::unsupported_dtype(dtype);
    }
}

}  // namespace

int LLAISYS_FN(embedding)(int device, void* stream, int dtype, int64_t n_index, int64_t dim, int64_t vocab,
                          void* out, const void* index_ptr, const void* weight) {
    (void)device;
    const auto* index = static_cast<const int64_t*>(index_ptr);
    return llaisys::launch("embedding", stream, [=] {
        const size_t row_bytes = element_size(dtype) * size_t(dim);
        llaisys::check_row_indices(index, n_index, vocab);
        auto* dst = static_cast<char*>(out);
        const auto* src = static_cast<const char*>(weight);
        llaisys::cpu::run_ranges(n_index, [&](int64_t i_begin, int64_t i_end) {
            for (int64_t i = i_begin; i < i_end; ++i)
                std::memcpy(dst + size_t(i) * row_bytes, src + size_t(index[i]) * row_bytes, row_bytes);
        }, n_index > 1 && n_index * dim >= kParallelElements);
    });
}
