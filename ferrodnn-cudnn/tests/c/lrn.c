/* Cross-channel LRN forward and backward (NCHW, a window of 5 channels), and the forward with
 * alpha and beta blending. */
#include "common.h"

int main(void) {
    cudnnHandle_t h = make_handle();
    const int n = 2, c = 9, hh = 5, w = 6;
    const size_t count = (size_t)n * c * hh * w;
    cudnnTensorDescriptor_t t = tensor4d(CUDNN_TENSOR_NCHW, n, c, hh, w);
    cudnnLRNDescriptor_t d;
    CHECK(cudnnCreateLRNDescriptor(&d));
    CHECK(cudnnSetLRNDescriptor(d, 5, 0.5, 0.75, 1.5));
    float *x = random_buf(count, 1, -2, 2), *y = buf(count), *dy = random_buf(count, 2, -1, 1), *dx = buf(count);
    float one = 1.0f, zero = 0.0f;
    CHECK(cudnnLRNCrossChannelForward(h, d, CUDNN_LRN_CROSS_CHANNEL_DIM1, &one, t, x, &zero, t, y));
    printf("# forward\n");
    print_buf("y", y, count);
    CHECK(cudnnLRNCrossChannelBackward(h, d, CUDNN_LRN_CROSS_CHANNEL_DIM1, &one, t, y, t, dy, t, x, &zero, t, dx));
    printf("# backward\n");
    print_buf("dx", dx, count);
    float a = 0.5f, b = 2.0f;
    CHECK(cudnnLRNCrossChannelForward(h, d, CUDNN_LRN_CROSS_CHANNEL_DIM1, &a, t, x, &b, t, y));
    printf("# forward blended\n");
    print_buf("y", y, count);
    buf_free(x);
    buf_free(y);
    buf_free(dy);
    buf_free(dx);
    CHECK(cudnnDestroyLRNDescriptor(d));
    CHECK(cudnnDestroy(h));
    return 0;
}
