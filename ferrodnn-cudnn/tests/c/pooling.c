/* cudnnPoolingForward and Backward: max and both averages, with padding and strides, on NCHW
 * and NHWC tensors. */
#include "common.h"

int main(void) {
    cudnnHandle_t h = make_handle();
    const int n = 2, c = 3, hh = 9, w = 8;
    const size_t nx = (size_t)n * c * hh * w;
    struct { cudnnPoolingMode_t mode; int wh, ww, ph, pw, sh, sw; } cases[] = {
        {CUDNN_POOLING_MAX, 3, 3, 1, 1, 2, 2},
        {CUDNN_POOLING_MAX, 2, 2, 0, 0, 2, 2},
        {CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING, 3, 2, 1, 1, 2, 1},
        {CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING, 3, 3, 1, 1, 1, 2},
    };
    for (int f = 0; f < 2; f++) {
        cudnnTensorFormat_t fmt = f ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
        cudnnTensorDescriptor_t xd = tensor4d(fmt, n, c, hh, w);
        for (int i = 0; i < 4; i++) {
            cudnnPoolingDescriptor_t pd;
            CHECK(cudnnCreatePoolingDescriptor(&pd));
            CHECK(cudnnSetPooling2dDescriptor(pd, cases[i].mode, CUDNN_NOT_PROPAGATE_NAN, cases[i].wh, cases[i].ww, cases[i].ph,
                                              cases[i].pw, cases[i].sh, cases[i].sw));
            int on, oc, oh, ow;
            CHECK(cudnnGetPooling2dForwardOutputDim(pd, xd, &on, &oc, &oh, &ow));
            printf("# format %d case %d output %d %d %d %d\n", f, i, on, oc, oh, ow);
            cudnnTensorDescriptor_t yd = tensor4d(fmt, on, oc, oh, ow);
            size_t ny = (size_t)on * oc * oh * ow;
            float *x = random_buf(nx, 3 + i, -1, 1), *dy = random_buf(ny, 7 + i, -1, 1);
            float *y = buf(ny), *dx = buf(nx);
            float one = 1.0f, zero = 0.0f;
            CHECK(cudnnPoolingForward(h, pd, &one, xd, x, &zero, yd, y));
            print_buf("y", y, ny);
            CHECK(cudnnPoolingBackward(h, pd, &one, yd, y, yd, dy, xd, x, &zero, xd, dx));
            print_buf("dx", dx, nx);
            buf_free(x); buf_free(dy); buf_free(y); buf_free(dx);
            cudnnDestroyTensorDescriptor(yd);
            cudnnDestroyPoolingDescriptor(pd);
        }
        cudnnDestroyTensorDescriptor(xd);
    }
    CHECK(cudnnDestroy(h));
    return 0;
}
