/* RNN v8 API: a two-layer bidirectional LSTM on padded sequence-major data with varying
 * lengths, training forward, backward data and backward weights (add mode). The weight space is
 * filled through cudnnGetRNNWeightParams' pointers (seeded values per matrix and bias), and the
 * weight gradient printed through them, so every number is layout-independent; the offsets of
 * each matrix and bias in the weight space are printed too ("w_offset"), which checks that
 * ours lays the weight space out as NVIDIA's does.
 * capi_compare: rtol=2e-3 atol=2e-4 (the engines may use TF32 or another summation order) */
#include "common.h"

#define LAYERS 2
#define DIRS 2
#define IN 4
#define HID 5
#define T 4
#define B 3

int main(void) {
    cudnnHandle_t h = make_handle();
    cudnnDropoutDescriptor_t drop;
    CHECK(cudnnCreateDropoutDescriptor(&drop));
    size_t states_bytes;
    CHECK(cudnnDropoutGetStatesSize(h, &states_bytes));
    float *states = buf(states_bytes / sizeof(float) + 1);
    CHECK(cudnnSetDropoutDescriptor(drop, h, 0.0f, states, states_bytes, 7));
    cudnnRNNDescriptor_t rnn;
    CHECK(cudnnCreateRNNDescriptor(&rnn));
    CHECK(cudnnSetRNNDescriptor_v8(rnn, CUDNN_RNN_ALGO_STANDARD, CUDNN_LSTM, CUDNN_RNN_DOUBLE_BIAS, CUDNN_BIDIRECTIONAL, CUDNN_LINEAR_INPUT,
                                   CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, CUDNN_DEFAULT_MATH, IN, HID, HID, LAYERS, drop,
                                   CUDNN_RNN_PADDED_IO_ENABLED));
    int lens[B] = {4, 2, 3};
    float fill = 0.0f;
    cudnnRNNDataDescriptor_t xd, yd;
    CHECK(cudnnCreateRNNDataDescriptor(&xd));
    CHECK(cudnnCreateRNNDataDescriptor(&yd));
    CHECK(cudnnSetRNNDataDescriptor(xd, CUDNN_DATA_FLOAT, CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, T, B, IN, lens, &fill));
    CHECK(cudnnSetRNNDataDescriptor(yd, CUDNN_DATA_FLOAT, CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, T, B, DIRS * HID, lens, &fill));
    int sdims[3] = {LAYERS * DIRS, B, HID}, sstrides[3] = {B * HID, HID, 1};
    cudnnTensorDescriptor_t hd, cd;
    CHECK(cudnnCreateTensorDescriptor(&hd));
    CHECK(cudnnCreateTensorDescriptor(&cd));
    CHECK(cudnnSetTensorNdDescriptor(hd, CUDNN_DATA_FLOAT, 3, sdims, sstrides));
    CHECK(cudnnSetTensorNdDescriptor(cd, CUDNN_DATA_FLOAT, 3, sdims, sstrides));

    size_t wbytes, ws_bytes, rs_bytes;
    CHECK(cudnnGetRNNWeightSpaceSize(h, rnn, &wbytes));
    CHECK(cudnnGetRNNTempSpaceSizes(h, rnn, CUDNN_FWD_MODE_TRAINING, xd, &ws_bytes, &rs_bytes));
    printf("# weight space bytes\nw_bytes 0 %zu\n", wbytes);
    size_t nw = wbytes / sizeof(float);
    float *w = buf(nw), *dw = buf(nw);
    float *zeros = (float *)calloc(nw, sizeof(float));
    upload(dw, zeros, nw);
    upload(w, zeros, nw);
    free(zeros);
    float *ws = buf(ws_bytes / sizeof(float) + 1), *reserve = buf(rs_bytes / sizeof(float) + 1);

    /* Fill each matrix and bias through the pointers cuDNN gives. */
    cudnnTensorDescriptor_t md, bd;
    CHECK(cudnnCreateTensorDescriptor(&md));
    CHECK(cudnnCreateTensorDescriptor(&bd));
    printf("# weight space layout\n");
    for (int pl = 0; pl < LAYERS * DIRS; pl++) {
        for (int lin = 0; lin < 8; lin++) {
            void *m, *bias;
            CHECK(cudnnGetRNNWeightParams(h, rnn, pl, wbytes, w, lin, md, &m, bd, &bias));
            cudnnDataType_t dt;
            int nb, dims[3], strides[3];
            CHECK(cudnnGetTensorNdDescriptor(md, 3, &dt, &nb, dims, strides));
            size_t mn = (size_t)dims[0] * dims[1] * dims[2];
            CHECK(cudnnGetTensorNdDescriptor(bd, 3, &dt, &nb, dims, strides));
            size_t bn = (size_t)dims[0] * dims[1] * dims[2];
            printf("w_offset %d %zu\n", pl * 16 + lin * 2, (size_t)((char *)m - (char *)w) / sizeof(float));
            printf("w_offset %d %zu\n", pl * 16 + lin * 2 + 1, (size_t)((char *)bias - (char *)w) / sizeof(float));
            float *vals = (float *)malloc((mn + bn) * sizeof(float));
            seed(100 + pl * 8 + lin);
            for (size_t i = 0; i < mn + bn; i++) vals[i] = uniform(-0.4f, 0.4f);
            upload((float *)m, vals, mn);
            upload((float *)bias, vals + mn, bn);
            free(vals);
        }
    }

    size_t xn = (size_t)T * B * IN, yn = (size_t)T * B * DIRS * HID, sn = (size_t)LAYERS * DIRS * B * HID;
    float *x = random_buf(xn, 1, -1, 1), *hx = random_buf(sn, 2, -0.5f, 0.5f), *cx = random_buf(sn, 3, -0.5f, 0.5f);
    float *y = buf(yn), *hy = buf(sn), *cy = buf(sn);
#ifdef GPU
    int *dev_lens = (int *)buf(B);
    upload((float *)dev_lens, (const float *)lens, B);
#else
    int *dev_lens = lens;
#endif
    CHECK(cudnnRNNForward(h, rnn, CUDNN_FWD_MODE_TRAINING, dev_lens, xd, x, yd, y, hd, hx, hy, cd, cx, cy, wbytes, w, ws_bytes, ws, rs_bytes,
                          reserve));
    printf("# forward\n");
    print_buf("y", y, yn);
    print_buf("hy", hy, sn);
    print_buf("cy", cy, sn);

    float *dy = random_buf(yn, 4, -1, 1), *dhy = random_buf(sn, 5, -1, 1), *dcy = random_buf(sn, 6, -1, 1);
    float *dx = buf(xn), *dhx = buf(sn), *dcx = buf(sn);
    CHECK(cudnnRNNBackwardData_v8(h, rnn, dev_lens, yd, y, dy, xd, dx, hd, hx, dhy, dhx, cd, cx, dcy, dcx, wbytes, w, ws_bytes, ws, rs_bytes,
                                  reserve));
    printf("# backward data\n");
    print_buf("dx", dx, xn);
    print_buf("dhx", dhx, sn);
    print_buf("dcx", dcx, sn);

    CHECK(cudnnRNNBackwardWeights_v8(h, rnn, CUDNN_WGRAD_MODE_ADD, dev_lens, xd, x, hd, hx, yd, y, wbytes, dw, ws_bytes, ws, rs_bytes,
                                     reserve));
    printf("# backward weights\n");
    for (int pl = 0; pl < LAYERS * DIRS; pl++) {
        for (int lin = 0; lin < 8; lin++) {
            void *m, *bias;
            CHECK(cudnnGetRNNWeightParams(h, rnn, pl, wbytes, dw, lin, md, &m, bd, &bias));
            cudnnDataType_t dt;
            int nb, dims[3], strides[3];
            char name[32];
            CHECK(cudnnGetTensorNdDescriptor(md, 3, &dt, &nb, dims, strides));
            snprintf(name, sizeof name, "dw_%d_%d", pl, lin);
            print_buf(name, (float *)m, (size_t)dims[0] * dims[1] * dims[2]);
            CHECK(cudnnGetTensorNdDescriptor(bd, 3, &dt, &nb, dims, strides));
            snprintf(name, sizeof name, "db_%d_%d", pl, lin);
            print_buf(name, (float *)bias, (size_t)dims[0] * dims[1] * dims[2]);
        }
    }

    buf_free(x); buf_free(hx); buf_free(cx); buf_free(y); buf_free(hy); buf_free(cy);
    buf_free(dy); buf_free(dhy); buf_free(dcy); buf_free(dx); buf_free(dhx); buf_free(dcx);
    buf_free(w); buf_free(dw); buf_free(ws); buf_free(reserve); buf_free(states);
#ifdef GPU
    buf_free((float *)dev_lens);
#endif
    cudnnDestroyTensorDescriptor(md);
    cudnnDestroyTensorDescriptor(bd);
    cudnnDestroyTensorDescriptor(hd);
    cudnnDestroyTensorDescriptor(cd);
    cudnnDestroyRNNDataDescriptor(xd);
    cudnnDestroyRNNDataDescriptor(yd);
    cudnnDestroyRNNDescriptor(rnn);
    cudnnDestroyDropoutDescriptor(drop);
    CHECK(cudnnDestroy(h));
    return 0;
}
