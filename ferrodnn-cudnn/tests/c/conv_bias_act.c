/* cudnnConvolutionBiasActivationForward: conv (NHWC, 2 groups, padding) + alpha2 * z + bias,
 * then ReLU, with y in z's memory (as residual blocks call it) and without z (alpha2 = 0). */
#include "common.h"

int main(void) {
    cudnnHandle_t h = make_handle();
    const int n = 2, c = 8, hh = 7, w = 6, k = 12, groups = 2;
    cudnnTensorDescriptor_t xd = tensor4d(CUDNN_TENSOR_NHWC, n, c, hh, w);
    cudnnFilterDescriptor_t wd;
    CHECK(cudnnCreateFilterDescriptor(&wd));
    CHECK(cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, k, c / groups, 3, 3));
    cudnnConvolutionDescriptor_t cd;
    CHECK(cudnnCreateConvolutionDescriptor(&cd));
    CHECK(cudnnSetConvolution2dDescriptor(cd, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    CHECK(cudnnSetConvolutionGroupCount(cd, groups));
    CHECK(cudnnSetConvolutionMathType(cd, CUDNN_FMA_MATH));
    cudnnTensorDescriptor_t yd = tensor4d(CUDNN_TENSOR_NHWC, n, k, hh, w);
    cudnnTensorDescriptor_t bd = tensor4d(CUDNN_TENSOR_NCHW, 1, k, 1, 1);
    cudnnActivationDescriptor_t act;
    CHECK(cudnnCreateActivationDescriptor(&act));
    CHECK(cudnnSetActivationDescriptor(act, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0));
    size_t nx = (size_t)n * c * hh * w, nw = (size_t)k * (c / groups) * 9, ny = (size_t)n * k * hh * w;
    float *x = random_buf(nx, 1, -1, 1), *wt = random_buf(nw, 2, -1, 1), *bias = random_buf(k, 3, -1, 1);
    /* IMPLICIT_PRECOMP_GEMM: the algorithm cuDNN documents for this call. */
    cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
    size_t ws_bytes = 0;
    CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, xd, wd, cd, yd, algo, &ws_bytes));
    float *ws = ws_bytes ? buf(ws_bytes / sizeof(float) + 1) : NULL;
    float alphas[][2] = {{1.0f, 0.0f}, {0.75f, 0.5f}};
    for (int i = 0; i < 2; i++) {
        printf("# alpha1 %g alpha2 %g\n", alphas[i][0], alphas[i][1]);
        float *zy = random_buf(ny, 4 + i, -1, 1);
        CHECK(cudnnConvolutionBiasActivationForward(h, &alphas[i][0], xd, x, wd, wt, cd, algo, ws, ws_bytes, &alphas[i][1], yd, zy,
                                                    bd, bias, act, yd, zy));
        print_buf("y", zy, ny);
        buf_free(zy);
    }
    CHECK(cudnnDestroy(h));
    return 0;
}
