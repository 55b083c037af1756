/* Convolution forward, backward data, backward filter and backward bias, NCHW and NHWC, with
 * groups, dilation, strides, padding and alpha/beta blending, on algorithms from the
 * heuristic (cudnnGet*Algorithm_v7) with the workspace size asked for. FMA math: both
 * libraries compute in full fp32. */
#include "common.h"

typedef struct {
    cudnnTensorFormat_t f;
    int n, c, h, w, k, r, s, groups, ph, pw, sh, sw, dh, dw;
    float alpha, beta;
} Case;

static void *workspace(size_t bytes) { return bytes ? (void *)buf(bytes / sizeof(float) + 1) : NULL; }

int main(void) {
    cudnnHandle_t h = make_handle();
    Case cases[] = {
        {CUDNN_TENSOR_NCHW, 2, 4, 9, 7, 6, 3, 3, 2, 1, 1, 1, 2, 1, 1, 1.0f, 0.0f},
        {CUDNN_TENSOR_NHWC, 2, 6, 8, 9, 9, 3, 2, 3, 2, 1, 2, 1, 2, 2, 1.0f, 0.0f},
        {CUDNN_TENSOR_NCHW, 1, 3, 11, 10, 5, 5, 5, 1, 2, 2, 2, 2, 1, 1, 0.5f, 0.25f},
        {CUDNN_TENSOR_NHWC, 3, 8, 5, 5, 8, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1.0f, 1.0f},
    };
    for (int ci = 0; ci < (int)(sizeof cases / sizeof cases[0]); ci++) {
        Case k = cases[ci];
        printf("# case %d\n", ci);
        cudnnTensorDescriptor_t xd = tensor4d(k.f, k.n, k.c, k.h, k.w);
        cudnnFilterDescriptor_t wd;
        CHECK(cudnnCreateFilterDescriptor(&wd));
        CHECK(cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_FLOAT, k.f, k.k, k.c / k.groups, k.r, k.s));
        cudnnConvolutionDescriptor_t cd;
        CHECK(cudnnCreateConvolutionDescriptor(&cd));
        CHECK(cudnnSetConvolution2dDescriptor(cd, k.ph, k.pw, k.sh, k.sw, k.dh, k.dw, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
        CHECK(cudnnSetConvolutionGroupCount(cd, k.groups));
        CHECK(cudnnSetConvolutionMathType(cd, CUDNN_FMA_MATH));
        int on, oc, oh, ow;
        CHECK(cudnnGetConvolution2dForwardOutputDim(cd, xd, wd, &on, &oc, &oh, &ow));
        printf("# output %d %d %d %d\n", on, oc, oh, ow);
        cudnnTensorDescriptor_t yd = tensor4d(k.f, on, oc, oh, ow);
        cudnnTensorDescriptor_t bd = tensor4d(CUDNN_TENSOR_NCHW, 1, oc, 1, 1);
        size_t nx = (size_t)k.n * k.c * k.h * k.w, nw = (size_t)k.k * (k.c / k.groups) * k.r * k.s;
        size_t ny = (size_t)on * oc * oh * ow;
        float *x = random_buf(nx, 10 + ci, -1, 1), *w = random_buf(nw, 20 + ci, -1, 1);
        float *dy = random_buf(ny, 30 + ci, -1, 1);
        /* Outputs start from seeded values, which beta blends in. */
        float *y = random_buf(ny, 40 + ci, -1, 1), *dx = random_buf(nx, 50 + ci, -1, 1);
        float *dw = random_buf(nw, 60 + ci, -1, 1), *db = random_buf(oc, 70 + ci, -1, 1);

        int got;
        cudnnConvolutionFwdAlgoPerf_t fps[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, xd, wd, cd, yd, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, fps));
        cudnnConvolutionFwdAlgoPerf_t fp = fps[first_ok(&fps[0].status, sizeof fps[0], got)];
        size_t ws_bytes;
        CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, xd, wd, cd, yd, fp.algo, &ws_bytes));
        void *ws = workspace(ws_bytes);
        CHECK(cudnnConvolutionForward(h, &k.alpha, xd, x, wd, w, cd, fp.algo, ws, ws_bytes, &k.beta, yd, y));
        print_buf("y", y, ny);

        cudnnConvolutionBwdDataAlgoPerf_t dps[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, wd, yd, cd, xd, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, dps));
        cudnnConvolutionBwdDataAlgoPerf_t dp = dps[first_ok(&dps[0].status, sizeof dps[0], got)];
        size_t wsd;
        CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(h, wd, yd, cd, xd, dp.algo, &wsd));
        void *ws2 = workspace(wsd);
        CHECK(cudnnConvolutionBackwardData(h, &k.alpha, wd, w, yd, dy, cd, dp.algo, ws2, wsd, &k.beta, xd, dx));
        print_buf("dx", dx, nx);

        cudnnConvolutionBwdFilterAlgoPerf_t wps[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, xd, yd, cd, wd, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got, wps));
        cudnnConvolutionBwdFilterAlgoPerf_t wp = wps[first_ok(&wps[0].status, sizeof wps[0], got)];
        size_t wsf;
        CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, xd, yd, cd, wd, wp.algo, &wsf));
        void *ws3 = workspace(wsf);
        CHECK(cudnnConvolutionBackwardFilter(h, &k.alpha, xd, x, yd, dy, cd, wp.algo, ws3, wsf, &k.beta, wd, dw));
        print_buf("dw", dw, nw);

        CHECK(cudnnConvolutionBackwardBias(h, &k.alpha, yd, dy, &k.beta, bd, db));
        print_buf("db", db, oc);

        buf_free(x); buf_free(w); buf_free(dy); buf_free(y); buf_free(dx); buf_free(dw); buf_free(db);
        if (ws) buf_free(ws);
        if (ws2) buf_free(ws2);
        if (ws3) buf_free(ws3);
        cudnnDestroyTensorDescriptor(xd); cudnnDestroyTensorDescriptor(yd); cudnnDestroyTensorDescriptor(bd);
        cudnnDestroyFilterDescriptor(wd); cudnnDestroyConvolutionDescriptor(cd);
    }
    CHECK(cudnnDestroy(h));
    return 0;
}
