/* Bad calls, each with valid pointers (so that no library dereferences garbage): the status
 * class of each (0 success, 2000 bad parameter, 3000 not supported, ...) is printed, so that
 * capi_compare.sh checks ours refuses what NVIDIA's refuses, the same way; the exact codes go to
 * standard error. */
#include "common.h"

static int step = 0;
static void status(cudnnStatus_t s) {
    fprintf(stderr, "step %d: %d %s\n", step, (int)s, cudnnGetErrorString(s));
    printf("status %d %d\n", step++, ((int)s / 1000) * 1000);
}

int main(void) {
    cudnnHandle_t h = make_handle();
    printf("# %s\n", cudnnGetErrorString(CUDNN_STATUS_BAD_PARAM));
    printf("# %s\n", cudnnGetErrorString(CUDNN_STATUS_NOT_SUPPORTED));
    status(cudnnCreate(NULL));
    cudnnTensorDescriptor_t t;
    CHECK(cudnnCreateTensorDescriptor(&t));
    status(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, -2, 3, 4));
    status(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, (cudnnDataType_t)100, 1, 2, 3, 4));
    status(cudnnSetTensor4dDescriptor(t, (cudnnTensorFormat_t)7, CUDNN_DATA_FLOAT, 1, 2, 3, 4));
    int dims9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1}, str9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    status(cudnnSetTensorNdDescriptor(t, CUDNN_DATA_FLOAT, 9, dims9, str9));
    cudnnFilterDescriptor_t f;
    CHECK(cudnnCreateFilterDescriptor(&f));
    status(cudnnSetFilter4dDescriptor(f, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 0, 3, 3, 3));
    cudnnConvolutionDescriptor_t c;
    CHECK(cudnnCreateConvolutionDescriptor(&c));
    status(cudnnSetConvolution2dDescriptor(c, -1, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    status(cudnnSetConvolution2dDescriptor(c, 0, 0, 0, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    status(cudnnSetConvolution2dDescriptor(c, 0, 0, 1, 1, 1, 1, (cudnnConvolutionMode_t)5, CUDNN_DATA_FLOAT));
    status(cudnnSetConvolutionGroupCount(c, 0));

    /* Consistent descriptors, then inconsistent ones. */
    cudnnTensorDescriptor_t x = tensor4d(CUDNN_TENSOR_NCHW, 2, 4, 5, 5), y = tensor4d(CUDNN_TENSOR_NCHW, 2, 6, 3, 3);
    cudnnTensorDescriptor_t wrong_y = tensor4d(CUDNN_TENSOR_NCHW, 2, 6, 4, 4);
    CHECK(cudnnSetFilter4dDescriptor(f, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 6, 3, 3, 3)); /* 3 != 4 channels */
    CHECK(cudnnSetConvolution2dDescriptor(c, 0, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    int n, cc, hh, ww;
    status(cudnnGetConvolution2dForwardOutputDim(c, x, f, &n, &cc, &hh, &ww));
    CHECK(cudnnSetFilter4dDescriptor(f, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 6, 4, 3, 3));
    float *xb = random_buf(2 * 4 * 25, 1, -1, 1), *wb = random_buf(6 * 4 * 9, 2, -1, 1), *yb = buf(2 * 6 * 16);
    float one = 1.0f, zero = 0.0f;
    status(cudnnConvolutionForward(h, &one, x, xb, f, wb, c, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, NULL, 0, &zero, wrong_y, yb));
    status(cudnnConvolutionForward(h, &one, x, xb, f, wb, c, (cudnnConvolutionFwdAlgo_t)99, NULL, 0, &zero, y, yb));
    int got;
    cudnnConvolutionFwdAlgoPerf_t perf;
    status(cudnnGetConvolutionForwardAlgorithm_v7(h, x, f, c, y, 0, &got, &perf));

    cudnnActivationDescriptor_t a;
    CHECK(cudnnCreateActivationDescriptor(&a));
    status(cudnnSetActivationDescriptor(a, (cudnnActivationMode_t)42, CUDNN_NOT_PROPAGATE_NAN, 0.0));
    CHECK(cudnnSetActivationDescriptor(a, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0));
    status(cudnnActivationForward(h, a, &one, x, xb, &zero, y, yb));

    cudnnPoolingDescriptor_t p;
    CHECK(cudnnCreatePoolingDescriptor(&p));
    status(cudnnSetPooling2dDescriptor(p, CUDNN_POOLING_MAX, CUDNN_NOT_PROPAGATE_NAN, 0, 2, 0, 0, 1, 1));
    CHECK(cudnnSetPooling2dDescriptor(p, CUDNN_POOLING_MAX, CUDNN_NOT_PROPAGATE_NAN, 2, 2, 0, 0, 2, 2));
    status(cudnnPoolingForward(h, p, &one, x, xb, &zero, y, yb)); /* y should be [2, 4, 2, 2] */

    status(cudnnSoftmaxForward(h, (cudnnSoftmaxAlgorithm_t)9, CUDNN_SOFTMAX_MODE_CHANNEL, &one, x, xb, &zero, x, xb));
    cudnnTensorDescriptor_t bias5 = tensor4d(CUDNN_TENSOR_NCHW, 1, 5, 1, 1);
    status(cudnnAddTensor(h, &one, bias5, wb, &one, x, xb));

    cudnnTensorDescriptor_t bn_wrong = tensor4d(CUDNN_TENSOR_NCHW, 1, 3, 1, 1);
    float *p3 = random_buf(8, 3, 0.5f, 1);
    status(cudnnBatchNormalizationForwardTraining(h, CUDNN_BATCHNORM_SPATIAL, &one, &zero, x, xb, x, xb, bn_wrong, p3, p3, 0.1, NULL, NULL,
                                                  1e-5, NULL, NULL));
    CHECK(cudnnDestroy(h));
    return 0;
}
