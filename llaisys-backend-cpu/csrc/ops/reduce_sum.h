// The sum the shared-memory communicator's all-reduce makes of its ranks' buffers (comm/shm_comm.cpp), one
// kernel per SIMD build behind a plain function the communicator (compiled once) calls.
#pragma once

#include <cstdint>

namespace llaisys::cpu {

// out [n] = src[0] + src[1] + ... + src[count - 1], element by element in that order, in f32, rounded once
// to the dtype (f32 / f16 / bf16; NotSupported for any other). Each element's sum is the same sequence of
// f32 additions in every SIMD build and for every n, so the result does not depend on the machine or on how
// a buffer was cut into chunks. out shares no memory with the sources.
void reduce_sum(int dtype, int64_t n, void* out, const void* const* src, int count);

}  // namespace llaisys::cpu
