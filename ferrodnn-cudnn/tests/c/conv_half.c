/* Half-precision convolution, as frameworks run it: fp16 NHWC tensors, fp32 compute, tensor-op
 * math; forward, backward data and backward filter with groups, dilation and strides.
 * capi_compare: rtol=1e-2 atol=1e-2 */
#include "common.h"
#include <stdint.h>

/* IEEE fp16 <-> fp32 (round to nearest even; the values here are small and normal). */
static uint16_t to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, exp = (x >> 23) & 0xFF, man = x & 0x7FFFFF;
    if (exp < 113) return (uint16_t)sign; /* tiny values flush to zero */
    uint32_t h = ((exp - 112) << 10) | (man >> 13);
    uint32_t rest = man & 0x1FFF;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}
static float from_half(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, x;
    if (exp == 0) x = sign; /* zero (no subnormals here) */
    else x = sign | ((exp + 112) << 23) | (man << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static uint16_t *half_buf(size_t n, unsigned long long s) {
    size_t words = (n + 1) / 2; /* moved as floats: two halves a word */
    uint16_t *h = (uint16_t *)calloc(words * 2, 2);
    seed(s);
    for (size_t i = 0; i < n; i++) h[i] = to_half(uniform(-1, 1));
    uint16_t *d = (uint16_t *)buf(words);
    upload((float *)d, (float *)h, words);
    free(h);
    return d;
}

static void print_half(const char *name, const uint16_t *d, size_t n) {
    uint16_t *h = (uint16_t *)calloc((n + 1) / 2 * 2, 2);
    download((float *)h, (const float *)d, (n + 1) / 2);
    for (size_t i = 0; i < n; i++) printf("%s %zu %.6g\n", name, i, from_half(h[i]));
    free(h);
}

static cudnnTensorDescriptor_t half4d(int n, int c, int h, int w) {
    cudnnTensorDescriptor_t t;
    CHECK(cudnnCreateTensorDescriptor(&t));
    CHECK(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NHWC, CUDNN_DATA_HALF, n, c, h, w));
    return t;
}

int main(void) {
    cudnnHandle_t h = make_handle();
    struct { int n, c, hh, w, k, r, groups, pad, stride, dil; } cases[] = {
        {2, 16, 9, 9, 32, 3, 1, 1, 1, 1},
        {2, 32, 8, 7, 32, 3, 4, 2, 2, 2},
        {4, 16, 6, 6, 64, 1, 1, 0, 1, 1},
    };
    for (int i = 0; i < 3; i++) {
        int n = cases[i].n, c = cases[i].c, hh = cases[i].hh, w = cases[i].w, k = cases[i].k, r = cases[i].r, g = cases[i].groups;
        printf("# case %d\n", i);
        cudnnTensorDescriptor_t xd = half4d(n, c, hh, w);
        cudnnFilterDescriptor_t wd;
        CHECK(cudnnCreateFilterDescriptor(&wd));
        CHECK(cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_HALF, CUDNN_TENSOR_NHWC, k, c / g, r, r));
        cudnnConvolutionDescriptor_t cd;
        CHECK(cudnnCreateConvolutionDescriptor(&cd));
        CHECK(cudnnSetConvolution2dDescriptor(cd, cases[i].pad, cases[i].pad, cases[i].stride, cases[i].stride, cases[i].dil,
                                              cases[i].dil, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
        CHECK(cudnnSetConvolutionGroupCount(cd, g));
        CHECK(cudnnSetConvolutionMathType(cd, CUDNN_TENSOR_OP_MATH));
        int on, oc, oh, ow;
        CHECK(cudnnGetConvolution2dForwardOutputDim(cd, xd, wd, &on, &oc, &oh, &ow));
        cudnnTensorDescriptor_t yd = half4d(on, oc, oh, ow);
        size_t nx = (size_t)n * c * hh * w, nw = (size_t)k * (c / g) * r * r, ny = (size_t)on * oc * oh * ow;
        uint16_t *x = half_buf(nx, 1 + i), *wt = half_buf(nw, 5 + i), *dy = half_buf(ny, 9 + i);
        uint16_t *y = half_buf(ny, 13), *dx = half_buf(nx, 14), *dw = half_buf(nw, 15);
        float one = 1.0f, zero = 0.0f;
        int got;
        cudnnConvolutionFwdAlgoPerf_t fps[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, xd, wd, cd, yd, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, fps));
        cudnnConvolutionFwdAlgoPerf_t fp = fps[first_ok(&fps[0].status, sizeof fps[0], got)];
        size_t ws_bytes = 0;
        CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, xd, wd, cd, yd, fp.algo, &ws_bytes));
        float *ws = ws_bytes ? buf(ws_bytes / 4 + 1) : NULL;
        CHECK(cudnnConvolutionForward(h, &one, xd, x, wd, wt, cd, fp.algo, ws, ws_bytes, &zero, yd, y));
        print_half("y", y, ny);
        cudnnConvolutionBwdDataAlgoPerf_t dps[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, wd, yd, cd, xd, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, dps));
        cudnnConvolutionBwdDataAlgoPerf_t dp = dps[first_ok(&dps[0].status, sizeof dps[0], got)];
        size_t wsd = 0;
        CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(h, wd, yd, cd, xd, dp.algo, &wsd));
        float *ws2 = wsd ? buf(wsd / 4 + 1) : NULL;
        CHECK(cudnnConvolutionBackwardData(h, &one, wd, wt, yd, dy, cd, dp.algo, ws2, wsd, &zero, xd, dx));
        print_half("dx", dx, nx);
        cudnnConvolutionBwdFilterAlgoPerf_t fpws[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, xd, yd, cd, wd, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got, fpws));
        cudnnConvolutionBwdFilterAlgoPerf_t fpw = fpws[first_ok(&fpws[0].status, sizeof fpws[0], got)];
        size_t wsf = 0;
        CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, xd, yd, cd, wd, fpw.algo, &wsf));
        float *ws3 = wsf ? buf(wsf / 4 + 1) : NULL;
        CHECK(cudnnConvolutionBackwardFilter(h, &one, xd, x, yd, dy, cd, fpw.algo, ws3, wsf, &zero, wd, dw));
        print_half("dw", dw, nw);
        buf_free((float *)x); buf_free((float *)wt); buf_free((float *)dy); buf_free((float *)y); buf_free((float *)dx); buf_free((float *)dw);
        if (ws) buf_free(ws);
        if (ws2) buf_free(ws2);
        if (ws3) buf_free(ws3);
        cudnnDestroyTensorDescriptor(xd); cudnnDestroyTensorDescriptor(yd);
        cudnnDestroyFilterDescriptor(wd); cudnnDestroyConvolutionDescriptor(cd);
    }
    CHECK(cudnnDestroy(h));
    return 0;
}
