#include "context.h"

#include <dlfcn.h>
#include <glob.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>

namespace llaisys::cuda {

// ---- which devices this build can use -------------------------------------------------------------

#ifndef LLAISYS_CUDA_SASS
#define LLAISYS_CUDA_SASS ""  // comma-separated compute capabilities with machine code, e.g. "80,90"
#endif
#ifndef LLAISYS_CUDA_PTX
#define LLAISYS_CUDA_PTX ""  // compute capabilities with PTX (JIT-compiled for newer GPUs)
#endif
#ifndef LLAISYS_COREX_ARCHS
#define LLAISYS_COREX_ARCHS ""  // CoreX: comma-separated architectures, e.g. "ivcore11,ivcore20"
#endif

namespace {

std::vector<std::string> split_list(const char* text) {
    std::vector<std::string> items;
    std::stringstream in(text);
    std::string item;
    while (std::getline(in, item, ','))
        if (!item.empty()) items.push_back(item);
    return items;
}

std::vector<int> parse_list(const char* text) {
    std::vector<int> values;
    for (const std::string& item : split_list(text)) values.push_back(std::stoi(item));
    return values;
}

#if defined(LLAISYS_COREX_CONFIG)
// CoreX code runs on its own architecture only. A capability compat.h cannot name is let through (the first
// launch then says whether the code runs), as is a build that did not record its architectures.
bool runs_on(int capability) {
    const std::vector<std::string> archs = split_list(LLAISYS_COREX_ARCHS);
    const char* arch = corex_arch_of(capability);
    if (archs.empty() || !arch) return true;
    for (const std::string& a : archs)
        if (a == arch) return true;
    return false;
}

// The value of kArchOption that builds code for a device of this capability.
std::string arch_option_for(int capability) {
    const char* arch = corex_arch_of(capability);
    return arch ? arch : "?";
}
#else
// Machine code for sm_XY runs on sm_XZ with Z >= Y; PTX for compute_XY is compiled for any newer GPU.
bool runs_on(int capability) {
    const std::vector<int> sass = parse_list(LLAISYS_CUDA_SASS), ptx = parse_list(LLAISYS_CUDA_PTX);
    if (sass.empty() && ptx.empty()) return true;  // not recorded (a host-execution or ad-hoc build)
    for (int s : sass)
        if (s / 10 == capability / 10 && s <= capability) return true;
    for (int p : ptx)
        if (p <= capability) return true;
    return false;
}

std::string arch_option_for(int capability) { return std::to_string(capability); }
#endif

// What the kernel driver's device nodes say when the runtime sees no GPU: none at all (the driver is not
// loaded, or a container was started without the devices), or some although the runtime counts none.
std::string device_node_note() {
    glob_t found{};
    std::string first;
    if (glob(kDeviceNodes, 0, nullptr, &found) == 0 && found.gl_pathc > 0) first = found.gl_pathv[0];
    globfree(&found);
    if (first.empty())
        return std::string(" and there is no ") + kDeviceNodes + " device node: the " + kVendor +
               " kernel driver is not loaded, or this container was started without the GPUs (" + kListTool +
               " lists the GPUs the driver sees)";
    return " although " + first + " exists: " + kListTool + " lists the GPUs the driver sees";
}

std::string no_gpu_reason() { return std::string("no ") + kVendor + " GPU: the runtime reports none" + device_node_note(); }

// Why cudaGetDeviceCount failed, in words a user can act on.
std::string describe_count_error(cudaError_t err) {
    if (err == cudaErrorNoDevice) return no_gpu_reason();
    if (err == cudaErrorInsufficientDriver) {
        // The runtime says this when there is no driver at all, too: look for it ourselves.
        void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
        if (!driver)
            return std::string("no ") + kVendor + " driver (libcuda.so.1 cannot be loaded): install the " + kVendor +
                   " driver (" + kListTool + " should list the GPU)";
        using GetVersion = int (*)(int*);
        int version = 0;
        auto get_version = reinterpret_cast<GetVersion>(dlsym(driver, "cuDriverGetVersion"));
        const bool known = get_version && get_version(&version) == 0;
        dlclose(driver);
        int runtime = 0;
        (void)cudaRuntimeGetVersion(&runtime);
        std::ostringstream out;
        out << kVendor << " driver too old: it supports CUDA ";
        if (known) out << version / 1000 << "." << (version % 1000) / 10;
        else out << "(unknown version)";
        out << ", this build needs CUDA " << runtime / 1000 << "." << (runtime % 1000) / 10 << ": update the driver";
        return out.str();
    }
    return std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
}

struct DeviceList {
    std::vector<int> ordinals;
    std::string reason;  // why some or all devices are not usable ("" if every one is)
};

// A device is usable when this build's kernels run on it: the warp size they were written for, an
// architecture the build has code for, and blocks of kMinBlockThreads (the device reports the other limits).
DeviceList probe_devices() {
    DeviceList list;
    int count = 0;  // cudaGetDeviceCount leaves it untouched on failure
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        list.reason = describe_count_error(err);
        return list;
    }
    if (count == 0) list.reason = no_gpu_reason();
    for (int ordinal = 0; ordinal < count; ++ordinal) {
        int warp = 0, major = 0, minor = 0, max_threads = 0;
        cudaDeviceProp props;
        std::memset(&props, 0, sizeof(props));
        if (cudaDeviceGetAttribute(&warp, cudaDevAttrWarpSize, ordinal) != cudaSuccess ||
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal) != cudaSuccess ||
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ordinal) != cudaSuccess ||
            cudaDeviceGetAttribute(&max_threads, cudaDevAttrMaxThreadsPerBlock, ordinal) != cudaSuccess ||
            cudaGetDeviceProperties(&props, ordinal) != cudaSuccess) {
            (void)cudaGetLastError();
            list.reason += "device " + std::to_string(ordinal) + " cannot be queried; ";
            continue;
        }
        const int capability = major * 10 + minor;
        const std::string name = std::string("device ") + std::to_string(ordinal) + " (" + props.name +
                                 ", compute capability " + std::to_string(major) + "." + std::to_string(minor) + ")";
        if (warp != WARP_SIZE) {
            list.reason += name + " has warps of " + std::to_string(warp) + " threads, this build's kernels assume " +
                           std::to_string(WARP_SIZE) + "; ";
        } else if (!runs_on(capability)) {
            list.reason += name + " is not among this build's architectures (" + built_architectures() +
                           "): rebuild with " + kArchOption + "=" + arch_option_for(capability) + "; ";
        } else if (max_threads < kMinBlockThreads) {
            list.reason += name + " allows " + std::to_string(max_threads) + " threads per block, the kernels need " +
                           std::to_string(kMinBlockThreads) + "; ";
        } else {
            list.ordinals.push_back(ordinal);
        }
    }
    return list;
}

const DeviceList& device_list() {
    static const DeviceList list = probe_devices();
    return list;
}

// ---- contexts ----------------------------------------------------------------------------------------

void free_quietly(void* device_ptr) {
    if (device_ptr) (void)cudaFree(device_ptr);
}

void init_stream_context(StreamContext& ctx, int device, cudaStream_t stream) {
    ctx.device = device;
    ctx.stream = stream;
    try {
        CUBLAS_CHECK(cublasCreate(&ctx.cublas));
        CUBLAS_CHECK(cublasSetStream(ctx.cublas, stream));
        CUBLAS_CHECK(cublasSetPointerMode(ctx.cublas, CUBLAS_POINTER_MODE_HOST));
        CUDA_CHECK(cudaMalloc(&ctx.cublas_workspace, kCublasWorkspaceBytes));
        CUBLAS_CHECK(set_cublas_workspace(ctx.cublas, ctx.cublas_workspace, kCublasWorkspaceBytes));
        CUDA_CHECK(cudaMalloc(&ctx.workspace, op_workspace_bytes()));
        ctx.workspace_bytes = op_workspace_bytes();
    } catch (...) {
        if (ctx.cublas) (void)cublasDestroy(ctx.cublas);
        free_quietly(ctx.cublas_workspace);
        free_quietly(ctx.workspace);
        ctx = StreamContext{};
        throw;
    }
}

void release_stream_context(StreamContext& ctx) {
    if (ctx.cublas) (void)cublasDestroy(ctx.cublas);
    free_quietly(ctx.cublas_workspace);
    free_quietly(ctx.workspace);
}

std::unique_ptr<DeviceContext> create_device_context(int index, int ordinal) {
    auto ctx = std::make_unique<DeviceContext>();
    ctx->index = index;
    ctx->ordinal = ordinal;
    CUDA_CHECK(cudaSetDevice(ordinal));
    int value = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&value, cudaDevAttrMultiProcessorCount, ordinal));
    ctx->sm_count = value;
    CUDA_CHECK(cudaDeviceGetAttribute(&value, cudaDevAttrMaxThreadsPerBlock, ordinal));
    ctx->max_threads_per_block = value;
    CUDA_CHECK(cudaDeviceGetAttribute(&value, cudaDevAttrMaxSharedMemoryPerBlock, ordinal));
    ctx->max_shared_per_block = size_t(value);
    if (cudaDeviceGetAttribute(&value, cudaDevAttrMaxSharedMemoryPerBlockOptin, ordinal) != cudaSuccess) {
        (void)cudaGetLastError();
        value = int(ctx->max_shared_per_block);
    }
    ctx->max_shared_per_block_optin = size_t(value);

    // The kernel-error record: host-mapped memory where the device allows it, else device memory.
    void* host = nullptr;
    if (cudaHostAlloc(&host, sizeof(KernelErrorRecord), cudaHostAllocMapped) == cudaSuccess) {
        void* dev = nullptr;
        if (cudaHostGetDevicePointer(&dev, host, 0) == cudaSuccess) {
            std::memset(host, 0, sizeof(KernelErrorRecord));
            ctx->error_host = static_cast<KernelErrorRecord*>(host);
            ctx->error_device = static_cast<KernelErrorRecord*>(dev);
            ctx->error_mapped = true;
        } else {
            (void)cudaFreeHost(host);
        }
    }
    (void)cudaGetLastError();
    if (!ctx->error_mapped) {
        void* dev = nullptr;
        CUDA_CHECK(cudaMalloc(&dev, sizeof(KernelErrorRecord)));
        CUDA_CHECK(cudaMemset(dev, 0, sizeof(KernelErrorRecord)));
        ctx->error_device = static_cast<KernelErrorRecord*>(dev);
        ctx->error_host = new KernelErrorRecord{};
    }
    init_stream_context(ctx->default_stream, index, nullptr);
    return ctx;
}

struct Contexts {
    std::vector<std::once_flag> once;
    std::vector<std::unique_ptr<DeviceContext>> devices;
    explicit Contexts(size_t n) : once(n), devices(n) {}
};

Contexts& contexts() {
    static Contexts all(device_list().ordinals.size());
    return all;
}

std::mutex g_error_mutex;

}  // namespace

int64_t env_positive(const char* name) {
    const char* text = std::getenv(name);
    const long long value = text ? std::atoll(text) : 0;
    return value > 0 ? int64_t(value) : 0;
}

size_t op_workspace_bytes() {
    static const size_t bytes = [] {
        const int64_t value = env_positive("LLAISYS_CUDA_WORKSPACE_BYTES");
        return value > 0 ? size_t(value) : size_t(16) << 20;
    }();
    return bytes;
}

const std::vector<int>& usable_devices() { return device_list().ordinals; }
const std::string& usable_devices_reason() { return device_list().reason; }

const char* built_architectures() {
    static const std::string text = [] {
        std::string s;
        for (const std::string& a : split_list(LLAISYS_COREX_ARCHS)) s += (s.empty() ? "" : " ") + a;
        for (int a : parse_list(LLAISYS_CUDA_SASS)) s += (s.empty() ? "sm_" : " sm_") + std::to_string(a);
        for (int a : parse_list(LLAISYS_CUDA_PTX)) s += (s.empty() ? "compute_" : " compute_") + std::to_string(a);
        return s.empty() ? std::string("unrecorded") : s;
    }();
    return text.c_str();
}

DeviceContext& device_context(int device) {
    const std::vector<int>& ordinals = usable_devices();
    if (device < 0 || size_t(device) >= ordinals.size())
        throw InvalidArgument("no device " + std::to_string(device) + " (this backend has " +
                              std::to_string(ordinals.size()) + ")");
    Contexts& all = contexts();
    std::call_once(all.once[size_t(device)],
                   [&] { all.devices[size_t(device)] = create_device_context(device, ordinals[size_t(device)]); });
    DeviceContext& ctx = *all.devices[size_t(device)];
    CUDA_CHECK(cudaSetDevice(ctx.ordinal));
    return ctx;
}

StreamContext& stream_context(int device, void* stream) {
    DeviceContext& ctx = device_context(device);
    if (!stream) return ctx.default_stream;
    auto* s = static_cast<StreamContext*>(stream);
    if (s->device != device)
        throw InvalidArgument("the stream belongs to device " + std::to_string(s->device) + ", not " +
                              std::to_string(device));
    return *s;
}

StreamContext* create_stream_context(int device) {
    device_context(device);
    cudaStream_t stream = nullptr;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    auto ctx = std::make_unique<StreamContext>();
    try {
        init_stream_context(*ctx, device, stream);
    } catch (...) {
        (void)cudaStreamDestroy(stream);
        throw;
    }
    return ctx.release();
}

void destroy_stream_context(StreamContext* ctx) {
    device_context(ctx->device);
    const cudaStream_t stream = ctx->stream;
    release_stream_context(*ctx);
    delete ctx;
    CUDA_CHECK(cudaStreamDestroy(stream));
}

// The paged op a kernel error came from: the quantized caches' ops (6.3) and the latent attention (6.4) share the
// checks, under their own codes.
static std::string paged_op(const char* op, bool quantized) { return std::string(op) + (quantized ? "_q" : ""); }
static std::string paged_attention_op(int code) {
    switch (code) {
        case kPagedQQueryStart:
        case kPagedQSeqLen:
        case kPagedQBlockId: return "paged_attention_q";
        case kPagedLatentQueryStart:
        case kPagedLatentSeqLen:
        case kPagedLatentBlockId: return "paged_latent_attention";
        default: return "paged_attention";
    }
}

void check_kernel_errors(DeviceContext& ctx) {
    std::lock_guard<std::mutex> lock(g_error_mutex);
    KernelErrorRecord record;
    if (ctx.error_mapped) {
        const volatile KernelErrorRecord* r = ctx.error_host;
        record.code = r->code;
        if (record.code == kNoKernelError) return;
        record.a = r->a;
        record.b = r->b;
        record.c = r->c;
        std::memset(ctx.error_host, 0, sizeof(KernelErrorRecord));
    } else {
        CUDA_CHECK(cudaMemcpy(&record, ctx.error_device, sizeof(record), cudaMemcpyDeviceToHost));
        if (record.code == kNoKernelError) return;
        CUDA_CHECK(cudaMemset(ctx.error_device, 0, sizeof(record)));
    }
    switch (record.code) {
        case kEmbeddingIndexOutOfRange:
            throw InvalidArgument("embedding: index value " + std::to_string(record.a) + " at position " +
                                  std::to_string(record.b) + " is out of range [0, " + std::to_string(record.c) +
                                  ") for a weight of " + std::to_string(record.c) + " rows");
        case kSampleNaN:
            throw InvalidArgument("sample: logits[" + std::to_string(record.a) + "] is NaN");
        case kSampleAllNegInf:
            throw InvalidArgument("sample: every logit is -inf: nothing can be sampled");
        case kPagedSlotOutOfRange:
        case kPagedQSlotOutOfRange:
            throw InvalidArgument(paged_op("paged_kv_write", record.code == kPagedQSlotOutOfRange) +
                                  ": slot_mapping[" + std::to_string(record.b) + "] = " +
                                  std::to_string(record.a) + " is past the cache's " + std::to_string(record.c) +
                                  " slots (nothing was written)");
        case kPagedQueryStart:
        case kPagedQQueryStart:
        case kPagedLatentQueryStart:
            throw InvalidArgument(paged_attention_op(record.code) +
                                  ": query_start[" + std::to_string(record.b) + "] = " +
                                  std::to_string(record.a) + " breaks 0 <= query_start[0] <= ... <= query_start" +
                                  "[num_seqs] <= " + std::to_string(record.c) + " (the query rows)");
        case kPagedSeqLen:
        case kPagedQSeqLen:
        case kPagedLatentSeqLen:
            throw InvalidArgument(paged_attention_op(record.code) +
                                  ": seq_lens[" + std::to_string(record.b) + "] = " +
                                  std::to_string(record.a) + " is below the sequence's query rows or above " +
                                  "max_blocks * block_size = " + std::to_string(record.c));
        case kMoeExpertOutOfRange:
            throw InvalidArgument("moe_linear: experts[" + std::to_string(record.b) + ", " + std::to_string(record.c) +
                                  "] = " + std::to_string(record.a) + " is not an expert id (its row was not written)");
        case kPagedBlockId:
        case kPagedQBlockId:
        case kPagedLatentBlockId:
            throw InvalidArgument(paged_attention_op(record.code) +
                                  ": block_tables entry " + std::to_string(record.b) + " = " +
                                  std::to_string(record.a) + " is not a block in [0, " + std::to_string(record.c) +
                                  ")");
        case kPenaltyIdOutOfRange:
            throw InvalidArgument("penalize_logits: ids[" + std::to_string(record.b) + "] = " +
                                  std::to_string(record.a) + " is not a token id in [0, " + std::to_string(record.c) +
                                  ") (nothing was written)");
        case kPenaltyIdsNotIncreasing:
            throw InvalidArgument("penalize_logits: ids[" + std::to_string(record.b) + "] = " +
                                  std::to_string(record.a) + " is not above ids[" + std::to_string(record.b - 1) +
                                  "] = " + std::to_string(record.c) +
                                  ": ids must be strictly increasing, each id once (nothing was written)");
        case kPenaltyNegativeCount:
            throw InvalidArgument("penalize_logits: counts[" + std::to_string(record.b) + "] = (" +
                                  std::to_string(record.a) + ", " + std::to_string(record.c) +
                                  ") is negative (nothing was written)");
        case kLogprobsNoDistribution:
            throw InvalidArgument(record.a == 2 ? std::string("logprobs: every logit is -inf")
                                                : "logprobs: logits[" + std::to_string(record.b) + "] is " +
                                                      (record.a == 0 ? "NaN" : "+inf: no finite log-probabilities"));
        case kGqPermOutOfRange:
            throw InvalidArgument("linear_gq: perm[" + std::to_string(record.b) + "] = " + std::to_string(record.a) +
                                  " is outside [0, " + std::to_string(record.c) + ") (position " +
                                  std::to_string(record.b) + "; out is undefined)");
        case kLoraShrinkAdapterOutOfRange:
        case kLoraExpandAdapterOutOfRange:
            throw InvalidArgument(std::string(record.code == kLoraShrinkAdapterOutOfRange ? "lora_shrink"
                                                                                           : "lora_expand") +
                                  ": adapters[" + std::to_string(record.b) + "] = " + std::to_string(record.a) +
                                  " is not an adapter slot in [-1, " + std::to_string(record.c) +
                                  ") (its row was not written)");
        default:
            throw InvalidArgument("a kernel reported error code " + std::to_string(record.code));
    }
}

}  // namespace llaisys::cuda
