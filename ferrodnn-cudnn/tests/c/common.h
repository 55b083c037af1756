/* Shared helpers of the C API's test programs: built against NVIDIA's cudnn.h and linked
 * against either NVIDIA's libcudnn or ferrodnn's (scripts/capi_compare.sh). With -DGPU buffers
 * live in device memory (cudaMalloc); without it in host memory, which only ferrodnn's library
 * takes (its CPU handle, asked for with FERRODNN_CUDNN_DEVICE=cpu).
 *
 * Each program prints "# section" lines and one "name index value" line per output element, so
 * that two runs can be compared number by number. */
#ifndef FERRODNN_CAPI_TEST_COMMON_H
#define FERRODNN_CAPI_TEST_COMMON_H

#include <cudnn.h>
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
#define CUDA_CHECK(call)                                                                     \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) {                                                             \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,             \
                    cudaGetErrorString(e_));                                                 \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)
#endif

static cudnnHandle_t make_handle(void) {
#ifndef GPU
    /* Host pointers: ferrodnn's CPU handle (NVIDIA's library cannot run this build). */
    setenv("FERRODNN_CUDNN_DEVICE", "cpu", 1);
#endif
    cudnnHandle_t h;
    CHECK(cudnnCreate(&h));
    return h;
}

/* Buffers of `n` floats: device memory with -DGPU, host memory otherwise. */
static float *buf(size_t n) {
    void *p = NULL;
#ifdef GPU
    CUDA_CHECK(cudaMalloc(&p, n * sizeof(float) + 16));
#else
    p = malloc(n * sizeof(float) + 16);
#endif
    return (float *)p;
}

static void buf_free(float *p) {
#ifdef GPU
    cudaFree(p);
#else
    free(p);
#endif
}

static void upload(float *dst, const float *src, size_t n) {
#ifdef GPU
    CUDA_CHECK(cudaMemcpy(dst, src, n * sizeof(float), cudaMemcpyHostToDevice));
#else
    memcpy(dst, src, n * sizeof(float));
#endif
}

static void download(float *dst, const float *src, size_t n) {
#ifdef GPU
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost));
#else
    memcpy(dst, src, n * sizeof(float));
#endif
}

/* Seeded values in [lo, hi): a 64-bit LCG, the same on every machine. */
static unsigned long long rng_state = 1;
static void seed(unsigned long long s) { rng_state = s * 6364136223846793005ULL + 1442695040888963407ULL; }
static float uniform(float lo, float hi) {
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return lo + (hi - lo) * (float)((rng_state >> 40) & 0xFFFFFF) / 16777216.0f;
}

/* A device (or host) buffer of n seeded values. */
static float *random_buf(size_t n, unsigned long long s, float lo, float hi) {
    float *h = (float *)malloc(n * sizeof(float));
    seed(s);
    for (size_t i = 0; i < n; i++) h[i] = uniform(lo, hi);
    float *d = buf(n);
    upload(d, h, n);
    free(h);
    return d;
}

static void print_buf(const char *name, const float *d, size_t n) {
    float *h = (float *)malloc(n * sizeof(float));
    download(h, d, n);
    for (size_t i = 0; i < n; i++) printf("%s %zu %.9g\n", name, i, h[i]);
    free(h);
}

static cudnnTensorDescriptor_t tensor4d(cudnnTensorFormat_t f, int n, int c, int h, int w) {
    cudnnTensorDescriptor_t t;
    CHECK(cudnnCreateTensorDescriptor(&t));
    CHECK(cudnnSetTensor4dDescriptor(t, f, CUDNN_DATA_FLOAT, n, c, h, w));
    return t;
}

#endif
