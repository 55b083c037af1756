/* cudnnAddTensor (a broadcast bias), cudnnOpTensor (every op, B broadcast), cudnnReduceTensor
 * (every op without indices, over two axes), cudnnTransformTensor (NCHW to NHWC),
 * cudnnScaleTensor and cudnnSetTensor. */
#include "common.h"

int main(void) {
    cudnnHandle_t h = make_handle();
    const int n = 2, c = 4, hh = 3, w = 5;
    const size_t cnt = (size_t)n * c * hh * w;
    cudnnTensorDescriptor_t t = tensor4d(CUDNN_TENSOR_NCHW, n, c, hh, w);
    cudnnTensorDescriptor_t bias_d = tensor4d(CUDNN_TENSOR_NCHW, 1, c, 1, 1);
    float one = 1.0f, zero = 0.0f, two = 2.0f, half = 0.5f, quarter = 0.25f;
    float *a = random_buf(cnt, 1, 0.1f, 2), *b = random_buf(c, 2, -1, 1);

    printf("# add tensor\n");
    float *out = random_buf(cnt, 3, -1, 1);
    CHECK(cudnnAddTensor(h, &two, bias_d, b, &one, t, out));
    print_buf("add", out, cnt);

    for (int op = 0; op < 6; op++) {
        printf("# op tensor %d\n", op);
        cudnnOpTensorDescriptor_t od;
        CHECK(cudnnCreateOpTensorDescriptor(&od));
        CHECK(cudnnSetOpTensorDescriptor(od, (cudnnOpTensorOp_t)op, CUDNN_DATA_FLOAT, CUDNN_NOT_PROPAGATE_NAN));
        float *o = random_buf(cnt, 4, -1, 1);
        CHECK(cudnnOpTensor(h, od, &half, t, a, &two, bias_d, b, &quarter, t, o));
        print_buf("op", o, cnt);
        buf_free(o);
        cudnnDestroyOpTensorDescriptor(od);
    }

    cudnnTensorDescriptor_t cd = tensor4d(CUDNN_TENSOR_NCHW, 1, c, 1, w);
    for (int op = 0; op <= 7; op++) {
        printf("# reduce %d\n", op);
        cudnnReduceTensorDescriptor_t rd;
        CHECK(cudnnCreateReduceTensorDescriptor(&rd));
        CHECK(cudnnSetReduceTensorDescriptor(rd, (cudnnReduceTensorOp_t)op, CUDNN_DATA_FLOAT, CUDNN_NOT_PROPAGATE_NAN,
                                             CUDNN_REDUCE_TENSOR_NO_INDICES, CUDNN_32BIT_INDICES));
        size_t ws_bytes = 0;
        CHECK(cudnnGetReductionWorkspaceSize(h, rd, t, cd, &ws_bytes));
        float *ws = ws_bytes ? buf(ws_bytes / sizeof(float) + 1) : NULL;
        float *o = buf((size_t)c * w);
        CHECK(cudnnReduceTensor(h, rd, NULL, 0, ws, ws_bytes, &one, t, a, &zero, cd, o));
        print_buf("reduce", o, (size_t)c * w);
        buf_free(o);
        if (ws) buf_free(ws);
        cudnnDestroyReduceTensorDescriptor(rd);
    }

    for (int op = 2; op <= 4; op++) {
        printf("# reduce %d with indices\n", op);
        cudnnReduceTensorDescriptor_t rd;
        CHECK(cudnnCreateReduceTensorDescriptor(&rd));
        CHECK(cudnnSetReduceTensorDescriptor(rd, (cudnnReduceTensorOp_t)op, CUDNN_DATA_FLOAT, CUDNN_NOT_PROPAGATE_NAN,
                                             CUDNN_REDUCE_TENSOR_FLATTENED_INDICES, CUDNN_32BIT_INDICES));
        size_t ws_bytes = 0, idx_bytes = 0;
        CHECK(cudnnGetReductionWorkspaceSize(h, rd, t, cd, &ws_bytes));
        CHECK(cudnnGetReductionIndicesSize(h, rd, t, cd, &idx_bytes));
        float *ws = ws_bytes ? buf(ws_bytes / sizeof(float) + 1) : NULL;
        float *idx = buf(idx_bytes / sizeof(float) + 1), *o = buf((size_t)c * w);
        float *signed_a = random_buf(cnt, 11, -1, 1);
        CHECK(cudnnReduceTensor(h, rd, idx, idx_bytes, ws, ws_bytes, &one, t, signed_a, &zero, cd, o));
        print_buf("reduce", o, (size_t)c * w);
        unsigned int *host = (unsigned int *)malloc(idx_bytes);
        download((float *)host, idx, idx_bytes / sizeof(float));
        for (size_t i = 0; i < idx_bytes / sizeof(unsigned int); i++) printf("index %zu %u\n", i, host[i]);
        free(host);
        buf_free(o); buf_free(idx); buf_free(signed_a);
        if (ws) buf_free(ws);
        cudnnDestroyReduceTensorDescriptor(rd);
    }

    printf("# transform, scale, set\n");
    cudnnTensorDescriptor_t nhwc = tensor4d(CUDNN_TENSOR_NHWC, n, c, hh, w);
    float *tr = buf(cnt);
    CHECK(cudnnTransformTensor(h, &one, t, a, &zero, nhwc, tr));
    print_buf("transform", tr, cnt);
    float three = 3.0f, v = -1.25f;
    CHECK(cudnnScaleTensor(h, nhwc, tr, &three));
    print_buf("scale", tr, cnt);
    CHECK(cudnnSetTensor(h, nhwc, tr, &v));
    print_buf("set", tr, cnt);
    CHECK(cudnnDestroy(h));
    return 0;
}
