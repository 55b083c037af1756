/* cudnnActivationForward and Backward: sigmoid, relu, tanh, clipped relu, elu, swish, on NCHW
 * and NHWC tensors, with alpha/beta blending and in place (y in x's memory). */
#include "common.h"

int main(void) {
    cudnnHandle_t h = make_handle();
    const int n = 2, c = 3, hh = 5, w = 7;
    const size_t cnt = (size_t)n * c * hh * w;
    cudnnActivationMode_t modes[] = {CUDNN_ACTIVATION_SIGMOID, CUDNN_ACTIVATION_RELU, CUDNN_ACTIVATION_TANH,
                                     CUDNN_ACTIVATION_CLIPPED_RELU, CUDNN_ACTIVATION_ELU, CUDNN_ACTIVATION_SWISH};
    for (int f = 0; f < 2; f++) {
        cudnnTensorDescriptor_t t = tensor4d(f ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, n, c, hh, w);
        for (int m = 0; m < 6; m++) {
            printf("# format %d mode %d\n", f, modes[m]);
            cudnnActivationDescriptor_t a;
            CHECK(cudnnCreateActivationDescriptor(&a));
            CHECK(cudnnSetActivationDescriptor(a, modes[m], CUDNN_NOT_PROPAGATE_NAN, 0.7));
            CHECK(cudnnSetActivationDescriptorSwishBeta(a, 1.5));
            float *x = random_buf(cnt, 10 + m, -3, 3), *dy = random_buf(cnt, 20 + m, -1, 1);
            float *y = buf(cnt), *dx = random_buf(cnt, 30 + m, -1, 1);
            float one = 1.0f, zero = 0.0f, alpha = 0.5f, beta = 0.25f;
            CHECK(cudnnActivationForward(h, a, &one, t, x, &zero, t, y));
            print_buf("y", y, cnt);
            CHECK(cudnnActivationBackward(h, a, &alpha, t, y, t, dy, t, x, &beta, t, dx));
            print_buf("dx", dx, cnt);
            /* In place: x <- 0.5 act(x) + 0.25 x. */
            CHECK(cudnnActivationForward(h, a, &alpha, t, x, &beta, t, x));
            print_buf("inplace", x, cnt);
            buf_free(x); buf_free(dy); buf_free(y); buf_free(dx);
            cudnnDestroyActivationDescriptor(a);
        }
        cudnnDestroyTensorDescriptor(t);
    }
    CHECK(cudnnDestroy(h));
    return 0;
}
