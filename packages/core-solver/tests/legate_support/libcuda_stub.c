/*
 * A stand-in for the NVIDIA driver library (libcuda.so.1) on machines without a GPU.
 *
 * The PyPI wheels of Legate and cuPyNumeric are GPU builds linked against libcuda.so.1;
 * without a driver they cannot even be imported. This library answers every driver call
 * with CUDA_ERROR_NO_DEVICE (100), so Legate finds no GPU and runs on its CPU processors
 * (with LEGATE_CONFIG="--cpus N --gpus 0"). It is test and development infrastructure,
 * never shipped. Build:  gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o libcuda.so.1 libcuda_stub.c
 */
#include <stddef.h>
#include <string.h>

typedef int CUresult;
#define CUDA_ERROR_NO_DEVICE 100

static const char NAME[] = "CUDA_ERROR_NO_DEVICE";
static const char TEXT[] = "no CUDA-capable device is detected (driver stub)";

/* Every driver entry point other than the error strings: "no device". */
static CUresult no_device(void) { return CUDA_ERROR_NO_DEVICE; }

CUresult cuGetErrorName(CUresult error, const char **text) {
    (void)error;
    if (text != NULL) *text = NAME;
    return 0;
}

CUresult cuGetErrorString(CUresult error, const char **text) {
    (void)error;
    if (text != NULL) *text = TEXT;
    return 0;
}

/* Function lookup used by the CUDA runtime and Realm: hand out no_device for any name. */
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                             unsigned long long flags, int *status) {
    (void)version;
    (void)flags;
    if (status != NULL) *status = 0; /* CU_GET_PROC_ADDRESS_SUCCESS */
    if (pfn == NULL) return 1;       /* CUDA_ERROR_INVALID_VALUE */
    if (symbol != NULL && strcmp(symbol, "cuGetErrorName") == 0) *pfn = (void *)cuGetErrorName;
    else if (symbol != NULL && strcmp(symbol, "cuGetErrorString") == 0) *pfn = (void *)cuGetErrorString;
    else *pfn = (void *)no_device;
    return 0;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags) {
    return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}

/* Symbols that libraries link or look up by name directly. */
CUresult cuInit(unsigned int flags) { (void)flags; return CUDA_ERROR_NO_DEVICE; }
CUresult cuDriverGetVersion(int *version) { (void)version; return CUDA_ERROR_NO_DEVICE; }
CUresult cuDeviceGetCount(int *count) { if (count != NULL) *count = 0; return CUDA_ERROR_NO_DEVICE; }
CUresult cuMemFreeHost(void *pointer) { (void)pointer; return CUDA_ERROR_NO_DEVICE; }
CUresult cuMemFree_v2(unsigned long long pointer) { (void)pointer; return CUDA_ERROR_NO_DEVICE; }
