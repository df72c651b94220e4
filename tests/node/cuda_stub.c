/*
 * A stand-in for libcuda.so.1 with the driver functions `verify` calls, so the ctypes
 * binding and the probe are tested on a real shared library without a GPU.
 *
 * Behaviour comes from the environment, read again by every cuInit (tests run many
 * checks in one process, and ctypes never unloads a library):
 *   STUB_CUDA_INIT_ERROR    CUresult cuInit returns (default 0)
 *   STUB_CUDA_DEVICES       device count (default 1)
 *   STUB_CUDA_TOTAL_MIB     memory of each card (default 81079, an H100 80GB)
 *   STUB_CUDA_USED_MIB      memory other processes hold on each card (default 0)
 *   STUB_CUDA_CAP_MIB[_<i>] a cap enforced like HAMi-core: allocations past it fail with
 *                           CUDA_ERROR_OUT_OF_MEMORY (default: none, like a hook that
 *                           hooks nothing)
 *   STUB_CUDA_CONTEXT_MIB   what the context costs, counted against the cap (default 0)
 *   STUB_CUDA_HIDE_CAP      1: cuMemGetInfo reports the card's total even under a cap
 *   STUB_CUDA_ALLOC_ERROR   CUresult every cuMemAlloc_v2 returns instead (default 0)
 * stub_* functions let a test check that everything was freed and released.
 * -DSTUB_WITHOUT_MEM_GET_INFO and -DSTUB_WITHOUT_ERROR_NAME build libraries that lack
 * a required and an optional function.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_CONTEXT 201

#define MIB (1024ULL * 1024ULL)
#define PAGE (2ULL * MIB)
#define MAX_DEVICES 8
#define MAX_ALLOCATIONS 65536

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

static int initialised;
static int devices;
static int hide_cap;
static int alloc_error;
static unsigned long long total[MAX_DEVICES];
static unsigned long long used[MAX_DEVICES];
static unsigned long long cap[MAX_DEVICES]; /* 0: none */
static unsigned long long context_cost;
static unsigned long long allocated[MAX_DEVICES];
static int retained[MAX_DEVICES];
static int current = -1;
static long alloc_calls;

static struct {
    CUdeviceptr pointer;
    unsigned long long size;
    int device;
} live[MAX_ALLOCATIONS];
static int live_count;
static CUdeviceptr next_pointer;

static unsigned long long env_number(const char *name, unsigned long long fallback) {
    const char *value = getenv(name);
    return value && *value ? strtoull(value, NULL, 10) : fallback;
}

static long init_calls;

CUresult cuInit(unsigned int flags) {
    (void)flags;
    init_calls++;
    memset(allocated, 0, sizeof allocated);
    memset(retained, 0, sizeof retained);
    live_count = 0;
    current = -1;
    alloc_calls = 0;
    next_pointer = 0x7f0000000000ULL;
    initialised = 0;
    CUresult error = (CUresult)env_number("STUB_CUDA_INIT_ERROR", 0);
    if (error != CUDA_SUCCESS)
        return error;
    devices = (int)env_number("STUB_CUDA_DEVICES", 1);
    if (devices > MAX_DEVICES)
        devices = MAX_DEVICES;
    hide_cap = (int)env_number("STUB_CUDA_HIDE_CAP", 0);
    alloc_error = (int)env_number("STUB_CUDA_ALLOC_ERROR", 0);
    context_cost = env_number("STUB_CUDA_CONTEXT_MIB", 0) * MIB;
    unsigned long long default_cap = env_number("STUB_CUDA_CAP_MIB", 0);
    for (int i = 0; i < MAX_DEVICES; i++) {
        char name[64];
        snprintf(name, sizeof name, "STUB_CUDA_CAP_MIB_%d", i);
        cap[i] = env_number(name, default_cap) * MIB;
        total[i] = env_number("STUB_CUDA_TOTAL_MIB", 81079) * MIB;
        used[i] = env_number("STUB_CUDA_USED_MIB", 0) * MIB;
    }
    initialised = 1;
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *version) {
    *version = 13000;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    *count = devices;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (ordinal < 0 || ordinal >= devices)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int length, CUdevice device) {
    if (device < 0 || device >= devices || length <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)length, "Stub GPU %d", device);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *context, CUdevice device) {
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (device < 0 || device >= devices)
        return CUDA_ERROR_INVALID_DEVICE;
    retained[device]++;
    *context = (CUcontext)(size_t)(0x1000 + device);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
    if (device < 0 || device >= devices || retained[device] == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    retained[device]--;
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext context) {
    if (context == NULL) {
        current = -1;
        return CUDA_SUCCESS;
    }
    int device = (int)((size_t)context - 0x1000);
    if (device < 0 || device >= devices || retained[device] == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    current = device;
    return CUDA_SUCCESS;
}

static unsigned long long physical_free(int device) {
    unsigned long long taken = used[device] + context_cost + allocated[device];
    return taken >= total[device] ? 0 : total[device] - taken;
}

#ifndef STUB_WITHOUT_MEM_GET_INFO
CUresult cuMemGetInfo_v2(size_t *free, size_t *total_out) {
    if (current < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    unsigned long long card_free = physical_free(current);
    if (cap[current] == 0) {
        *free = card_free;
        *total_out = total[current];
        return CUDA_SUCCESS;
    }
    unsigned long long usage = context_cost + allocated[current];
    unsigned long long capped = usage >= cap[current] ? 0 : cap[current] - usage;
    *free = capped < card_free ? capped : card_free;
    if (hide_cap)
        *total_out = total[current];
    else
        *total_out = cap[current] < total[current] ? cap[current] : total[current];
    return CUDA_SUCCESS;
}
#endif

CUresult cuMemAlloc_v2(CUdeviceptr *pointer, size_t size) {
    alloc_calls++;
    if (current < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (alloc_error != CUDA_SUCCESS)
        return alloc_error;
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned long long rounded = (size + PAGE - 1) / PAGE * PAGE;
    if (cap[current] != 0 && context_cost + allocated[current] + rounded > cap[current])
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (rounded > physical_free(current) || live_count == MAX_ALLOCATIONS)
        return CUDA_ERROR_OUT_OF_MEMORY;
    live[live_count].pointer = next_pointer;
    live[live_count].size = rounded;
    live[live_count].device = current;
    live_count++;
    allocated[current] += rounded;
    *pointer = next_pointer;
    next_pointer += rounded;
    return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr pointer) {
    for (int i = 0; i < live_count; i++) {
        if (live[i].pointer == pointer) {
            allocated[live[i].device] -= live[i].size;
            live[i] = live[--live_count];
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_INVALID_VALUE;
}

#ifndef STUB_WITHOUT_ERROR_NAME
CUresult cuGetErrorName(CUresult error, const char **name) {
    switch (error) {
    case CUDA_SUCCESS: *name = "CUDA_SUCCESS"; break;
    case CUDA_ERROR_INVALID_VALUE: *name = "CUDA_ERROR_INVALID_VALUE"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *name = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *name = "CUDA_ERROR_NOT_INITIALIZED"; break;
    case 35: *name = "CUDA_ERROR_INSUFFICIENT_DRIVER"; break;
    case CUDA_ERROR_NO_DEVICE: *name = "CUDA_ERROR_NO_DEVICE"; break;
    case CUDA_ERROR_INVALID_DEVICE: *name = "CUDA_ERROR_INVALID_DEVICE"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *name = "CUDA_ERROR_INVALID_CONTEXT"; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}
#endif

int stub_live_allocations(void) { return live_count; }

int stub_retained(void) {
    int sum = 0;
    for (int i = 0; i < MAX_DEVICES; i++)
        sum += retained[i];
    return sum;
}

int stub_current(void) { return current; }

long stub_alloc_calls(void) { return alloc_calls; }

long stub_init_calls(void) { return init_calls; }

void stub_reset_counters(void) {
    init_calls = 0;
    alloc_calls = 0;
}
