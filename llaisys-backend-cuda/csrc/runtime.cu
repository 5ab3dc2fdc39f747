// The runtime slots of backend.h on the CUDA runtime API: devices, memory, copies, streams, events and
// graphs. Every slot makes its device current first; a stream handle is a StreamContext (context.h).
#include <cstdio>
#include <cstring>
#include <string>

#include "common/api.h"
#include "common/check.h"
#include "common/context.h"

using namespace llaisys::cuda;

namespace {

cudaMemcpyKind memcpy_kind(int kind) {
    switch (kind) {
        case LLAISYS_MEMCPY_H2H: return cudaMemcpyHostToHost;
        case LLAISYS_MEMCPY_H2D: return cudaMemcpyHostToDevice;
        case LLAISYS_MEMCPY_D2H: return cudaMemcpyDeviceToHost;
        case LLAISYS_MEMCPY_D2D: return cudaMemcpyDeviceToDevice;
        default: throw InvalidArgument("unknown memcpy kind " + std::to_string(kind));
    }
}

// A captured graph: the graph and its executable instance.
struct Graph {
    int device;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
};

void require_stream_for_capture(void* stream) {
    if (!stream)
        throw InvalidArgument("graph capture needs a stream from stream_create (the default stream cannot be captured)");
}

// The streams this thread is capturing. While there is one, the calls that a capture cannot record
// (allocation, free, synchronization, synchronous copies) are refused here, before CUDA sees them: CUDA
// would answer some with cudaErrorStreamCaptureUnsupported and invalidate the capture, and let others
// (a synchronous copy) run at once instead of at replay.
thread_local int t_capturing_streams = 0;

void refuse_while_capturing(const char* call) {
    if (t_capturing_streams > 0)
        throw InvalidArgument(std::string(call) + " is not allowed on a thread that is capturing a graph "
                              "(between graph_begin_capture and graph_end_capture)");
}

void capture_ended(StreamContext& s) {
    if (s.capturing_thread) --*s.capturing_thread;
    s.capturing_thread = nullptr;
}

}  // namespace

const char* LLAISYS_FN(build_info)(void) {
    static const std::string info = [] {
        int runtime = 0;
        (void)cudaRuntimeGetVersion(&runtime);
        return std::string("llaisys ") + kVendor + " kernels for " + built_architectures() + ", warp " +
               std::to_string(WARP_SIZE) + ", CUDA runtime " + std::to_string(runtime / 1000) + "." +
               std::to_string((runtime % 1000) / 10) + ", cuBLAS";
    }();
    return info.c_str();
}

int LLAISYS_FN(device_count)(int* count) {
    *count = 0;
    return guard("device_count", [&] {
        *count = int(usable_devices().size());
        // No device is not an error: the reason stays in last_error for `llaisys devices` to show.
        if (!usable_devices_reason().empty()) set_last_error(usable_devices_reason());
    });
}

int LLAISYS_FN(device_attribute)(int device, int attr, int64_t* value) {
    return guard("device_attribute", [&] {
        DeviceContext& ctx = device_context(device);
        int v = 0;
        switch (attr) {
            case LLAISYS_ATTR_HOST_ADDRESSABLE: *value = 0; return;
            case LLAISYS_ATTR_WARP_SIZE: CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrWarpSize, ctx.ordinal)); break;
            case LLAISYS_ATTR_MAX_THREADS_PER_BLOCK: v = ctx.max_threads_per_block; break;
            case LLAISYS_ATTR_MULTIPROCESSOR_COUNT: v = ctx.sm_count; break;
            case LLAISYS_ATTR_TOTAL_MEMORY: {
                size_t free_bytes = 0, total = 0;
                CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
                *value = int64_t(total);
                return;
            }
            case LLAISYS_ATTR_COMPUTE_CAPABILITY: {
                int major = 0, minor = 0;
                CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ctx.ordinal));
                CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ctx.ordinal));
                v = major * 10 + minor;
                break;
            }
            case LLAISYS_ATTR_MAX_SHARED_MEMORY_PER_BLOCK: *value = int64_t(ctx.max_shared_per_block_optin); return;
            default: throw NotSupported("unknown device attribute " + std::to_string(attr));
        }
        *value = v;
    });
}

int LLAISYS_FN(device_name)(int device, char* name, size_t size) {
    return guard("device_name", [&] {
        DeviceContext& ctx = device_context(device);
        cudaDeviceProp props;
        CUDA_CHECK(cudaGetDeviceProperties(&props, ctx.ordinal));
        if (size) std::snprintf(name, size, "%s", props.name);
    });
}

int LLAISYS_FN(mem_info)(int device, size_t* free_bytes, size_t* total_bytes) {
    return guard("mem_info", [&] {
        device_context(device);
        CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
    });
}

int LLAISYS_FN(device_synchronize)(int device) {
    return guard("device_synchronize", [&] {
        refuse_while_capturing("device_synchronize");
        DeviceContext& ctx = device_context(device);
        CUDA_CHECK(cudaDeviceSynchronize());
        check_kernel_errors(ctx);
    });
}

int LLAISYS_FN(malloc)(int device, size_t nbytes, void** ptr) {
    *ptr = nullptr;
    return guard("malloc", [&] {
        refuse_while_capturing("malloc");
        device_context(device);
        if (nbytes == 0) return;  // malloc(0): NULL
        const cudaError_t err = cudaMalloc(ptr, nbytes);
        if (err == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();
            *ptr = nullptr;
            throw OutOfMemory("out of device memory allocating " + std::to_string(nbytes) + " bytes");
        }
        CUDA_CHECK(err);
    });
}

int LLAISYS_FN(free)(int device, void* ptr) {
    return guard("free", [&] {
        refuse_while_capturing("free");
        device_context(device);
        if (ptr) CUDA_CHECK(cudaFree(ptr));
    });
}

int LLAISYS_FN(malloc_host)(size_t nbytes, void** ptr) {
    *ptr = nullptr;
    return guard("malloc_host", [&] {
        refuse_while_capturing("malloc_host");
        if (nbytes == 0) return;
        const cudaError_t err = cudaMallocHost(ptr, nbytes);
        if (err == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();
            *ptr = nullptr;
            throw OutOfMemory("out of pinned host memory allocating " + std::to_string(nbytes) + " bytes");
        }
        CUDA_CHECK(err);
    });
}

int LLAISYS_FN(free_host)(void* ptr) {
    return guard("free_host", [&] {
        refuse_while_capturing("free_host");
        if (ptr) CUDA_CHECK(cudaFreeHost(ptr));
    });
}

int LLAISYS_FN(memset)(int device, void* ptr, int value, size_t nbytes, void* stream) {
    return guard("memset", [&] {
        StreamContext& s = stream_context(device, stream);
        if (nbytes) CUDA_CHECK(cudaMemsetAsync(ptr, value, nbytes, s.stream));
    });
}

int LLAISYS_FN(memcpy)(int device, void* dst, const void* src, size_t nbytes, int kind) {
    return guard("memcpy", [&] {
        refuse_while_capturing("memcpy (synchronous)");
        const cudaMemcpyKind k = memcpy_kind(kind);
        DeviceContext& ctx = device_context(device);
        if (nbytes == 0) return;
        if (k == cudaMemcpyHostToHost) {
            std::memmove(dst, src, nbytes);
            return;
        }
        CUDA_CHECK(cudaMemcpy(dst, src, nbytes, k));
        if (k == cudaMemcpyDeviceToHost) check_kernel_errors(ctx);  // a read back: where errors surface
    });
}

int LLAISYS_FN(memcpy_async)(int device, void* dst, const void* src, size_t nbytes, int kind, void* stream) {
    return guard("memcpy_async", [&] {
        const cudaMemcpyKind k = memcpy_kind(kind);
        StreamContext& s = stream_context(device, stream);
        if (nbytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, k, s.stream));
    });
}

int LLAISYS_FN(memcpy_peer)(int dst_device, void* dst, int src_device, const void* src, size_t nbytes,
                            void* stream) {
    return guard("memcpy_peer", [&] {
        const int dst_ordinal = device_context(dst_device).ordinal;
        StreamContext& s = stream_context(src_device, stream);
        const int src_ordinal = device_context(src_device).ordinal;
        if (nbytes) CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_ordinal, src, src_ordinal, nbytes, s.stream));
    });
}

int LLAISYS_FN(stream_create)(int device, void** stream) {
    *stream = nullptr;
    return guard("stream_create", [&] { *stream = create_stream_context(device); });
}

int LLAISYS_FN(stream_destroy)(int device, void* stream) {
    return guard("stream_destroy", [&] {
        if (!stream) return;  // the default stream is not destroyed
        StreamContext& s = stream_context(device, stream);
        if (s.capturing_thread) {  // a capture left open: end it and drop what it recorded
            cudaGraph_t g = nullptr;
            (void)cudaStreamEndCapture(s.stream, &g);
            if (g) (void)cudaGraphDestroy(g);
            (void)cudaGetLastError();
            capture_ended(s);
        }
        refuse_while_capturing("stream_destroy");
        destroy_stream_context(&s);
    });
}

int LLAISYS_FN(stream_synchronize)(int device, void* stream) {
    return guard("stream_synchronize", [&] {
        refuse_while_capturing("stream_synchronize");
        StreamContext& s = stream_context(device, stream);
        CUDA_CHECK(cudaStreamSynchronize(s.stream));
        check_kernel_errors(device_context(device));
    });
}

// ---- events ------------------------------------------------------------------------------------------

int LLAISYS_FN(event_create)(int device, void** event) {
    *event = nullptr;
    return guard("event_create", [&] {
        device_context(device);
        cudaEvent_t e = nullptr;
        CUDA_CHECK(cudaEventCreate(&e));
        *event = e;
    });
}

int LLAISYS_FN(event_destroy)(int device, void* event) {
    return guard("event_destroy", [&] {
        device_context(device);
        if (event) CUDA_CHECK(cudaEventDestroy(static_cast<cudaEvent_t>(event)));
    });
}

int LLAISYS_FN(event_record)(int device, void* event, void* stream) {
    return guard("event_record", [&] {
        StreamContext& s = stream_context(device, stream);
        CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), s.stream));
    });
}

int LLAISYS_FN(event_synchronize)(int device, void* event) {
    return guard("event_synchronize", [&] {
        refuse_while_capturing("event_synchronize");
        DeviceContext& ctx = device_context(device);
        CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
        check_kernel_errors(ctx);
    });
}

int LLAISYS_FN(event_elapsed_ms)(int device, void* start, void* end, float* ms) {
    return guard("event_elapsed_ms", [&] {
        device_context(device);
        CUDA_CHECK(cudaEventElapsedTime(ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)));
    });
}

int LLAISYS_FN(stream_wait_event)(int device, void* stream, void* event) {
    return guard("stream_wait_event", [&] {
        StreamContext& s = stream_context(device, stream);
        CUDA_CHECK(cudaStreamWaitEvent(s.stream, static_cast<cudaEvent_t>(event), 0));
    });
}

// ---- graphs ------------------------------------------------------------------------------------------
// Optional slots: a runtime that lacks graph capture (some CoreX releases) answers cudaErrorNotSupported,
// which these slots report as LLAISYS_NOT_SUPPORTED (check.cu), as they do for stream_wait_event.

int LLAISYS_FN(graph_begin_capture)(int device, void* stream) {
    return guard("graph_begin_capture", [&] {
        require_stream_for_capture(stream);
        StreamContext& s = stream_context(device, stream);
        if (s.capturing_thread) throw InvalidArgument("this stream is already being captured");
        // thread-local mode: only this thread's unsafe calls could break it, and refuse_while_capturing stops them
        CUDA_CHECK(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal));
        s.capturing_thread = &t_capturing_streams;
        ++t_capturing_streams;
    });
}

int LLAISYS_FN(graph_end_capture)(int device, void* stream, void** graph) {
    *graph = nullptr;
    return guard("graph_end_capture", [&] {
        require_stream_for_capture(stream);
        StreamContext& s = stream_context(device, stream);
        if (!s.capturing_thread) throw InvalidArgument("this stream is not being captured (graph_begin_capture first)");
        cudaGraph_t g = nullptr;
        const cudaError_t end_err = cudaStreamEndCapture(s.stream, &g);
        capture_ended(s);  // the capture is over, recorded or not
        CUDA_CHECK(end_err);
        cudaGraphExec_t exec = nullptr;
        const cudaError_t err = graph_instantiate(&exec, g);
        if (err != cudaSuccess) {
            (void)cudaGraphDestroy(g);
            throw_cuda_error(err, "cudaGraphInstantiate");
        }
        *graph = new Graph{device, g, exec};
    });
}

int LLAISYS_FN(graph_launch)(int device, void* graph, void* stream) {
    return guard("graph_launch", [&] {
        StreamContext& s = stream_context(device, stream);
        auto* g = static_cast<Graph*>(graph);
        if (!g || g->device != device) throw InvalidArgument("not a graph of device " + std::to_string(device));
        CUDA_CHECK(cudaGraphLaunch(g->exec, s.stream));
    });
}

int LLAISYS_FN(graph_destroy)(int device, void* graph) {
    return guard("graph_destroy", [&] {
        device_context(device);
        auto* g = static_cast<Graph*>(graph);
        if (!g) return;
        const cudaError_t exec_err = cudaGraphExecDestroy(g->exec);
        const cudaError_t graph_err = cudaGraphDestroy(g->graph);
        delete g;
        CUDA_CHECK(exec_err);
        CUDA_CHECK(graph_err);
    });
}
