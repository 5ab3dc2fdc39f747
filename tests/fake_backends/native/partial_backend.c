/*
 * A partial backend for core's fallback tests: the required runtime slots, device_attribute and device_name,
 * and only two operators, add (f32 / f16 / bf16) and embedding; every other op runs on the CPU backend.
 *   cc -shared -fPIC -DLLAISYS_PREFIX=llaisys_partial -DPARTIAL_HOST=0|1 [-DPARTIAL_API_VERSION=V]
 * Its one device keeps its memory in malloc'd blocks. With PARTIAL_HOST=1 it says the host can address
 * it (core's fallback then runs CPU kernels in place); with 0 it does not (core copies an op's buffers to
 * the host and back), and then every memcpy / memset checks that its device range lies inside one live
 * allocation, so a fallback that copies a byte too many fails instead of passing by luck.
 * PARTIAL_API_VERSION replaces the LLAISYS_API_VERSION that api_version() returns (the ABI tests).
 * Counters (not slots): partial_copies(kind) per llaisys_memcpy_kind_t, partial_syncs() of stream_synchronize.
 */
#include <llaisys/backend.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef PARTIAL_HOST
#define PARTIAL_HOST 1
#endif
#ifndef PARTIAL_API_VERSION
#define PARTIAL_API_VERSION LLAISYS_API_VERSION
#endif

static __thread char g_error[256];
static long long g_copies[4];
static long long g_syncs;

static int fail(int status, const char* message) {
    snprintf(g_error, sizeof g_error, "%s", message);
    return status;
}

LLAISYS_VISIBLE long long partial_copies(int kind) { return g_copies[kind]; }
LLAISYS_VISIBLE long long partial_syncs(void) { return g_syncs; }

/* ---- live allocations (checked by the copies of the non-host-addressable build) ---- */

typedef struct { char* ptr; size_t size; } block_t;
static block_t* g_blocks;
static size_t g_count, g_capacity;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static int remember(char* ptr, size_t size) {
    pthread_mutex_lock(&g_lock);
    if (g_count == g_capacity) {
        size_t capacity = g_capacity ? 2 * g_capacity : 256;
        block_t* grown = realloc(g_blocks, capacity * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&g_lock);
            return 0;
        }
        g_blocks = grown;
        g_capacity = capacity;
    }
    g_blocks[g_count].ptr = ptr;
    g_blocks[g_count++].size = size;
    pthread_mutex_unlock(&g_lock);
    return 1;
}

static void forget(char* ptr) {
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_count; i++) {
        if (g_blocks[i].ptr == ptr) {
            g_blocks[i] = g_blocks[--g_count];
            break;
        }
    }
    pthread_mutex_unlock(&g_lock);
}

/* Whether [ptr, ptr + n) lies inside one live allocation (always true for the host-addressable build). */
static int inside(const void* ptr, size_t n) {
    if (PARTIAL_HOST || n == 0) return 1;
    const char* p = ptr;
    int found = 0;
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_count && !found; i++)
        found = g_blocks[i].ptr <= p && p + n <= g_blocks[i].ptr + g_blocks[i].size;
    pthread_mutex_unlock(&g_lock);
    return found;
}

/* ---- runtime ---- */

int LLAISYS_FN(api_version)(void) { return PARTIAL_API_VERSION; }
const char* LLAISYS_FN(last_error)(void) { return g_error; }

int LLAISYS_FN(device_count)(int* count) {
    *count = 1;
    return LLAISYS_OK;
}

static int bad_device(int device) { return device != 0; }

int LLAISYS_FN(device_attribute)(int device, int attr, int64_t* value) {
    if (bad_device(device)) return fail(LLAISYS_INVALID_ARGUMENT, "partial: no such device");
    if (attr != LLAISYS_ATTR_HOST_ADDRESSABLE) return fail(LLAISYS_NOT_SUPPORTED, "partial: unknown attribute");
    *value = PARTIAL_HOST;
    return LLAISYS_OK;
}

int LLAISYS_FN(device_name)(int device, char* name, size_t size) {
    if (bad_device(device)) return fail(LLAISYS_INVALID_ARGUMENT, "partial: no such device");
    snprintf(name, size, "a partial test backend (%s)", PARTIAL_HOST ? "host-addressable" : "device memory");
    return LLAISYS_OK;
}

int LLAISYS_FN(device_synchronize)(int device) {
    return bad_device(device) ? fail(LLAISYS_INVALID_ARGUMENT, "partial: no such device") : LLAISYS_OK;
}

int LLAISYS_FN(malloc)(int device, size_t nbytes, void** ptr) {
    if (bad_device(device)) return fail(LLAISYS_INVALID_ARGUMENT, "partial: no such device");
    *ptr = nbytes > ((size_t)1 << 40) ? NULL : malloc(nbytes ? nbytes : 1);
    if (*ptr && !remember(*ptr, nbytes)) {
        free(*ptr);
        *ptr = NULL;
    }
    return *ptr ? LLAISYS_OK : fail(LLAISYS_OUT_OF_MEMORY, "partial: out of memory");
}

int LLAISYS_FN(free)(int device, void* ptr) {
    (void)device;
    forget(ptr);
    free(ptr);
    return LLAISYS_OK;
}

int LLAISYS_FN(memset)(int device, void* ptr, int value, size_t nbytes, void* stream) {
    (void)device; (void)stream;
    if (!inside(ptr, nbytes)) return fail(LLAISYS_INVALID_ARGUMENT, "partial: memset outside an allocation");
    memset(ptr, value, nbytes);
    return LLAISYS_OK;
}

static int copy(int device, void* dst, const void* src, size_t nbytes, int kind) {
    if (bad_device(device)) return fail(LLAISYS_INVALID_ARGUMENT, "partial: no such device");
    if (kind < 0 || kind > 3) return fail(LLAISYS_INVALID_ARGUMENT, "partial: bad memcpy kind");
    int dst_device = kind == LLAISYS_MEMCPY_H2D || kind == LLAISYS_MEMCPY_D2D;
    int src_device = kind == LLAISYS_MEMCPY_D2H || kind == LLAISYS_MEMCPY_D2D;
    if ((dst_device && !inside(dst, nbytes)) || (src_device && !inside(src, nbytes))) {
        char message[160];
        snprintf(message, sizeof message, "partial: memcpy (kind %d) of %zu bytes outside an allocation", kind, nbytes);
        return fail(LLAISYS_INVALID_ARGUMENT, message);
    }
    g_copies[kind]++;
    memmove(dst, src, nbytes);
    return LLAISYS_OK;
}

int LLAISYS_FN(memcpy)(int device, void* dst, const void* src, size_t nbytes, int kind) {
    return copy(device, dst, src, nbytes, kind);
}

int LLAISYS_FN(memcpy_async)(int device, void* dst, const void* src, size_t nbytes, int kind, void* stream) {
    (void)stream;
    return copy(device, dst, src, nbytes, kind);
}

static int g_stream;

int LLAISYS_FN(stream_create)(int device, void** stream) {
    (void)device;
    *stream = &g_stream;
    return LLAISYS_OK;
}

int LLAISYS_FN(stream_destroy)(int device, void* stream) {
    (void)device; (void)stream;
    return LLAISYS_OK;
}

int LLAISYS_FN(stream_synchronize)(int device, void* stream) {
    (void)device; (void)stream;
    g_syncs++;
    return LLAISYS_OK;
}

/* ---- the two operators (everything runs at once: streams are synchronous) ---- */

static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f32_to_bf16(float f) { /* round to nearest even, NaN stays NaN */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

int LLAISYS_FN(add)(int device, void* stream, int dtype, int64_t n, void* c, const void* a, const void* b) {
    (void)device; (void)stream;
    if (dtype == LLAISYS_F32) {
        for (int64_t i = 0; i < n; i++) ((float*)c)[i] = ((const float*)a)[i] + ((const float*)b)[i];
    } else if (dtype == LLAISYS_BF16) {
        for (int64_t i = 0; i < n; i++)
            ((uint16_t*)c)[i] = f32_to_bf16(bf16_to_f32(((const uint16_t*)a)[i]) + bf16_to_f32(((const uint16_t*)b)[i]));
    } else if (dtype == LLAISYS_F16) {
        for (int64_t i = 0; i < n; i++) /* an f16 sum of two f16 values rounds once, as f32 then f16 does */
            ((_Float16*)c)[i] = (_Float16)((float)((const _Float16*)a)[i] + (float)((const _Float16*)b)[i]);
    } else {
        return fail(LLAISYS_NOT_SUPPORTED, "partial: add supports f32, f16 and bf16");
    }
    return LLAISYS_OK;
}

int LLAISYS_FN(embedding)(int device, void* stream, int dtype, int64_t n_index, int64_t dim, int64_t vocab,
                          void* out, const void* index, const void* weight) {
    (void)device; (void)stream;
    static const int sizes[] = {4, 2, 2, 8, 1, 4, 8, 1, 1};
    if (dtype < 0 || dtype > 8) return fail(LLAISYS_NOT_SUPPORTED, "partial: embedding: unknown dtype");
    size_t row = (size_t)dim * (size_t)sizes[dtype];
    const int64_t* ids = index;
    for (int64_t i = 0; i < n_index; i++) {
        if (ids[i] < 0 || ids[i] >= vocab) {
            snprintf(g_error, sizeof g_error, "partial: embedding: index value %lld at position %lld is out of range [0, %lld)",
                     (long long)ids[i], (long long)i, (long long)vocab);
            return LLAISYS_INVALID_ARGUMENT;
        }
    }
    for (int64_t i = 0; i < n_index; i++)
        memcpy((char*)out + (size_t)i * row, (const char*)weight + (size_t)ids[i] * row, row);
    return LLAISYS_OK;
}
