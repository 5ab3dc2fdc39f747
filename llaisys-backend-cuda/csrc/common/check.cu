#include "check.h"

namespace llaisys::cuda {

void throw_cuda_error(cudaError_t err, const char* call) {
    (void)cudaGetLastError();  // clear a sticky-free error so that the next call starts clean
    std::string message = std::string(call) + " failed: " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
    if (err == cudaErrorMemoryAllocation) throw OutOfMemory(message);
    // An operation this runtime or device does not offer (CoreX: graph capture on some of its runtimes):
    // the optional slots that reach it report LLAISYS_NOT_SUPPORTED rather than a failure.
    if (err == cudaErrorNotSupported) throw NotSupported(message);
    throw std::runtime_error(message);
}

namespace {
const char* cublas_status_name(cublasStatus_t status) {
    switch (status) {
        case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
        case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
        case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
        case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
        case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
        case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
        case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
        default: return "cuBLAS error";
    }
}
}  // namespace

void throw_cublas_error(cublasStatus_t status, const char* call) {
    std::string message = std::string(call) + " failed: " + cublas_status_name(status) + " (" +
                          std::to_string(int(status)) + ")";
    if (status == CUBLAS_STATUS_ALLOC_FAILED) throw OutOfMemory(message);
    if (status == CUBLAS_STATUS_NOT_SUPPORTED) throw NotSupported(message);
    throw std::runtime_error(message);
}

}  // namespace llaisys::cuda
