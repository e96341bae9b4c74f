/*
 * Simulated libnvidia-ml.so.1 for the GPU simulator (gpuk8s sim, NVIDIA presets).
 *
 * Built by gpuk8s.sim.nvml into <root>/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 with the
 * soname libnvidia-ml.so.1. It exports the few NVML entry points gpuk8s calls, with the
 * C ABI of NVML's public header (nvml.h), and answers from the simulator's table
 * <root>/var/lib/gpuk8s-sim/nvml.txt, re-read on every call so a load set by
 * `gpuk8s sim load` shows at once. The root is found from this library's own path.
 * Table format: see gpuk8s.sim.tree.nvml_table.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_UNKNOWN = 999,
};

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

#define MAX_GPUS 256
#define MAX_PROCS 4096
#define MAX_LINKS 4096

/* nvml.h: nvmlGpuP2PCapsIndex_t, nvmlGpuP2PStatus_t */
enum { NVML_P2P_CAPS_INDEX_NVLINK = 2 };
enum { NVML_P2P_STATUS_OK = 0, NVML_P2P_STATUS_NOT_SUPPORTED = 5 };

struct gpu {
    char status[16], bus_id[32], uuid[96], name[96];
    unsigned long long total, used, ecc_corrected, ecc_uncorrected;
    unsigned int util, mem_util, temp, power_mw, pci_device_id;
    int cc_major, cc_minor; /* CUDA compute capability */
};

struct proc {
    unsigned int gpu, pid, sm_util, mps;
    unsigned long long used;
};

struct table {
    char driver[80];
    int cuda; /* 1000 * major + 10 * minor; 0: unknown */
    int ngpus, nprocs, nlinks;
    struct gpu gpus[MAX_GPUS];
    struct proc procs[MAX_PROCS];
    unsigned int links[MAX_LINKS][2]; /* NVLink pairs, by position in gpus */
};

static int initialised;

static int table_path(char *out, size_t size) {
    Dl_info info;
    char path[PATH_MAX];
    if (!dladdr((void *)&table_path, &info) || !info.dli_fname) return -1;
    if (!realpath(info.dli_fname, path)) return -1;
    /* <root>/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1: four levels up */
    for (int i = 0; i < 4; i++) {
        char *slash = strrchr(path, '/');
        if (!slash) return -1;
        *slash = '\0';
    }
    if ((size_t)snprintf(out, size, "%s/var/lib/gpuk8s-sim/nvml.txt", path) >= size) return -1;
    return 0;
}

static nvmlReturn_t load(struct table *t) {
    char path[PATH_MAX], line[1024];
    FILE *f;
    memset(t, 0, sizeof(*t));
    if (table_path(path, sizeof path) != 0 || !(f = fopen(path, "r")))
        return NVML_ERROR_DRIVER_NOT_LOADED;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        if (!strncmp(line, "driver ", 7)) {
            snprintf(t->driver, sizeof t->driver, "%s", line + 7);
        } else if (!strncmp(line, "cuda ", 5)) {
            t->cuda = atoi(line + 5);
        } else if (!strncmp(line, "gpu ", 4) && t->ngpus < MAX_GPUS) {
            struct gpu *g = &t->gpus[t->ngpus];
            int used = 0;
            if (sscanf(line + 4, "%15s %31s %95s %llu %llu %u %u %u %u %llu %llu %d %d %x %n",
                       g->status, g->bus_id, g->uuid, &g->total, &g->used, &g->util,
                       &g->mem_util, &g->temp, &g->power_mw, &g->ecc_corrected,
                       &g->ecc_uncorrected, &g->cc_major, &g->cc_minor, &g->pci_device_id,
                       &used) >= 14) {
                snprintf(g->name, sizeof g->name, "%s", line + 4 + used);
                t->ngpus++;
            }
        } else if (!strncmp(line, "link ", 5) && t->nlinks < MAX_LINKS) {
            if (sscanf(line + 5, "%u %u", &t->links[t->nlinks][0], &t->links[t->nlinks][1]) == 2)
                t->nlinks++;
        } else if (!strncmp(line, "proc ", 5) && t->nprocs < MAX_PROCS) {
            struct proc *p = &t->procs[t->nprocs];
            if (sscanf(line + 5, "%u %u %llu %u %u", &p->gpu, &p->pid, &p->used, &p->sm_util,
                       &p->mps) == 5)
                t->nprocs++;
        }
    }
    fclose(f);
    return NVML_SUCCESS;
}

/* The device a handle names, freshly read; sets *rc on failure. */
static struct gpu *device(nvmlDevice_t handle, struct table *t, nvmlReturn_t *rc) {
    uintptr_t index = (uintptr_t)handle;
    if (!initialised) { *rc = NVML_ERROR_UNINITIALIZED; return NULL; }
    if ((*rc = load(t)) != NVML_SUCCESS) return NULL;
    if (index == 0 || index > (uintptr_t)t->ngpus) { *rc = NVML_ERROR_INVALID_ARGUMENT; return NULL; }
    if (strcmp(t->gpus[index - 1].status, "ok") != 0) { *rc = NVML_ERROR_GPU_IS_LOST; return NULL; }
    *rc = NVML_SUCCESS;
    return &t->gpus[index - 1];
}

static nvmlReturn_t copy(char *dst, unsigned int size, const char *src) {
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > size) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    static struct table t;
    nvmlReturn_t rc = load(&t);
    (void)flags;
    if (rc == NVML_SUCCESS) initialised++;
    return rc;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlShutdown(void) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    initialised--;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t rc) {
    switch (rc) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    static struct table t;
    nvmlReturn_t rc;
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if ((rc = load(&t)) != NVML_SUCCESS) return rc;
    return copy(version, length, t.driver);
}

/* The CUDA version the driver supports (12040 for 12.4), as in nvml.h. */
/* The original call answers from NVML's own knowledge of the driver. */
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    static struct table t;
    nvmlReturn_t rc;
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    if ((rc = load(&t)) != NVML_SUCCESS) return rc;
    if (t.cuda <= 0) return NVML_ERROR_NOT_SUPPORTED;
    *version = t.cuda;
    return NVML_SUCCESS;
}

/* _v2 asks libcuda.so.1, loaded by soname: where the caller's loader cannot find it (a
 * service with the host mounted at /host) it fails with NVML_ERROR_NOT_FOUND, as the real
 * library did with driver 580.159.04 on an H100. */
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    void *cuda;
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    cuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!cuda) return NVML_ERROR_NOT_FOUND;
    dlclose(cuda);
    return nvmlSystemGetCudaDriverVersion(version);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    static struct table t;
    nvmlReturn_t rc;
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if ((rc = load(&t)) != NVML_SUCCESS) return rc;
    *count = (unsigned int)t.ngpus;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *handle) {
    static struct table t;
    nvmlReturn_t rc;
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!handle) return NVML_ERROR_INVALID_ARGUMENT;
    if ((rc = load(&t)) != NVML_SUCCESS) return rc;
    if (index >= (unsigned int)t.ngpus) return NVML_ERROR_INVALID_ARGUMENT;
    if (strcmp(t.gpus[index].status, "ok") != 0) return NVML_ERROR_GPU_IS_LOST;
    *handle = (nvmlDevice_t)(uintptr_t)(index + 1);
    return NVML_SUCCESS;
}

/* "0000:18:00.0" and "00000000:18:00.0" name the same function, as in NVML. */
static int same_bus_id(const char *a, const char *b) {
    unsigned int d1, b1, v1, f1, d2, b2, v2, f2;
    if (sscanf(a, "%x:%x:%x.%x", &d1, &b1, &v1, &f1) != 4) return 0;
    if (sscanf(b, "%x:%x:%x.%x", &d2, &b2, &v2, &f2) != 4) return 0;
    return d1 == d2 && b1 == b2 && v1 == v2 && f1 == f2;
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *handle) {
    static struct table t;
    nvmlReturn_t rc;
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!bus_id || !handle) return NVML_ERROR_INVALID_ARGUMENT;
    if ((rc = load(&t)) != NVML_SUCCESS) return rc;
    for (int i = 0; i < t.ngpus; i++) {
        if (!same_bus_id(t.gpus[i].bus_id, bus_id)) continue;
        if (strcmp(t.gpus[i].status, "ok") != 0) return NVML_ERROR_GPU_IS_LOST;
        *handle = (nvmlDevice_t)(uintptr_t)(i + 1);
        return NVML_SUCCESS;
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t handle, int *major, int *minor) {
    static struct table t;
    nvmlReturn_t rc;
    struct gpu *g = device(handle, &t, &rc);
    if (!g) return rc;
    if (!major || !minor) return NVML_ERROR_INVALID_ARGUMENT;
    *major = g->cc_major;
    *minor = g->cc_minor;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t handle, char *name, unsigned int length) {
    static struct table t;
    nvmlReturn_t rc;
    struct gpu *g = device(handle, &t, &rc);
    return g ? copy(name, length, g->name) : rc;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t handle, char *uuid, unsigned int length) {
    static struct table t;
    nvmlReturn_t rc;
    struct gpu *g = device(handle, &t, &rc);
    return g ? copy(uuid, length, g->uuid) : rc;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t handle, nvmlPciInfo_t *pci) {
    static struct table t;
    nvmlReturn_t rc;
    struct gpu *g = device(handle, &t, &rc);
    unsigned int domain = 0, bus = 0, dev = 0, fn = 0;
    if (!g) return rc;
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof(*pci));
    sscanf(g->bus_id, "%x:%x:%x.%x", &domain, &bus, &dev, &fn);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = g->pci_device_id;
    snprintf(pci->busId, sizeof pci->busId, "%s", g->bus_id);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04x:%02x:%02x.%x", domain, bus, dev, fn);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t handle, nvmlMemory_t *memory) {
    static struct table t;
    nvmlReturn_t rc;
    struct gpu *g = device(handle, &t, &rc);
    if (!g) return rc;
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = g->total;
    memory->used = g->used;
    memory->free = g->total - g->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t handle, nvmlUtilization_t *util) {
    static struct table t;
    nvmlReturn_t rc;
    struct gpu *g = device(handle, &t, &rc);
    if (!g) return rc;
    if (!util) return NVML_ERROR_INVALID_ARGUMENT;
    util->gpu = g->util;
    util->memory = g->mem_util;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t handle, int sensor, unsigned int *temp) {
    static struct table t;
    nvmlReturn_t rc;
    struct gpu *g = device(handle, &t, &rc);
    if (!g) return rc;
    if (!temp || sensor != 0) return NVML_ERROR_INVALID_ARGUMENT;
    *temp = g->temp;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t handle, unsigned int *power) {
    static struct table t;
    nvmlReturn_t rc;
    struct gpu *g = device(handle, &t, &rc);
    if (!g) return rc;
    if (!power) return NVML_ERROR_INVALID_ARGUMENT;
    *power = g->power_mw;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t handle, int error_type, int counter_type,
                                         unsigned long long *count) {
    static struct table t;
    nvmlReturn_t rc;
    struct gpu *g = device(handle, &t, &rc);
    (void)counter_type;
    if (!g) return rc;
    if (!count || error_type < 0 || error_type > 1) return NVML_ERROR_INVALID_ARGUMENT;
    *count = error_type == 0 ? g->ecc_corrected : g->ecc_uncorrected;
    return NVML_SUCCESS;
}

/* Compute processes (mps = 0: every process with a context, MPS clients included) or the
 * MPS client processes (mps = 1) of a GPU -- as driver 580.159.04 lists them on an H100: the
 * compute list held the MPS server and both clients, the MPS list the two clients. */
static nvmlReturn_t processes(nvmlDevice_t handle, unsigned int mps, unsigned int *count,
                              nvmlProcessInfo_t *infos) {
    static struct table t;
    nvmlReturn_t rc;
    struct gpu *g = device(handle, &t, &rc);
    unsigned int position, found = 0;
    if (!g) return rc;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    position = (unsigned int)(g - t.gpus);
    for (int i = 0; i < t.nprocs; i++) {
        if (t.procs[i].gpu != position || (mps && !t.procs[i].mps)) continue;
        if (infos && found < *count) {
            infos[found].pid = t.procs[i].pid;
            infos[found].usedGpuMemory = t.procs[i].used;
            infos[found].gpuInstanceId = 0xFFFFFFFF;
            infos[found].computeInstanceId = 0xFFFFFFFF;
        }
        found++;
    }
    if (!infos || found > *count) {
        rc = found == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
        *count = found;
        return rc;
    }
    *count = found;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t handle, unsigned int *count,
                                                     nvmlProcessInfo_t *infos) {
    return processes(handle, 0, count, infos);
}

nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t handle, unsigned int *count,
                                                        nvmlProcessInfo_t *infos) {
    return processes(handle, 1, count, infos);
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t handle,
                                             nvmlProcessUtilizationSample_t *samples,
                                             unsigned int *count,
                                             unsigned long long last_seen) {
    static struct table t;
    nvmlReturn_t rc;
    struct gpu *g = device(handle, &t, &rc);
    unsigned int position, found = 0;
    struct timeval now;
    unsigned long long stamp;
    (void)last_seen;
    if (!g) return rc;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    gettimeofday(&now, NULL);
    stamp = (unsigned long long)now.tv_sec * 1000000ULL + (unsigned long long)now.tv_usec;
    position = (unsigned int)(g - t.gpus);
    /* The SM time of MPS clients is booked to the MPS server (the GPU's first process that
     * is not a client); the clients get no sample of their own (driver 580.159.04, H100:
     * one sample, the server's, while two clients kept the GPU busy). */
    unsigned int clients = 0;
    int server = -1;
    for (int i = 0; i < t.nprocs; i++) {
        if (t.procs[i].gpu != position) continue;
        if (t.procs[i].mps) clients += t.procs[i].sm_util;
        else if (server < 0) server = i;
    }
    for (int i = 0; i < t.nprocs; i++) {
        if (t.procs[i].gpu != position || t.procs[i].mps) continue;
        if (samples && found < *count) {
            unsigned int sm = t.procs[i].sm_util + (i == server ? clients : 0);
            memset(&samples[found], 0, sizeof samples[found]);
            samples[found].pid = t.procs[i].pid;
            samples[found].timeStamp = stamp;
            samples[found].smUtil = sm > 100 ? 100 : sm;
        }
        found++;
    }
    if (found == 0) return NVML_ERROR_NOT_FOUND; /* no sample since last_seen */
    if (!samples || found > *count) {
        *count = found;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = found;
    return NVML_SUCCESS;
}

/* Whether two GPUs can reach each other peer to peer over the given path. Answers for
 * NVLink only (NVML_P2P_CAPS_INDEX_NVLINK): OK for a pair the simulator links, else
 * NOT_SUPPORTED, as for GPUs on PCIe alone; every other index is NOT_SUPPORTED here. */
nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t first, nvmlDevice_t second, int caps,
                                    int *status) {
    static struct table t;
    nvmlReturn_t rc;
    unsigned int a = (unsigned int)(uintptr_t)first - 1, b = (unsigned int)(uintptr_t)second - 1;
    if (!status) return NVML_ERROR_INVALID_ARGUMENT;
    if (!device(first, &t, &rc) || !device(second, &t, &rc)) return rc;
    *status = NVML_P2P_STATUS_NOT_SUPPORTED;
    if (caps != NVML_P2P_CAPS_INDEX_NVLINK) return NVML_SUCCESS;
    for (int i = 0; i < t.nlinks; i++) {
        if ((t.links[i][0] == a && t.links[i][1] == b) || (t.links[i][0] == b && t.links[i][1] == a)) {
            *status = NVML_P2P_STATUS_OK;
            break;
        }
    }
    return NVML_SUCCESS;
}
