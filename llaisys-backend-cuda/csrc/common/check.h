// CUDA_CHECK / CUBLAS_CHECK: a failed runtime or cuBLAS call becomes an exception whose message names the
// call and the error (guard() turns it into a status); an allocation failure becomes OutOfMemory.
#pragma once

#include <string>

#include "../compat.h"
#include "api.h"

namespace llaisys::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call);

}  // namespace llaisys::cuda

#define CUDA_CHECK(call)                                                                 \
    do {                                                                                 \
        const cudaError_t llaisys_err_ = (call);                                         \
        if (llaisys_err_ != cudaSuccess) ::llaisys::cuda::throw_cuda_error(llaisys_err_, #call); \
    } while (0)

#define CUBLAS_CHECK(call)                                                                          \
    do {                                                                                            \
        const cublasStatus_t llaisys_status_ = (call);                                              \
        if (llaisys_status_ != CUBLAS_STATUS_SUCCESS) ::llaisys::cuda::throw_cublas_error(llaisys_status_, #call); \
    } while (0)
