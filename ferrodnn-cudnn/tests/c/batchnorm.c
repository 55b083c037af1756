/* Batch normalization: training forward (running statistics updated in place, saved mean and
 * inverse std), inference, backward, in SPATIAL (NCHW and NHWC) and PER_ACTIVATION modes. */
#include "common.h"

int main(void) {
    cudnnHandle_t h = make_handle();
    const int n = 4, c = 3, hh = 5, w = 6;
    const size_t cnt = (size_t)n * c * hh * w;
    struct { cudnnBatchNormMode_t mode; cudnnTensorFormat_t fmt; } cases[] = {
        {CUDNN_BATCHNORM_SPATIAL, CUDNN_TENSOR_NCHW},
        {CUDNN_BATCHNORM_SPATIAL, CUDNN_TENSOR_NHWC},
        {CUDNN_BATCHNORM_PER_ACTIVATION, CUDNN_TENSOR_NCHW},
    };
    for (int i = 0; i < 3; i++) {
        printf("# case %d\n", i);
        cudnnTensorDescriptor_t xd = tensor4d(cases[i].fmt, n, c, hh, w);
        cudnnTensorDescriptor_t bd;
        CHECK(cudnnCreateTensorDescriptor(&bd));
        CHECK(cudnnDeriveBNTensorDescriptor(bd, xd, cases[i].mode));
        size_t np = cases[i].mode == CUDNN_BATCHNORM_PER_ACTIVATION ? (size_t)c * hh * w : (size_t)c;
        float *x = random_buf(cnt, 1 + i, -1, 2), *scale = random_buf(np, 5, 0.5f, 1.5f), *bias = random_buf(np, 6, -1, 1);
        float *rm = random_buf(np, 7, -1, 1), *rv = random_buf(np, 8, 0.5f, 1.5f);
        float *sm = buf(np), *sv = buf(np), *y = buf(cnt);
        float one = 1.0f, zero = 0.0f;
        double eps = 1e-4;
        CHECK(cudnnBatchNormalizationForwardTraining(h, cases[i].mode, &one, &zero, xd, x, xd, y, bd, scale, bias, 0.25, rm, rv, eps, sm, sv));
        print_buf("y", y, cnt);
        print_buf("saved_mean", sm, np);
        print_buf("saved_inv_std", sv, np);
        print_buf("running_mean", rm, np);
        print_buf("running_var", rv, np);
        float *yi = buf(cnt);
        CHECK(cudnnBatchNormalizationForwardInference(h, cases[i].mode, &one, &zero, xd, x, xd, yi, bd, scale, bias, rm, rv, eps));
        print_buf("inference", yi, cnt);
        float *dy = random_buf(cnt, 9, -1, 1), *dx = buf(cnt), *ds = buf(np), *db = buf(np);
        CHECK(cudnnBatchNormalizationBackward(h, cases[i].mode, &one, &zero, &one, &zero, xd, x, xd, dy, xd, dx, bd, scale, ds, db, eps, sm, sv));
        print_buf("dx", dx, cnt);
        print_buf("dscale", ds, np);
        print_buf("dbias", db, np);
        buf_free(x); buf_free(scale); buf_free(bias); buf_free(rm); buf_free(rv); buf_free(sm); buf_free(sv);
        buf_free(y); buf_free(yi); buf_free(dy); buf_free(dx); buf_free(ds); buf_free(db);
        cudnnDestroyTensorDescriptor(xd);
        cudnnDestroyTensorDescriptor(bd);
    }
    CHECK(cudnnDestroy(h));
    return 0;
}
