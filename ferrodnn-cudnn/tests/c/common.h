/* Shared helpers of the C API's test programs: built against NVIDIA's cudnn.h and linked
 * against either NVIDIA's libcudnn or ferrodnn's (scripts/capi_compare.sh). With -DGPU buffers
 * live in device memory (cudaMalloc); without it in host memory, which only ferrodnn's library
 * takes (its CPU handle, asked for with FERRODNN_CUDNN_DEVICE=cpu).
 *
 * Each program prints "# section" lines and one "name index value" line per output element, so
 * that two runs can be compared number by number. */
#ifndef FERRODNN_CAPI_TEST_COMMON_H
#define FERRODNN_CAPI_TEST_COMMON_H

#define _GNU_SOURCE
#include <cudnn.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                          \
    do {                                                                                     \
        cudnnStatus_t s_ = (call);                                                           \
        if (s_ != CUDNN_STATUS_SUCCESS) {                                                    \
            char msg_[1024];                                                                 \
            cudnnGetLastErrorString(msg_, sizeof msg_);                                      \
            fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", __FILE__, __LINE__, #call,       \
                    cudnnGetErrorString(s_), msg_);                                          \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

#ifdef GPU
/* Device memory through the CUDA driver API (libcuda, which every GPU machine has; no toolkit
 * is needed to build), in the device's primary context: the one the CUDA runtime, and so
 * NVIDIA's cuDNN, uses. Our own declarations of the few driver calls used. */
typedef unsigned long long CUdeviceptr_t;
int cuInit(unsigned flags);
int cuDeviceGet(int *dev, int ordinal);
int cuDevicePrimaryCtxRetain(void **ctx, int dev);
int cuCtxSetCurrent(void *ctx);
int cuCtxSynchronize(void);
int cuMemAlloc_v2(CUdeviceptr_t *p, size_t bytes);
int cuMemFree_v2(CUdeviceptr_t p);
int cuMemcpyHtoD_v2(CUdeviceptr_t dst, const void *src, size_t bytes);
int cuMemcpyDtoH_v2(void *dst, CUdeviceptr_t src, size_t bytes);
#define CU_CHECK(call)                                                                       \
    do {                                                                                     \
        int e_ = (call);                                                                     \
        if (e_ != 0) {                                                                       \
            fprintf(stderr, "%s:%d: %s failed: CUresult %d\n", __FILE__, __LINE__, #call, e_); \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)
#endif

static inline cudnnHandle_t make_handle(void) {
#ifdef GPU
    int dev;
    void *ctx;
    CU_CHECK(cuInit(0));
    CU_CHECK(cuDeviceGet(&dev, 0));
    CU_CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU_CHECK(cuCtxSetCurrent(ctx));
#else
    /* Host pointers: ferrodnn's CPU handle (NVIDIA's library cannot run this build). */
    setenv("FERRODNN_CUDNN_DEVICE", "cpu", 1);
#endif
    /* Which library this is: ferrodnn's exports ferrodnnGetVersionString. */
    const char *(*fv)(void) = (const char *(*)(void))dlsym(RTLD_DEFAULT, "ferrodnnGetVersionString");
    fprintf(stderr, "library: %s (reports cuDNN %zu)\n", fv ? fv() : "NVIDIA cuDNN", cudnnGetVersion());
    cudnnHandle_t h;
    CHECK(cudnnCreate(&h));
    return h;
}

/* Buffers of `n` floats: device memory with -DGPU, host memory otherwise. */
static inline float *buf(size_t n) {
#ifdef GPU
    CUdeviceptr_t p;
    CU_CHECK(cuMemAlloc_v2(&p, n * sizeof(float) + 16));
    return (float *)(size_t)p;
#else
    return (float *)malloc(n * sizeof(float) + 16);
#endif
}

static inline void buf_free(float *p) {
#ifdef GPU
    cuMemFree_v2((CUdeviceptr_t)(size_t)p);
#else
    free(p);
#endif
}

static inline void upload(float *dst, const float *src, size_t n) {
#ifdef GPU
    CU_CHECK(cuMemcpyHtoD_v2((CUdeviceptr_t)(size_t)dst, src, n * sizeof(float)));
#else
    memcpy(dst, src, n * sizeof(float));
#endif
}

static inline void download(float *dst, const float *src, size_t n) {
#ifdef GPU
    CU_CHECK(cuCtxSynchronize());
    CU_CHECK(cuMemcpyDtoH_v2(dst, (CUdeviceptr_t)(size_t)src, n * sizeof(float)));
#else
    memcpy(dst, src, n * sizeof(float));
#endif
}

/* Seeded values in [lo, hi): a 64-bit LCG, the same on every machine. */
static unsigned long long rng_state = 1;
static inline void seed(unsigned long long s) { rng_state = s * 6364136223846793005ULL + 1442695040888963407ULL; }
static inline float uniform(float lo, float hi) {
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return lo + (hi - lo) * (float)((rng_state >> 40) & 0xFFFFFF) / 16777216.0f;
}

/* A device (or host) buffer of n seeded values. */
static inline float *random_buf(size_t n, unsigned long long s, float lo, float hi) {
    float *h = (float *)malloc(n * sizeof(float));
    seed(s);
    for (size_t i = 0; i < n; i++) h[i] = uniform(lo, hi);
    float *d = buf(n);
    upload(d, h, n);
    free(h);
    return d;
}

static inline void print_buf(const char *name, const float *d, size_t n) {
    float *h = (float *)malloc(n * sizeof(float));
    download(h, d, n);
    for (size_t i = 0; i < n; i++) printf("%s %zu %.9g\n", name, i, h[i]);
    free(h);
}

/* The first of `n` algorithm-performance entries (each `stride` bytes apart, `status` the first
 * one's status field) whose status is success: heuristics may list unsupported algorithms. */
static inline int first_ok(const cudnnStatus_t *status, size_t stride, int n) {
    for (int i = 0; i < n; i++) {
        if (*(const cudnnStatus_t *)((const char *)status + i * stride) == CUDNN_STATUS_SUCCESS) return i;
    }
    fprintf(stderr, "no supported algorithm among %d\n", n);
    exit(1);
}

static inline cudnnTensorDescriptor_t tensor4d(cudnnTensorFormat_t f, int n, int c, int h, int w) {
    cudnnTensorDescriptor_t t;
    CHECK(cudnnCreateTensorDescriptor(&t));
    CHECK(cudnnSetTensor4dDescriptor(t, f, CUDNN_DATA_FLOAT, n, c, h, w));
    return t;
}

#endif
