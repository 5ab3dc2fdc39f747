/*
 * llaisys/backend.h — the C ABI between llaisys-core and a compiled backend library.
 *
 * This header is the single definition of that ABI. llaisys-core ships it
 * (`llaisys.get_include()` is the folder that holds `llaisys/backend.h`); core's
 * Python tables (llaisys/abi.py: native.py binds with them, dtype.py takes its codes from
 * them) are tested against it by tests/core/test_abi_header.py.
 * It is plain C, usable from C, C++ and CUDA C++.
 *
 * Export names. A backend compiles its sources with `-DLLAISYS_PREFIX=<prefix>`
 * (e.g. llaisys_cpu, llaisys_cuda, llaisys_iluvatar) and defines every slot as
 * `LLAISYS_FN(name)`, which expands to `<prefix>_<name>`. One source tree thus
 * builds several libraries. Core binds them with NativeBackend(name, library, prefix).
 *
 * Conventions for every slot:
 *   - Returns a llaisys_status_t (except api_version, last_error and build_info).
 *     On failure, <prefix>_last_error() returns a message naming the call and the
 *     cause; core raises it as LlaisysError (LlaisysValueError for
 *     LLAISYS_INVALID_ARGUMENT). No C++ exception, abort() or exit() ever crosses
 *     the boundary.
 *   - `device` is the device index, 0 <= device < device_count.
 *   - `stream` is a handle from stream_create, or NULL for the device's default
 *     stream. Work "queued on stream" may still run after the call returns;
 *     host-addressable backends (the CPU) run everything before returning.
 *   - Thread safety: every slot may be called from any thread. A stream, event or
 *     graph must not be used by two threads at once. last_error is thread-local.
 *   - [required] slots must be exported, or the library fails to load.
 *     [optional] slots may be missing: core reports the capability as "not
 *     supported" and never fails to load because of it.
 *     [op] slots are operators: a missing one runs on the CPU backend (see "Partial backends"
 *     below), or is reported as "op not implemented by this backend" when first used where it cannot.
 *   - Operators: core has validated every argument (devices, dtypes, shapes,
 *     contiguity, aliasing, sizes that fit the buffers) before the call; kernels trust
 *     them and do no per-call re-validation. The one exception is data that only the
 *     kernel reads (token ids, block tables): a kernel never reads or writes outside
 *     its buffers because of such data and reports LLAISYS_INVALID_ARGUMENT instead
 *     (an asynchronous backend may report it at the next synchronizing call).
 *   - Operators queue their work on `stream`, allocate no device memory, and do not
 *     synchronize the host, so a sequence of them can be captured into a graph.
 *     Accumulation is in f32 for f16 / bf16 data.
 */
#ifndef LLAISYS_BACKEND_H
#define LLAISYS_BACKEND_H

#include <stddef.h>
#include <stdint.h>

/* ABI version, major.minor. A library's api_version() returns LLAISYS_API_VERSION, major * 1000 + minor, of
 * the header it was compiled with (a library built before minors existed returns its plain major, e.g. 6,
 * which core reads as 6.0). Core loads a library of its own major, whatever its minor:
 *   - built for an older minor, the library lacks the slots added since: core treats every slot added after
 *     the library's minor as missing, even where the library exports a function of that name (an [optional]
 *     capability is "not supported"; an [op] runs on the CPU backend, see "Partial backends" below);
 *   - built for a newer minor, it may export slots this core does not know: core ignores them.
 * A library of another major is refused with a one-line reason naming both versions and what to rebuild.
 *
 * Compatible changes: bump LLAISYS_API_VERSION_MINOR and list the slot below (and in llaisys.abi.SLOT_SINCE):
 *   - a new [optional] or [op] slot (slots are exported by name: where it is declared does not matter);
 *   - a new value at the end of an enum whose unknown values a library refuses (dtype, qformat, device
 *     attribute codes: LLAISYS_NOT_SUPPORTED), so an older library reports it instead of misreading it.
 * Breaking changes: bump LLAISYS_API_VERSION_MAJOR, set the minor to 0 and empty the list below:
 *   - a changed signature of a slot, or a changed meaning, layout or contract of an argument or a result
 *     (e.g. 5 -> 6: the q6_k blocks of linear_q reordered);
 *   - a removed or renamed slot, a removed or renumbered code;
 *   - a new [required] slot, or an [optional] / [op] slot made required.
 *
 * Slots added in a minor version of this major (each line "  <major>.<minor>: slot, slot"):
 *   6.1: linear_gq
 *   6.2: lora_shrink, lora_expand
 *   6.3: paged_kv_write_q, paged_attention_q, moe_linear_q
 *   6.4: paged_latent_attention, moe_router_grouped
 *
 * Partial backends: [op] slots are all optional in practice. Core runs an op whose slot a library lacks with
 * the CPU backend's kernel: in place on the same pointers where the device is host-addressable
 * (LLAISYS_ATTR_HOST_ADDRESSABLE, after synchronizing the op's stream), else on host copies of its buffers
 * (memcpy D2H, the CPU kernel, memcpy H2D of the buffers it writes). LLAISYS_FALLBACK=0 makes it an error. */
#define LLAISYS_API_VERSION_MAJOR 6
#define LLAISYS_API_VERSION_MINOR 4
#define LLAISYS_API_VERSION (LLAISYS_API_VERSION_MAJOR * 1000 + LLAISYS_API_VERSION_MINOR)

/* Bytes of a communicator's unique id (comm_unique_id; NCCL's ncclUniqueId is 128). */
#define LLAISYS_UNIQUE_ID_BYTES 128

/* Status codes returned by every slot. */
typedef enum llaisys_status {
    LLAISYS_OK = 0,
    LLAISYS_INVALID_ARGUMENT = 1, /* a bad argument: core raises LlaisysValueError */
    LLAISYS_RUNTIME_ERROR = 2,    /* the device or its driver failed */
    LLAISYS_OUT_OF_MEMORY = 3,    /* an allocation failed; core may free cached blocks and retry */
    LLAISYS_NOT_SUPPORTED = 4     /* a dtype, attribute or mode this backend does not implement */
} llaisys_status_t;

/* Element types (llaisys.DType.code). */
typedef enum llaisys_dtype {
    LLAISYS_F32 = 0,
    LLAISYS_F16 = 1,
    LLAISYS_BF16 = 2,
    LLAISYS_F64 = 3,
    LLAISYS_I8 = 4,
    LLAISYS_I32 = 5,
    LLAISYS_I64 = 6,
    LLAISYS_U8 = 7,
    LLAISYS_BOOL = 8
} llaisys_dtype_t;

/* Direction of a copy: H = host memory (pageable or pinned), D = this backend's device memory. */
typedef enum llaisys_memcpy_kind {
    LLAISYS_MEMCPY_H2H = 0,
    LLAISYS_MEMCPY_H2D = 1,
    LLAISYS_MEMCPY_D2H = 2,
    LLAISYS_MEMCPY_D2D = 3
} llaisys_memcpy_kind_t;

/* Where f16 / bf16 operators round (the `numerics` argument of the ops that take one). */
typedef enum llaisys_numerics {
    LLAISYS_NUMERICS_EXACT = 0, /* compute in f32, round once to the output dtype */
    LLAISYS_NUMERICS_HF = 1     /* f16 / bf16: round where HuggingFace transformers' default (sdpa) forward rounds */
} llaisys_numerics_t;

/* Weight formats of linear_q and embedding_q: llaisys' blocks of 16 rows, each format holding exactly the
 * values of the ggml type of the same name (the layouts: linear_q below; llaisys.ops.quant builds them). */
typedef enum llaisys_qformat {
    LLAISYS_QFORMAT_Q8_0 = 0, /* int8 q, f16 d per 32 k:                    w = d q */
    LLAISYS_QFORMAT_Q4_0 = 1, /* 4-bit u, f16 d per 32 k:                   w = d (u - 8) */
    LLAISYS_QFORMAT_Q4_1 = 2, /* 4-bit u, f16 d and m per 32 k:             w = d u + m */
    LLAISYS_QFORMAT_Q4_K = 3, /* 4-bit u, per 256 k f16 D, Dm, per 32 k 6-bit sc, mn: w = (D sc) u - (Dm mn) */
    LLAISYS_QFORMAT_Q6_K = 4  /* 6-bit q, per 256 k f16 D, per 16 k int8 sc:  w = (D sc) (q - 32) */
} llaisys_qformat_t;

/* Device attributes (device_attribute). */
typedef enum llaisys_device_attr {
    LLAISYS_ATTR_HOST_ADDRESSABLE = 0,       /* 1 if the host can read / write device pointers directly */
    LLAISYS_ATTR_WARP_SIZE = 1,              /* threads per warp (32 NVIDIA, 64 Iluvatar CoreX, 1 CPU) */
    LLAISYS_ATTR_MAX_THREADS_PER_BLOCK = 2,
    LLAISYS_ATTR_MULTIPROCESSOR_COUNT = 3,   /* SMs, or CPU threads the kernels use */
    LLAISYS_ATTR_TOTAL_MEMORY = 4,           /* bytes */
    LLAISYS_ATTR_COMPUTE_CAPABILITY = 5,     /* major * 10 + minor; 0 where it means nothing */
    LLAISYS_ATTR_MAX_SHARED_MEMORY_PER_BLOCK = 6 /* bytes */
} llaisys_device_attr_t;

#define LLAISYS_CAT2_(a, b) a##_##b
#define LLAISYS_CAT2(a, b) LLAISYS_CAT2_(a, b)
/* The exported name of slot `name`: <LLAISYS_PREFIX>_<name>. */
#define LLAISYS_FN(name) LLAISYS_CAT2(LLAISYS_PREFIX, name)

#ifdef __cplusplus
#define LLAISYS_EXTERN_C extern "C"
#else
#define LLAISYS_EXTERN_C
#endif
#if defined(_WIN32)
#define LLAISYS_VISIBLE __declspec(dllexport)
#else
#define LLAISYS_VISIBLE __attribute__((visibility("default")))
#endif
/* The three kinds of slot (see the conventions above); all are exported C functions. */
#define LLAISYS_REQUIRED LLAISYS_EXTERN_C LLAISYS_VISIBLE
#define LLAISYS_OPTIONAL LLAISYS_EXTERN_C LLAISYS_VISIBLE
#define LLAISYS_OP LLAISYS_EXTERN_C LLAISYS_VISIBLE

#ifdef LLAISYS_PREFIX

/* ---- identity ------------------------------------------------------------------------------ */

/* [required] LLAISYS_API_VERSION as compiled into the library; core refuses another major (see above). */
LLAISYS_REQUIRED int LLAISYS_FN(api_version)(void);

/* [required] The message of this thread's last failed call ("" if none). Valid until the next call. */
LLAISYS_REQUIRED const char* LLAISYS_FN(last_error)(void);

/* [optional] One line on what the library was built for (toolchain, architectures, SIMD paths). */
LLAISYS_OPTIONAL const char* LLAISYS_FN(build_info)(void);

/* ---- devices ------------------------------------------------------------------------------- */

/* [required] *count = number of usable devices. No hardware or no driver is not an error: return
 * LLAISYS_OK with *count = 0 and leave the reason (e.g. "no NVIDIA driver") in last_error(). */
LLAISYS_REQUIRED int LLAISYS_FN(device_count)(int* count);

/* [optional] *value = attribute `attr` (llaisys_device_attr_t) of `device`; LLAISYS_NOT_SUPPORTED
 * for an attribute this backend does not know. Backends without it are treated as host-addressable
 * only if they say so through this slot. */
LLAISYS_OPTIONAL int LLAISYS_FN(device_attribute)(int device, int attr, int64_t* value);

/* [optional] The device's name, NUL-terminated and truncated to fit `size` bytes of `name`. */
LLAISYS_OPTIONAL int LLAISYS_FN(device_name)(int device, char* name, size_t size);

/* [optional] Free and total device memory in bytes, as the driver sees it now. */
LLAISYS_OPTIONAL int LLAISYS_FN(mem_info)(int device, size_t* free_bytes, size_t* total_bytes);

/* [required] Wait until all work queued on every stream of `device` has finished. */
LLAISYS_REQUIRED int LLAISYS_FN(device_synchronize)(int device);

/* ---- memory -------------------------------------------------------------------------------- */

/* [required] Allocate `nbytes` of device memory, aligned to at least 256 bytes (64 on the CPU).
 * malloc(0) succeeds with a NULL or unique pointer. LLAISYS_OUT_OF_MEMORY when it cannot; the
 * message says how many bytes were asked for. Synchronous. */
LLAISYS_REQUIRED int LLAISYS_FN(malloc)(int device, size_t nbytes, void** ptr);

/* [required] Free a pointer from malloc; free(NULL) is a no-op. Waits for nothing: the caller must
 * not free memory that queued work still uses (core's allocator only hands it out again on the
 * same stream order). */
LLAISYS_REQUIRED int LLAISYS_FN(free)(int device, void* ptr);

/* [optional] Page-locked host memory for fast asynchronous copies; free_host(NULL) is a no-op. */
LLAISYS_OPTIONAL int LLAISYS_FN(malloc_host)(size_t nbytes, void** ptr);
LLAISYS_OPTIONAL int LLAISYS_FN(free_host)(void* ptr);

/* [required] Set `nbytes` bytes at device pointer `ptr` to `value`, queued on `stream`. */
LLAISYS_REQUIRED int LLAISYS_FN(memset)(int device, void* ptr, int value, size_t nbytes, void* stream);

/* [required] Copy `nbytes` (kind: llaisys_memcpy_kind_t). Returns when the copy is complete; it is
 * ordered after work queued on the default stream, not after other streams (synchronize those first). */
LLAISYS_REQUIRED int LLAISYS_FN(memcpy)(int device, void* dst, const void* src, size_t nbytes, int kind);

/* [required] The same copy queued on `stream`; host memory must stay valid until the stream has run
 * it (pinned host memory makes it truly asynchronous). */
LLAISYS_REQUIRED int LLAISYS_FN(memcpy_async)(int device, void* dst, const void* src, size_t nbytes, int kind,
                                              void* stream);

/* [optional] Copy between two devices of this backend without the host, queued on `stream` of the
 * source device. Core copies through the host when it is missing or fails. */
LLAISYS_OPTIONAL int LLAISYS_FN(memcpy_peer)(int dst_device, void* dst, int src_device, const void* src,
                                             size_t nbytes, void* stream);

/* ---- streams, events, graphs ----------------------------------------------------------------- */

/* [required] A new stream (an ordered queue of work) on `device`; destroy it when done. */
LLAISYS_REQUIRED int LLAISYS_FN(stream_create)(int device, void** stream);
LLAISYS_REQUIRED int LLAISYS_FN(stream_destroy)(int device, void* stream);

/* [required] Wait until all work queued on `stream` has finished. */
LLAISYS_REQUIRED int LLAISYS_FN(stream_synchronize)(int device, void* stream);

/* [optional] Events: markers in a stream, for cross-stream ordering and timing. */
LLAISYS_OPTIONAL int LLAISYS_FN(event_create)(int device, void** event);
LLAISYS_OPTIONAL int LLAISYS_FN(event_destroy)(int device, void* event);
/* Mark the point reached by the work queued on `stream` so far. */
LLAISYS_OPTIONAL int LLAISYS_FN(event_record)(int device, void* event, void* stream);
/* Wait on the host until the recorded point has been reached. */
LLAISYS_OPTIONAL int LLAISYS_FN(event_synchronize)(int device, void* event);
/* Milliseconds between two recorded, completed events. */
LLAISYS_OPTIONAL int LLAISYS_FN(event_elapsed_ms)(int device, void* start, void* end, float* ms);
/* Work queued on `stream` after this call waits for `event` (no host wait). */
LLAISYS_OPTIONAL int LLAISYS_FN(stream_wait_event)(int device, void* stream, void* event);

/* [optional] Graph capture: between begin and end, work queued on `stream` is recorded instead of
 * run; end returns an executable graph. Nothing may synchronize, allocate or copy to pageable host
 * memory during a capture. Replaying the graph (graph_launch) re-runs the same kernels with the same
 * pointers and scalar arguments; what changes between replays must live in device memory. */
LLAISYS_OPTIONAL int LLAISYS_FN(graph_begin_capture)(int device, void* stream);
LLAISYS_OPTIONAL int LLAISYS_FN(graph_end_capture)(int device, void* stream, void** graph);
LLAISYS_OPTIONAL int LLAISYS_FN(graph_launch)(int device, void* graph, void* stream);
LLAISYS_OPTIONAL int LLAISYS_FN(graph_destroy)(int device, void* graph);

/* ---- collectives ------------------------------------------------------------------------------ */
/* [optional] A communicator joins world_size ranks (processes, one device each) so that they can sum,
 * gather and share buffers of their devices (tensor parallelism). One rank gets a unique id from
 * comm_unique_id and hands it to the others by any means (llaisys.distributed: a TCP store); each then
 * calls comm_create with it, its rank and the world size. The collectives are queued on `stream` like
 * operators: recorded instead of run while the stream is being captured into a graph, so a captured
 * decode step replays its collectives too (every rank must then replay the same graphs in the same
 * order). Every rank must call the same collectives in the same order with the same sizes. A collective
 * whose peers do not all arrive within the communicator's timeout fails with LLAISYS_RUNTIME_ERROR
 * naming a rank that is late (an accelerator library may only detect it at the next synchronizing call,
 * or through comm_abort from another thread); the one exception is a non-root rank of comm_broadcast,
 * which waits for its root until the root arrives or the communicator is aborted (a follower waiting for
 * the next step's inputs may wait as long as the leader is idle). */

/* [optional] Fill id (LLAISYS_UNIQUE_ID_BYTES bytes) with a new unique id for comm_create, made by (and for
 * a communicator of) devices of this backend. LLAISYS_NOT_SUPPORTED when the collective library is missing,
 * with a message naming what to install. Synchronous. */
LLAISYS_OPTIONAL int LLAISYS_FN(comm_unique_id)(int device, char* id);

/* [optional] *comm = this process's member of the communicator `id` (from comm_unique_id, the same bytes on
 * every rank) as rank `rank` of `world_size` (0 <= rank < world_size), on `device`. Waits for every rank to
 * join, at most timeout_ms milliseconds (> 0), which also bounds each collective's wait for late peers.
 * LLAISYS_NOT_SUPPORTED when the collective library is missing (the message names what to install). */
LLAISYS_OPTIONAL int LLAISYS_FN(comm_create)(int device, const char* id, int rank, int world_size,
                                             int64_t timeout_ms, void** comm);

/* [optional] Leave and free `comm` (no collective of it may still be queued or running on this rank). */
LLAISYS_OPTIONAL int LLAISYS_FN(comm_destroy)(void* comm);

/* [optional] Make every pending and later collective of `comm` fail, on this rank and (where the library
 * can: shared memory, NCCL's abort) on the others, with `reason` (a NUL-terminated line) in their messages.
 * May be called from any thread, also while another thread waits in a collective of `comm`; comm_destroy
 * must still follow. */
LLAISYS_OPTIONAL int LLAISYS_FN(comm_abort)(void* comm, const char* reason);

/* [optional] out [n] = the sum over ranks 0, 1, ..., world_size - 1 of their in [n] (dtype f32 / f16 / bf16;
 * LLAISYS_NOT_SUPPORTED for any other), on every rank, queued on `stream`. out may be in (in place); no other
 * overlap. Host-addressable backends sum in that fixed order in f32 and round once, so the result has the
 * same bits on every rank and in every run. */
LLAISYS_OPTIONAL int LLAISYS_FN(comm_all_reduce)(int device, void* stream, void* comm, int dtype, int64_t n,
                                                 void* out, const void* in);

/* [optional] out [world_size * nbytes] = every rank's in [nbytes], rank r's at byte r * nbytes, on every rank,
 * queued on `stream`. out shares no memory with in. */
LLAISYS_OPTIONAL int LLAISYS_FN(comm_all_gather)(int device, void* stream, void* comm, int64_t nbytes, void* out,
                                                 const void* in);

/* [optional] data [nbytes] of rank `root` copied into data [nbytes] of every other rank, queued on `stream`. */
LLAISYS_OPTIONAL int LLAISYS_FN(comm_broadcast)(int device, void* stream, void* comm, int64_t nbytes, void* data,
                                                int root);

/* ---- operators ------------------------------------------------------------------------------ */
/* Every operator: int <prefix>_<op>(int device, void* stream, ...). Tensors are contiguous unless a
 * stride argument says otherwise; [a, b] is a shape; `dtype` is the dtype of the floating tensors.
 * A `void*` buffer is one the op may write, a `const void*` one it only reads: core's CPU fallback copies
 * back the former only (llaisys.buffers gives each buffer's bytes from the other arguments). */

/* [op] c = a + b over n elements. c may be a or b (exactly); no other overlap. */
LLAISYS_OP int LLAISYS_FN(add)(int device, void* stream, int dtype, int64_t n, void* c, const void* a,
                               const void* b);

/* [op] max_idx (int64 [1]) and max_val ([1]) of vals [n], n >= 1; first index on ties; NaN is the max.
 * No overlap between the three buffers. */
LLAISYS_OP int LLAISYS_FN(argmax)(int device, void* stream, int dtype, int64_t n, void* max_idx, void* max_val,
                                  const void* vals);

/* [op] out [n_index, dim] = weight [vocab, dim] rows at index (int64 [n_index]). An index outside
 * [0, vocab) is LLAISYS_INVALID_ARGUMENT naming it and its position, never a read outside weight.
 * out shares no memory with index or weight. */
LLAISYS_OP int LLAISYS_FN(embedding)(int device, void* stream, int dtype, int64_t n_index, int64_t dim, int64_t vocab,
                                     void* out, const void* index, const void* weight);

/* [op] out [M, N] = x [M, K] @ weight [N, K]^T + bias [N] (bias may be NULL). K may be 0.
 * out shares no memory with x, weight or bias. */
LLAISYS_OP int LLAISYS_FN(linear)(int device, void* stream, int dtype, int64_t M, int64_t N, int64_t K, void* out,
                                  const void* x, const void* weight, const void* bias);

/* [op] Linear with int8 weights: out [M, N] = x [M, K] @ w^T + bias [N] (bias may be NULL), where
 * w[n, k] = scale(n, k / 32) * q[n, k] for a symmetric int8 q [N, K] (values in [-127, 127]) and one bf16 scale
 * per row and group of 32 consecutive k (G = ceil(K / 32) groups, the last may be short). q and the scales come
 * in blocks of 16 rows (llaisys.ops.int8; rows past N and k past K are zeros, scale 0), each block one
 * sequential stream:
 *     weight int8 [NB, G, 8, 16, 4]: weight[b][g][s][r][i] = q[16 b + r, 32 g + 4 s + i], NB = ceil(N / 16)
 *     scales bf16 [NB, G, 16]:       scales[b][g][r] = scale(16 b + r, g)
 * so 64 consecutive bytes hold the same 4 k of 16 rows. Each row of x is quantized on the fly per the same
 * groups: sx[m, g] = max |x[m, k in g]| / 127 (f32), xq = round-half-to-even(x / sx) in [-127, 127] (0 where
 * sx = 0), and out[m, n] = sum over g in order of (scale(n, g) * sx[m, g]) * (sum_{k in g} q[n, k] * xq[m, k])
 * + bias[n]: integer dots exact in int32, the rest in f32, rounded once to `dtype` (the dtype of out, x and
 * bias). A row of out depends only on its row of x (the same bits alone or in a batch). A group of x holding
 * inf or NaN makes its row of out NaN. K may be 0 (out = bias, or 0). out shares no memory with x, weight,
 * scales or bias. */
LLAISYS_OP int LLAISYS_FN(linear_i8)(int device, void* stream, int dtype, int64_t M, int64_t N, int64_t K, void* out,
                                     const void* x, const void* weight, const void* scales, const void* bias);

/* Mixture of experts (a token's MLP is the weighted sum of the k experts its router picks of E):
 *     weights, experts = moe_router(x Wgate^T);  y[m, j] = expert_{experts[m, j]}(x[m]);  out[m] = sum_j w y
 * A row's result depends only on that row (and its expert weights), never on the other rows of the batch. */

/* [op] Router, per row of logits [M, E] (a token's expert scores): p = softmax(row) in f32; experts int64
 * [M, k] = the k largest logits in descending order (those of the k largest p), equal logits by ascending
 * expert id, NaN as -inf; weights [M, k] (the dtype of logits) = their p, or p / (sum of the k p) when
 * normalize is 1, rounded once. 1 <= k <= E. No overlap between the three buffers. */
LLAISYS_OP int LLAISYS_FN(moe_router)(int device, void* stream, int dtype, int64_t M, int64_t E, int64_t k,
                                      int normalize, void* weights, void* experts, const void* logits);

/* [op] Group-limited router (DeepSeek-V2 / V3), per row of logits [M, E], in f32 (6.4): s = softmax(row) (scoring 0)
 * or sigmoid(row) (scoring 1); c = s + bias (bias f32 [E], or NULL: c = s). With n_group > 1 the E experts are
 * n_group consecutive groups of E / n_group; a group scores the sum of its group_top largest c (V2: 1, its
 * max; V3: 2), the topk_group best groups are kept (equal scores by ascending group) and the others' experts
 * set to c = -inf. experts int64 [M, k] = the k largest c, descending, equal c by ascending expert id (NaN as
 * -inf); weights [M, k] (`dtype`) = their s (not c), divided by (their sum + 1e-20) when normalize is 1, times
 * route_scale, rounded once. logits are f32 whatever `dtype` (DeepSeek computes its router in f32). 1 <= k <= topk_group * E / n_group, E % n_group == 0, 1 <= topk_group
 * <= n_group, 1 <= group_top <= E / n_group. No overlap between the buffers. */
LLAISYS_OP int LLAISYS_FN(moe_router_grouped)(int device, void* stream, int dtype, int64_t M, int64_t E, int64_t k,
                                              int scoring, int64_t n_group, int64_t topk_group, int64_t group_top,
                                              int normalize, double route_scale, void* weights, void* experts,
                                              const void* logits, const void* bias);

/* [op] Grouped expert linear: out[m, j] = x_mj @ weight[experts[m, j]]^T for out [M, k, N], experts int64
 * [M, k], weight [E, N, K] (expert e's [N, K] matrix at weight + e * N * K) and x_mj = x[m] (x [M, K],
 * x_per_slot 0) or x[m, j] (x [M, k, K], x_per_slot 1). The rows are grouped by expert, so only the selected
 * experts' weights are read, each once for all the rows that chose it. Every output is a dot product summed
 * in one fixed order (as `linear` sums it), the same whatever else is in the batch. An expert id outside
 * [0, E) is LLAISYS_INVALID_ARGUMENT, its output row not written (the CPU refuses before writing anything;
 * an accelerator reports it at the next synchronizing call, as embedding does). K may be 0 (out = 0).
 * out shares no memory with x, weight or experts. */
LLAISYS_OP int LLAISYS_FN(moe_linear)(int device, void* stream, int dtype, int64_t M, int64_t k, int64_t E,
                                      int64_t N, int64_t K, int x_per_slot, void* out, const void* x,
                                      const void* weight, const void* experts);

/* [op] Weighted combine: out[m] = sum over j = 0, 1, ..., k - 1 in order of weights[m, j] * y[m, j], for
 * y [M, k, N], weights [M, k], out [M, N]; in f32, rounded once. out shares no memory with y or weights. */
LLAISYS_OP int LLAISYS_FN(moe_combine)(int device, void* stream, int dtype, int64_t M, int64_t k, int64_t N,
                                       void* out, const void* y, const void* weights);

/* [op] Strided copy dst[i...] = src[i...] of ndim <= 16 dims. shape, dst_strides and src_strides
 * (in elements) are host arrays of ndim int64; elem_size is 1, 2, 4, 8 or 16 bytes. dst shares no
 * memory with src (core does not call it for a copy of a view onto itself). */
LLAISYS_OP int LLAISYS_FN(rearrange)(int device, void* stream, int elem_size, int ndim, const int64_t* shape,
                                     void* dst, const int64_t* dst_strides, const void* src,
                                     const int64_t* src_strides);

/* [op] Per row of x [rows, dim]: out = x * weight / sqrt(mean(x^2) + eps), in f32 with r = 1 / sqrt(mean + eps).
 * weight_dtype is dtype (HF's Llama / Qwen2 RMSNorm: y = x * r rounded to dtype, then y * weight rounded again)
 * or LLAISYS_F32 with f16 / bf16 x (Gemma's RMSNorm, whose weight 1 + w is kept in f32: x * r * weight in f32,
 * rounded once). out may be x (exactly); no other overlap. */
LLAISYS_OP int LLAISYS_FN(rms_norm)(int device, void* stream, int dtype, int numerics, int weight_dtype, int64_t rows,
                                    int64_t dim, double eps, void* out, const void* x, const void* weight);

/* [op] Rotary embedding, half-split (rotate_half) layout. x, out [seq, heads, head_dim]; pos_ids int64
 * [seq]; inv_freq f32 [head_dim / 2]: the angle of pair j at position p is a = f32(f32(p) * inv_freq[j]),
 * and x is rotated by c = f32(cos(a) * f32(scale)), s = f32(sin(a) * f32(scale)), as HF computes them (the
 * table holds 1 / theta^(2j / head_dim) or a rope-scaling variant of it; scale is YaRN's attention factor,
 * else 1). out may be x (exactly); no other overlap. */
LLAISYS_OP int LLAISYS_FN(rope)(int device, void* stream, int dtype, int numerics, int64_t seq, int64_t heads,
                                int64_t head_dim, double scale, void* out, const void* x, const void* pos_ids,
                                const void* inv_freq);

/* [op] Causal GQA attention. q [L, H, d], k [S, Hkv, d], v [S, Hkv, dv], out [L, H, dv], S >= L;
 * head h reads kv head h / (H / Hkv); query i sees key j iff j <= i + S - L. d >= 1. out may be q or
 * v (exactly: the same pointer and shape); no other overlap. */
LLAISYS_OP int LLAISYS_FN(self_attention)(int device, void* stream, int dtype, int numerics, int64_t L, int64_t S,
                                          int64_t H, int64_t Hkv, int64_t d, int64_t dv, double scale, void* out,
                                          const void* q, const void* k, const void* v);

/* Paged KV cache (continuous batching). One layer's keys and values live in a pool of fixed-size blocks:
 * k_cache [num_blocks, block_size, Hkv, d], v_cache [num_blocks, block_size, Hkv, dv]. Position j of a
 * sequence is row (block_table[j / block_size], j % block_size). Every argument that changes from one
 * decode step to the next (which rows are written, the block tables, the lengths, where each sequence's
 * queries start) is device data, never a scalar, so a step captured into a graph replays with new values
 * loaded into the same buffers. */

/* [op] Attention of a batch of sequences over their paged keys and values, in one call. Sequence s owns
 * the query rows [query_start[s], query_start[s + 1]) of q [T, H, d] and out [T, H, dv]: L_s = the row
 * count, the rows being its last L_s positions; its keys are positions [0, seq_lens[s]) through row s of
 * block_tables int32 [num_seqs, max_blocks]. Causal per sequence, aligned bottom-right: its query i, at
 * position p = i + seq_lens[s] - L_s, sees key j iff j <= p, and with window > 0 (sliding-window attention)
 * only iff also j > p - window (the last `window` positions, its own included; window 0: no window). The keys
 * before the window of a sequence's first query row, less at most 63 (a kernel's block of 64 keys), are not
 * read, so a decode step costs the window. GQA: head h reads kv head h / (H / Hkv). seq_lens and
 * query_start are int32 [num_seqs] and [num_seqs + 1]. Rows of out outside every sequence are set to 0.
 * The kernel checks the data it reads (LLAISYS_INVALID_ARGUMENT, nothing read out of bounds):
 * 0 <= query_start[0] <= ... <= query_start[num_seqs] <= T, L_s <= seq_lens[s] <= max_blocks * block_size,
 * and 0 <= block id < num_blocks for the blocks a sequence with L_s > 0 reads (a sequence with L_s = 0,
 * padding, reads nothing). A query's result depends only on its own row and its sequence's keys: never on
 * the other sequences of the batch, on T or on how a prompt was cut into calls. out may be q; no other
 * overlap. */
LLAISYS_OP int LLAISYS_FN(paged_attention)(int device, void* stream, int dtype, int numerics, int64_t T,
                                           int64_t num_seqs, int64_t H, int64_t Hkv, int64_t d, int64_t dv,
                                           int64_t num_blocks, int64_t block_size, int64_t max_blocks,
                                           int64_t window, double scale, void* out, const void* q, const void* k_cache,
                                           const void* v_cache, const void* block_tables, const void* seq_lens,
                                           const void* query_start);

/* [op] Write the keys k [T, Hkv, d] and values v [T, Hkv, dv] of T tokens into the paged caches: token t
 * goes to row slot_mapping[t] (int64 [T]) of k_cache [num_slots, Hkv, d] and v_cache [num_slots, Hkv, dv],
 * num_slots = num_blocks * block_size (row = block * block_size + offset). A negative slot skips its token;
 * a slot >= num_slots is LLAISYS_INVALID_ARGUMENT before anything is written. Two tokens must not name the
 * same slot. The caches must not overlap k, v or slot_mapping. */
LLAISYS_OP int LLAISYS_FN(paged_kv_write)(int device, void* stream, int dtype, int64_t T, int64_t Hkv, int64_t d,
                                          int64_t dv, int64_t num_slots, void* k_cache, void* v_cache,
                                          const void* k, const void* v, const void* slot_mapping);

/* Quantized paged KV caches (6.3). Each (token, kv head) row of d keys (dv values) is stored as d (dv) bytes
 * and one f16 scale: k_cache uint8 [num_slots, Hkv, d] and k_scale f16 [num_slots, Hkv] (v likewise), with
 * num_slots = num_blocks * block_size. A stored byte b means x = decode(b) * scale, in f32. On write, in f32:
 * amax = max |x| over the row, scale = f16(amax / QMAX) (round to nearest even), then each byte encodes
 * x / scale (an f32 division) clamped to [-QMAX, QMAX], rounded to nearest even; a row whose f16 scale is 0
 * stores 0 bytes and scale 0. The scale is at most 65504 (f16's largest: larger rows saturate). The formats: */
typedef enum llaisys_kv_format {
    LLAISYS_KV_INT8 = 1,    /* int8 two's complement, QMAX = 127, decode(b) = (int8_t)b */
    LLAISYS_KV_FP8_E4M3 = 2 /* OCP float8 e4m3fn (bias 7, no infinities, 0x7f / 0xff NaN), QMAX = 448 */
} llaisys_kv_format_t;

/* [op] paged_kv_write into quantized caches of format kv_format (as paged_kv_write: slots, skips, the check
 * before anything is written, no overlap). dtype is k's and v's (F32 / F16 / BF16). */
LLAISYS_OP int LLAISYS_FN(paged_kv_write_q)(int device, void* stream, int dtype, int kv_format, int64_t T,
                                            int64_t Hkv, int64_t d, int64_t dv, int64_t num_slots, void* k_cache,
                                            void* v_cache, void* k_scale, void* v_scale, const void* k,
                                            const void* v, const void* slot_mapping);

/* [op] paged_attention (exact numerics) over quantized caches of format kv_format: every key and value read is
 * decoded to f32 as decode(b) * scale first; the rest of paged_attention's contract holds unchanged (the
 * masks, the window, the checks, batch invariance, out may be q). dtype is q's and out's. */
LLAISYS_OP int LLAISYS_FN(paged_attention_q)(int device, void* stream, int dtype, int kv_format, int64_t T,
                                             int64_t num_seqs, int64_t H, int64_t Hkv, int64_t d, int64_t dv,
                                             int64_t num_blocks, int64_t block_size, int64_t max_blocks,
                                             int64_t window, double scale, void* out, const void* q,
                                             const void* k_cache, const void* v_cache, const void* k_scale,
                                             const void* v_scale, const void* block_tables, const void* seq_lens,
                                             const void* query_start);

/* [op] Multi-head latent attention (DeepSeek's MLA) in its absorbed form, over a paged latent cache (6.4). Every
 * token keeps one latent row per layer: c [num_slots, dc] (the compressed keys and values, c_kv) and r
 * [num_slots, dr] (the rope key, shared by every head), num_slots = num_blocks * block_size, as paged_kv_write
 * writes them (Hkv = 1, d = dc, dv = dr). Head h of query row i (q [T, H, dc + dr], W_uk already folded into
 * its first dc values) scores key j as scale * (q[i, h, :dc] . c[j] + q[i, h, dc:] . r[j]) and out [T, H, dc]
 * = softmax(scores) @ c (W_uv is applied after). Sequences, causal masks, block tables, the checks of the index
 * data, rows of no sequence, exact numerics and batch invariance are paged_attention's with one kv head and no
 * window. out shares no memory with the other buffers. */
LLAISYS_OP int LLAISYS_FN(paged_latent_attention)(int device, void* stream, int dtype, int64_t T,
                                                  int64_t num_seqs, int64_t H, int64_t dc, int64_t dr,
                                                  int64_t num_blocks, int64_t block_size, int64_t max_blocks,
                                                  double scale, void* out, const void* q, const void* c_cache,
                                                  const void* r_cache, const void* block_tables,
                                                  const void* seq_lens, const void* query_start);

/* [op] out = up * gate / (1 + exp(-gate)) over n elements. out may be gate or up (exactly); no other
 * overlap. */
LLAISYS_OP int LLAISYS_FN(swiglu)(int device, void* stream, int dtype, int numerics, int64_t n, void* out,
                                  const void* gate, const void* up);

/* [op] Draw one token id (int64, written to out_idx [1]) from softmax(logits [n] / temperature),
 * restricted to the top_k largest (0 = all) and then the nucleus top_p. temperature 0 or top_k 1 is
 * argmax. The draw is a counter-based hash of seed: the same seed gives the same token every run.
 * out_idx shares no memory with logits. */
LLAISYS_OP int LLAISYS_FN(sample)(int device, void* stream, int dtype, int64_t n, void* out_idx,
                                  const void* logits, double temperature, int64_t top_k, double top_p,
                                  uint64_t seed);

/* [op] Constrained decoding: logits [rows, vocab] (in place) = -inf where the token is not allowed by
 * bitmask int32 [rows, ceil(vocab / 32)]: token t of row r is allowed iff bit t % 32 (least significant
 * first) of word bitmask[r][t / 32] is set (the packed layout of grammar libraries). Bits past vocab are
 * ignored; allowed logits are left as they are. logits shares no memory with bitmask. */
LLAISYS_OP int LLAISYS_FN(mask_logits)(int device, void* stream, int dtype, int64_t rows, int64_t vocab,
                                       void* logits, const void* bitmask);

/* [op] Adjust logits [vocab] in place at n token ids (ids int64 [n], strictly increasing, each in [0, vocab);
 * n may be 0): the logit bias, then the repetition, frequency and presence penalties. counts int64 [n, 2]
 * holds (p, g) = (occurrences of ids[i] in the prompt, occurrences among the generated tokens), both >= 0;
 * bias is f32 [n] or NULL (no bias). For each i, in f32 with the penalties rounded to f32:
 *     x = logits[ids[i]] + bias[i]
 *     if p + g > 0: x = x < 0 ? x * repetition : x / repetition      (HF transformers' repetition_penalty)
 *     x = x - g * frequency - (g > 0 ? presence : 0)                 (OpenAI's frequency / presence penalty)
 *     logits[ids[i]] = x rounded once to dtype.
 * ids and counts are data only the kernel reads: an id out of range or not above the one before, or a
 * negative count, is LLAISYS_INVALID_ARGUMENT naming its position, and nothing is written. logits shares no
 * memory with ids, counts or bias. */
LLAISYS_OP int LLAISYS_FN(penalize_logits)(int device, void* stream, int dtype, int64_t vocab, int64_t n,
                                           void* logits, const void* ids, const void* counts, const void* bias,
                                           double repetition, double frequency, double presence);

/* [op] Log-probabilities of logits [n] under softmax(logits / temperature) (temperature 0: the raw logits,
 * as greedy decoding's distribution), in f32 with a stable log-sum-exp: m = max(logits),
 * d_i = (logits_i - m) / t in f32 (t = temperature, or 1 when it is 0), S = sum exp(d_i),
 * log p_i = d_i - log S rounded to f32. values f32 [k + 1]: values[0] = log p of token `chosen` (in [0, n));
 * top_ids int64 [k] (NULL when k = 0) and values[1 + j]: the k (0 <= k <= 20, k <= n) most probable tokens,
 * logit descending, the lower id first among equals. A NaN or +inf logit, or all logits -inf, is
 * LLAISYS_INVALID_ARGUMENT. The outputs share no memory with logits or each other. */
LLAISYS_OP int LLAISYS_FN(logprobs)(int device, void* stream, int dtype, int64_t n, const void* logits,
                                    int64_t chosen, double temperature, int64_t k, void* top_ids, void* values);

/* [op] out = up * gelu_tanh(gate) over n elements, gelu_tanh(x) = x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715
 * x^3))) (HF's gelu_pytorch_tanh, Gemma's MLP), in f32 and rounded once; LLAISYS_NUMERICS_HF rounds
 * gelu_tanh(gate) to the dtype before the product, as HF's act_fn(gate) * up does in f16 / bf16. out may be
 * gate or up (exactly); no other overlap. */
LLAISYS_OP int LLAISYS_FN(geglu_tanh)(int device, void* stream, int dtype, int numerics, int64_t n, void* out,
                                      const void* gate, const void* up);

/* [op] out = x * factor over n elements (Gemma's embedding scale), in f32 with factor rounded to f32, then
 * rounded once to dtype. out may be x (exactly); no other overlap. */
LLAISYS_OP int LLAISYS_FN(scale)(int device, void* stream, int dtype, int64_t n, double factor, void* out,
                                 const void* x);

/* [op] Grouped expert linear with int8 weights: out[m, j] = x_mj @ w_e^T for e = experts[m, j], out [M, k, N],
 * experts int64 [M, k], x_mj = x[m] (x [M, K], x_per_slot 0) or x[m, j] (x [M, k, K], x_per_slot 1), and each
 * expert's w_e [N, K] in linear_i8's format and blocks, stacked by expert:
 *     weight int8 [E, NB, G, 8, 16, 4], scales bf16 [E, NB, G, 16]   (expert e's linear_i8 blocks at [e])
 * out[m, j] is, bit for bit, linear_i8 (bias NULL) of the input x_mj and expert e's blocks: x_mj quantized per
 * group of 32 as linear_i8 quantizes a row, the same integer dots and f32 chain, so no output depends on the
 * batch. The rows are grouped by expert, so only the selected experts' blocks are read, each once for all the
 * rows that chose it. An expert id outside [0, E) is LLAISYS_INVALID_ARGUMENT, as in moe_linear (nothing is
 * written). K may be 0 (out = 0). out shares no memory with x, weight, scales or experts. */
LLAISYS_OP int LLAISYS_FN(moe_linear_i8)(int device, void* stream, int dtype, int64_t M, int64_t k, int64_t E,
                                         int64_t N, int64_t K, int x_per_slot, void* out, const void* x,
                                         const void* weight, const void* scales, const void* experts);

/* [op] Linear with block-quantized weights: out [M, N] = x [M, K] @ w^T + bias [N] (bias may be NULL), w in
 * format `fmt` (llaisys_qformat_t; an unknown code is LLAISYS_NOT_SUPPORTED). Rows come in blocks of 16 (NB =
 * ceil(N / 16); rows past N are zero bytes), each block one sequential stream of G groups of 32 k (G = ceil(K /
 * 32); K a multiple of 256 for Q4_K, Q6_K; k past K zero), weight and scales uint8, per block:
 *   Q8_0  weight [G][8 steps][16 rows][4]: q[16 b + r, 32 g + 4 s + i] (int8);  scales [G][16] f16 d
 *   Q4_0  weight [G][4 chunks][16][4]: low nibble k = 32 g + 4 c + i, high nibble k + 16;  scales [G][16] f16 d
 *   Q4_1  weight as Q4_0;  scales [G][2][16]: f16 d, then f16 m
 *   Q4_K  weight [K / 64][8 chunks][16][4]: low nibble k = 64 u + 4 c + i, high nibble k + 32;
 *         scales [K / 256] records of 320 bytes: f16 D [16], f16 Dm [16], u8 sc [8][16], u8 mn [8][16]
 *   Q6_K  weight [K / 128] units of 1536 bytes, 24 chunks [16][4]: chunk 2 c (c < 8) and 16 + c - 8 (8 <= c <
 *         16) low nibbles (k = 128 u + 4 c + i, high nibble k + 64), chunk 2 c + 1 (c < 8) 2-bit fields (field
 *         j, bits 2j: k = 128 u + 32 j + 4 c + i), q = low | field << 4 (API version 6: before, the 16 nibble
 *         chunks then the 8 field chunks);  scales [K / 256] records of 288 bytes: f16 D [16], int8 sc [16][16] (per 16 k)
 * (the formulas at llaisys_qformat_t give w). Each row of x is quantized on the fly per group of 32 k as for
 * linear_i8 (sx = max|x| / 127 in f32, xq = round-half-to-even(x / sx)), and out[m, n] = sum over g in order of
 * (scale(n, g) * sx[m, g]) * dot_g (per 16 k with its own scale for Q6_K) + min(n, g) * (sx[m, g] * sum_g xq)
 * (Q4_1, Q4_K) + bias[n], where dot_g = sum_{k in g} q[n, k] * xq[m, k] (q with its offset: u - 8, q - 32) is
 * exact in int32, the rest f32, rounded once to `dtype` (of out, x and bias). A row of out depends only on its
 * row of x. A group of x holding inf or NaN makes its row of out NaN. K may be 0 (out = bias, or 0). out
 * shares no memory with x, weight, scales or bias. */
LLAISYS_OP int LLAISYS_FN(linear_q)(int device, void* stream, int dtype, int fmt, int64_t M, int64_t N, int64_t K,
                                    void* out, const void* x, const void* weight, const void* scales,
                                    const void* bias);

/* [op] Embedding from block-quantized weights: out [n, dim] (`dtype`) row i = row index[i] (int64) of the
 * [vocab, dim] matrix in format `fmt` (blocks as for linear_q, K = dim), each weight computed in f32 as the
 * format's formula says (as ggml's dequantize_row_* computes it) and rounded once. An index outside [0, vocab)
 * is LLAISYS_INVALID_ARGUMENT naming it, never a read outside weight; as for embedding, the rows of the valid
 * indices may have been written (an accelerator finds the bad index while it writes the others, and reports it
 * at the next synchronizing call). out shares no memory with the other buffers. */
LLAISYS_OP int LLAISYS_FN(embedding_q)(int device, void* stream, int dtype, int fmt, int64_t n_index, int64_t dim,
                                       int64_t vocab, void* out, const void* index, const void* weight,
                                       const void* scales);

/* [op] Linear with group-quantized weights (GPTQ, AWQ) and the activations as they are (never rounded to
 * integers, unlike linear_i8 / linear_q): out [M, N] = x' [M, K] @ w^T + bias [N] (bias may be NULL), where
 *     w[n, k] = (q[n, k] - z[n, k / gs]) * s[n, k / gs]
 * q: unsigned `bits`-bit codes (bits 4 or 8; any other value is LLAISYS_NOT_SUPPORTED), z: unsigned zero points
 * of the same range (symmetric checkpoints: 2^(bits - 1)), s: f16 scales, one z and one s per row and group of
 * gs = group_size consecutive k. K is a multiple of 32; gs is a multiple of 32 that divides K, or K itself (one
 * group per row: GPTQ's group size -1); K may be 0 (out = bias, or 0; gs is then ignored). G = K / gs groups,
 * NB = ceil(N / 16) blocks of 16 rows (rows past N: q, z and s all zero), P = 32 / bits codes per 32-bit word:
 *     weight uint8 [NB, K / P, 64]:    bytes 4 r .. 4 r + 3 of weight[b][j] are a little-endian 32-bit word
 *                                      holding q[16 b + r, P j + i] at bits [bits * i, bits * (i + 1)), i < P
 *     scales f16 [NB, G, 16]:          scales[b][g][r] = s(16 b + r, g)
 *     zeros uint8 [NB, G, 16]:         zeros[b][g][r] = z(16 b + r, g)
 * so each block is one sequential stream and 64 consecutive bytes hold the same P k of 16 rows (llaisys.ops.gq
 * makes them). x' = x, or with perm (perm_dtype LLAISYS_I32 or LLAISYS_I64, [K]; NULL: none, perm_dtype
 * ignored) x'[m, k] = x[m, perm[k]]: GPTQ's desc_act, whose columns the loader sorts by group once; the kernel
 * gathers x through perm as it reads it (no separate pass). perm is data only the kernel reads: a value outside
 * [0, K) is LLAISYS_INVALID_ARGUMENT, never a read outside x (the CPU refuses before writing anything; an
 * accelerator reports it at the next synchronizing call, out undefined). (q - z) * s is exact in f32 and x
 * widens exactly: the products are summed in f32, per row and group (the group's sum of x' * (q - z), or of
 * x' * q less z times the group's sum of x', then times s, the groups added in order) in an order that depends
 * on K and gs only, then + bias, rounded once to `dtype` (of out, x and bias). A row of out depends only on its
 * row of x (the same bits alone or in a batch). out shares no memory with the other buffers. */
LLAISYS_OP int LLAISYS_FN(linear_gq)(int device, void* stream, int dtype, int bits, int64_t group_size,
                                     int perm_dtype, int64_t M, int64_t N, int64_t K, void* out, const void* x,
                                     const void* weight, const void* scales, const void* zeros, const void* bias,
                                     const void* perm);

/* Batched LoRA adapters (Punica's SGMV: every row of a batch may use another adapter, or none). A layer's update
 * for row m with adapter s = adapters[m] is scale[s] * (x[m] @ A[s]^T) @ B[s], made in two steps:
 *     h = lora_shrink(x, A, adapters, scales)        [M, R] f32 (R the padded rank)
 *     out += lora_expand(h, B, adapters)             in place, in out's dtype
 * adapters int64 [M]: each row's slot in [0, S), or -1 (no adapter). The slots are data only the kernel reads: a
 * value outside [-1, S) is LLAISYS_INVALID_ARGUMENT naming it, never a read outside the adapters (the CPU refuses
 * before writing anything; an accelerator reports it at the next synchronizing call, the rows of the valid slots
 * possibly written). Consecutive rows of one slot (a segment) may share the slot's loads, but the arithmetic of
 * a row is fixed by its own data and the sizes: the same bits alone, in any batch and on any number of threads. */

/* [op] LoRA shrink: h [M, R] f32 = per row m with s = adapters[m] >= 0:
 *     h[m, r] = scales[s] * (sum over k of x[m, k] * a[s, r, k])
 * the products summed in f32 (x and a widen exactly) in an order that depends on K only, then times the f32
 * scale; rows with s = -1 get h[m, :] = 0. x [M, K] and a [S, R, K] (zero-padded rows of a lower rank allowed) in
 * `dtype`, scales f32 [S], adapters int64 [M]. K may be 0 (h = scales[s] * 0). h shares no memory with the other
 * buffers. */
LLAISYS_OP int LLAISYS_FN(lora_shrink)(int device, void* stream, int dtype, int64_t M, int64_t K, int64_t R,
                                       int64_t S, void* h, const void* x, const void* a, const void* adapters,
                                       const void* scales);

/* [op] LoRA expand, in place: per row m with s = adapters[m] >= 0 and every n:
 *     out[m, n] = round(out[m, n] + (sum over r ascending of h[m, r] * b[s, r, n]))
 * the sum in f32 (one FMA chain per output, r = 0, 1, ..., R - 1), then one f32 add to out's value and one
 * rounding to `dtype`. h f32 [M, R], b [S, R, N] (B transposed: a row's update is a sum of rows of b) and out
 * [M, N] in `dtype`, adapters int64 [M]. Rows with s = -1 are not touched (not even rewritten); R = 0 leaves out
 * as it is. out shares no memory with h, b or adapters. */
LLAISYS_OP int LLAISYS_FN(lora_expand)(int device, void* stream, int dtype, int64_t M, int64_t R, int64_t N,
                                       int64_t S, void* out, const void* h, const void* b, const void* adapters);

/* [op] Grouped expert linear with block-quantized weights (a GGUF file's stacked experts as stored): out[m, j] =
 * x_mj @ w_e^T for e = experts[m, j], out [M, k, N], experts int64 [M, k], x_mj = x[m] (x [M, K], x_per_slot 0)
 * or x[m, j] (x [M, k, K], x_per_slot 1), and each expert's w_e [N, K] in linear_q's format `fmt` and blocks,
 * stacked by expert: weight and scales uint8 [E, <linear_q's weight bytes of [N, K]>], [E, <its scales bytes>]
 * (expert e's linear_q blocks at [e]; an unknown fmt is LLAISYS_NOT_SUPPORTED). out[m, j] is, bit for bit,
 * linear_q (bias NULL) of the input x_mj and expert e's blocks: x_mj quantized per group of 32 as linear_q
 * quantizes a row, the same integer dots and f32 chain, so no output depends on the batch. The rows are grouped
 * by expert, so only the selected experts' blocks are read, each once for all the rows that chose it. An expert
 * id outside [0, E) is LLAISYS_INVALID_ARGUMENT, as in moe_linear (nothing is written). K may be 0 (out = 0).
 * out shares no memory with x, weight, scales or experts. */
LLAISYS_OP int LLAISYS_FN(moe_linear_q)(int device, void* stream, int dtype, int fmt, int64_t M, int64_t k,
                                        int64_t E, int64_t N, int64_t K, int x_per_slot, void* out, const void* x,
                                        const void* weight, const void* scales, const void* experts);

#endif /* LLAISYS_PREFIX */
#endif /* LLAISYS_BACKEND_H */
