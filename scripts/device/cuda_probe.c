/* cuda_probe: what a CUDA application sees, through the driver API loaded by soname.
 *
 *   cuda_probe info          devices, driver version, memory as the context sees it
 *   cuda_probe alloc MIB     create a context and allocate MIB MiB; prints ok or the error
 *   cuda_probe hold SECONDS  allocate 512 MiB and keep the context for SECONDS
 *
 * Built without CUDA's headers (the prototypes below are the driver API's), linked only to
 * libc and libdl, so it runs in a minimal container root: libcuda.so.1 must come from the
 * CDI spec's mounts and the ld.so cache its hook rebuilt. Output: one "key: value" per line.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

static void *lib;
static void *sym(const char *name) {
    void *p = dlsym(lib, name);
    if (!p) { printf("error: %s missing\n", name); exit(3); }
    return p;
}
static const char *errname(CUresult rc) {
    const char *name = "?";
    CUresult (*get)(CUresult, const char **) = (CUresult (*)(CUresult, const char **))sym("cuGetErrorName");
    get(rc, &name);
    return name;
}
#define CALL(expr, what) do { CUresult rc_ = (expr); if (rc_ != 0) { \
    printf("%s: %s (%d)\n", what, errname(rc_), rc_); return 1; } } while (0)

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: cuda_probe info | alloc MIB | hold SECONDS\n"); return 2; }
    lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) { printf("dlopen: %s\n", dlerror()); return 1; }
    printf("libcuda: loaded\n");
    CUresult (*cuInit)(unsigned) = (CUresult (*)(unsigned))sym("cuInit");
    CUresult (*cuDriverGetVersion)(int *) = (CUresult (*)(int *))sym("cuDriverGetVersion");
    CUresult (*cuDeviceGetCount)(int *) = (CUresult (*)(int *))sym("cuDeviceGetCount");
    CUresult (*cuDeviceGet)(CUdevice *, int) = (CUresult (*)(CUdevice *, int))sym("cuDeviceGet");
    CUresult (*cuDeviceGetName)(char *, int, CUdevice) = (CUresult (*)(char *, int, CUdevice))sym("cuDeviceGetName");
    CUresult (*cuDeviceTotalMem)(size_t *, CUdevice) = (CUresult (*)(size_t *, CUdevice))sym("cuDeviceTotalMem_v2");
    CUresult (*cuCtxCreate)(CUcontext *, unsigned, CUdevice) = (CUresult (*)(CUcontext *, unsigned, CUdevice))sym("cuCtxCreate_v2");
    CUresult (*cuMemGetInfo)(size_t *, size_t *) = (CUresult (*)(size_t *, size_t *))sym("cuMemGetInfo_v2");
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t) = (CUresult (*)(CUdeviceptr *, size_t))sym("cuMemAlloc_v2");
    CUresult (*cuMemFree)(CUdeviceptr) = (CUresult (*)(CUdeviceptr))sym("cuMemFree_v2");
    CUresult (*cuCtxDestroy)(CUcontext) = (CUresult (*)(CUcontext))sym("cuCtxDestroy_v2");
    int version = 0, count = 0;
    CALL(cuInit(0), "cuInit");
    CALL(cuDriverGetVersion(&version), "cuDriverGetVersion");
    printf("cuda driver version: %d.%d\n", version / 1000, (version % 1000) / 10);
    CALL(cuDeviceGetCount(&count), "cuDeviceGetCount");
    printf("devices: %d\n", count);
    for (int i = 0; i < count; i++) {
        CUdevice dev; char name[256] = {0}; size_t total = 0;
        CALL(cuDeviceGet(&dev, i), "cuDeviceGet");
        CALL(cuDeviceGetName(name, sizeof name, dev), "cuDeviceGetName");
        CALL(cuDeviceTotalMem(&total, dev), "cuDeviceTotalMem");
        printf("device %d: %s, %zu MiB\n", i, name, total >> 20);
    }
    if (count == 0) return 1;
    CUdevice dev; CUcontext ctx; size_t free_b = 0, total_b = 0;
    CALL(cuDeviceGet(&dev, 0), "cuDeviceGet");
    CALL(cuCtxCreate(&ctx, 0, dev), "cuCtxCreate");
    CALL(cuMemGetInfo(&free_b, &total_b), "cuMemGetInfo");
    printf("context memory: free %zu MiB, total %zu MiB\n", free_b >> 20, total_b >> 20);
    int code = 0;
    if (strcmp(argv[1], "alloc") == 0 && argc > 2) {
        size_t mib = strtoull(argv[2], NULL, 10);
        CUdeviceptr ptr = 0;
        CUresult rc = cuMemAlloc(&ptr, mib << 20);
        if (rc == 0) { printf("alloc %zu MiB: ok\n", mib); cuMemFree(ptr); }
        else { printf("alloc %zu MiB: %s (%d)\n", mib, errname(rc), rc); code = 4; }
    }
    if (strcmp(argv[1], "hold") == 0 && argc > 2) {
        CUdeviceptr ptr = 0;
        CUresult rc = cuMemAlloc(&ptr, (size_t)512 << 20);
        printf("hold: %s\n", rc == 0 ? "ok" : errname(rc));
        fflush(stdout);
        sleep((unsigned)strtoul(argv[2], NULL, 10));
    }
    cuCtxDestroy(ctx);
    return code;
}
