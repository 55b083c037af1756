/* cudnnSoftmaxForward and Backward: every algorithm (fast, accurate, log) and mode (instance,
 * channel), on NCHW and NHWC tensors, with beta blending in the backward. */
#include "common.h"

int main(void) {
    cudnnHandle_t h = make_handle();
    const int n = 3, c = 5, hh = 2, w = 3;
    const size_t cnt = (size_t)n * c * hh * w;
    for (int f = 0; f < 2; f++) {
        cudnnTensorDescriptor_t t = tensor4d(f ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, n, c, hh, w);
        for (int algo = 0; algo < 3; algo++) {
            for (int mode = 0; mode < 2; mode++) {
                printf("# format %d algo %d mode %d\n", f, algo, mode);
                float *x = random_buf(cnt, 1 + algo, -4, 4), *dy = random_buf(cnt, 5 + mode, -1, 1);
                float *y = buf(cnt), *dx = random_buf(cnt, 9, -1, 1);
                float one = 1.0f, zero = 0.0f, half = 0.5f;
                CHECK(cudnnSoftmaxForward(h, (cudnnSoftmaxAlgorithm_t)algo, (cudnnSoftmaxMode_t)mode, &one, t, x, &zero, t, y));
                print_buf("y", y, cnt);
                CHECK(cudnnSoftmaxBackward(h, (cudnnSoftmaxAlgorithm_t)algo, (cudnnSoftmaxMode_t)mode, &one, t, y, t, dy, &half, t, dx));
                print_buf("dx", dx, cnt);
                buf_free(x); buf_free(dy); buf_free(y); buf_free(dx);
            }
        }
        cudnnDestroyTensorDescriptor(t);
    }
    CHECK(cudnnDestroy(h));
    return 0;
}
