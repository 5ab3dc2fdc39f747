/*
 * A minimal backend library for core's tests, built against llaisys/backend.h by the tests:
 *   cc -shared -fPIC -DLLAISYS_PREFIX=llaisys_fake -DFAKE_DEVICES=N [-DFAKE_PEER] [-DFAKE_MEM_INFO]
 *      [-DFAKE_OMIT_MEMCPY] [-DFAKE_API_VERSION=V]
 * It exports only the required slots (plus memcpy_peer with FAKE_PEER, mem_info with FAKE_MEM_INFO:
 * a GPU-like 60 GiB free of 80 GiB; minus memcpy with FAKE_OMIT_MEMCPY) and no operator. Its "devices" keep their memory on the host but do not
 * say they are host-addressable, so core must move data through memcpy / memcpy_peer; each
 * copy is counted (fake_copies) so a test can see which path core took. FAKE_API_VERSION makes api_version()
 * return V instead of the header's LLAISYS_API_VERSION: a library built for another version of the ABI.
 */
#include <llaisys/backend.h>
#include <stdlib.h>
#include <string.h>

#ifndef FAKE_DEVICES
#define FAKE_DEVICES 2
#endif
#ifndef FAKE_API_VERSION
#define FAKE_API_VERSION LLAISYS_API_VERSION
#endif

static const char* g_last_error = "";
static long long g_copies[5]; /* by llaisys_memcpy_kind_t, then [4] = peer copies */

static int fail(const char* message, int status) {
    g_last_error = message;
    return status;
}

static int bad_device(int device) { return device < 0 || device >= FAKE_DEVICES; }

/* Not a slot: how many copies of `kind` (0..3) or peer copies (4) core asked for. */
LLAISYS_VISIBLE long long fake_copies(int kind) { return g_copies[kind]; }

int LLAISYS_FN(api_version)(void) { return FAKE_API_VERSION; }
const char* LLAISYS_FN(last_error)(void) { return g_last_error; }

int LLAISYS_FN(device_count)(int* count) {
    *count = FAKE_DEVICES;
    if (FAKE_DEVICES == 0) g_last_error = "no fake accelerator is plugged in";
    return LLAISYS_OK;
}

int LLAISYS_FN(device_synchronize)(int device) {
    return bad_device(device) ? fail("fake: no such device", LLAISYS_INVALID_ARGUMENT) : LLAISYS_OK;
}

int LLAISYS_FN(malloc)(int device, size_t nbytes, void** ptr) {
    if (bad_device(device)) return fail("fake: no such device", LLAISYS_INVALID_ARGUMENT);
    *ptr = nbytes > ((size_t)1 << 40) ? NULL : malloc(nbytes ? nbytes : 1);
    return *ptr ? LLAISYS_OK : fail("fake: out of memory", LLAISYS_OUT_OF_MEMORY);
}

int LLAISYS_FN(free)(int device, void* ptr) {
    (void)device;
    free(ptr);
    return LLAISYS_OK;
}

int LLAISYS_FN(memset)(int device, void* ptr, int value, size_t nbytes, void* stream) {
    (void)device; (void)stream;
    memset(ptr, value, nbytes);
    return LLAISYS_OK;
}

static int copy(int device, void* dst, const void* src, size_t nbytes, int kind) {
    if (bad_device(device)) return fail("fake: no such device", LLAISYS_INVALID_ARGUMENT);
    if (kind < 0 || kind > 3) return fail("fake: bad memcpy kind", LLAISYS_INVALID_ARGUMENT);
    g_copies[kind]++;
    memmove(dst, src, nbytes);
    return LLAISYS_OK;
}

#ifndef FAKE_OMIT_MEMCPY
int LLAISYS_FN(memcpy)(int device, void* dst, const void* src, size_t nbytes, int kind) {
    return copy(device, dst, src, nbytes, kind);
}
#endif

int LLAISYS_FN(memcpy_async)(int device, void* dst, const void* src, size_t nbytes, int kind, void* stream) {
    (void)stream;
    return copy(device, dst, src, nbytes, kind);
}

#ifdef FAKE_PEER
int LLAISYS_FN(memcpy_peer)(int dst_device, void* dst, int src_device, const void* src, size_t nbytes, void* stream) {
    (void)stream;
    if (bad_device(dst_device) || bad_device(src_device)) return fail("fake: no such device", LLAISYS_INVALID_ARGUMENT);
    g_copies[4]++;
    memmove(dst, src, nbytes);
    return LLAISYS_OK;
}
#endif

#ifdef FAKE_MEM_INFO
int LLAISYS_FN(mem_info)(int device, size_t* free_bytes, size_t* total_bytes) {
    if (bad_device(device)) return fail("fake: no such device", LLAISYS_INVALID_ARGUMENT);
    *free_bytes = (size_t)60 << 30;
    *total_bytes = (size_t)80 << 30;
    return LLAISYS_OK;
}
#endif

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
    return LLAISYS_OK;
}
