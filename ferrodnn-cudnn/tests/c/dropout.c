/* Dropout forward and backward. The two libraries draw different random masks, so what is
 * printed is what both must agree on: that every output is either 0 or x / (1 - p), that the
 * backward pass drops exactly the elements the forward pass dropped (and scales the rest the
 * same), that the same seed gives the same mask again, and the kept share rounded to a tenth. */
#include "common.h"
#include <math.h>

int main(void) {
    cudnnHandle_t h = make_handle();
    const int n = 8, c = 16, hh = 32, w = 32;
    const size_t count = (size_t)n * c * hh * w;
    const float p = 0.3f;
    cudnnTensorDescriptor_t t = tensor4d(CUDNN_TENSOR_NCHW, n, c, hh, w);
    size_t states_bytes = 0, reserve_bytes = 0;
    CHECK(cudnnDropoutGetStatesSize(h, &states_bytes));
    CHECK(cudnnDropoutGetReserveSpaceSize(t, &reserve_bytes));
    float *states = buf(states_bytes / sizeof(float) + 1), *reserve = buf(reserve_bytes / sizeof(float) + 1);
    cudnnDropoutDescriptor_t d;
    CHECK(cudnnCreateDropoutDescriptor(&d));
    CHECK(cudnnSetDropoutDescriptor(d, h, p, states, states_bytes, 1234ULL));
    float got_p;
    void *got_states;
    unsigned long long got_seed;
    CHECK(cudnnGetDropoutDescriptor(d, h, &got_p, &got_states, &got_seed));
    printf("# descriptor\nvalue 0 %g\nvalue 1 %d\nvalue 2 %llu\n", got_p, got_states == (void *)states, got_seed);

    float *x = random_buf(count, 1, 0.5f, 1.5f), *y = buf(count), *dy = random_buf(count, 2, -1, 1), *dx = buf(count);
    CHECK(cudnnDropoutForward(h, d, t, x, t, y, reserve, reserve_bytes));
    CHECK(cudnnDropoutBackward(h, d, t, dy, t, dx, reserve, reserve_bytes));
    float *hx = malloc(count * sizeof(float)), *hy = malloc(count * sizeof(float)), *hdy = malloc(count * sizeof(float)), *hdx = malloc(count * sizeof(float));
    download(hx, x, count);
    download(hy, y, count);
    download(hdy, dy, count);
    download(hdx, dx, count);
    size_t kept = 0, consistent = 0, backward_ok = 0;
    for (size_t i = 0; i < count; i++) {
        float want = hx[i] / (1.0f - p);
        int is_kept = hy[i] != 0.0f;
        kept += is_kept;
        consistent += !is_kept || fabsf(hy[i] - want) <= 1e-5f * fabsf(want);
        float want_dx = is_kept ? hdy[i] / (1.0f - p) : 0.0f;
        backward_ok += fabsf(hdx[i] - want_dx) <= 1e-5f * (1.0f + fabsf(want_dx));
    }
    printf("# forward and backward\n");
    printf("share 0 %.1f\n", (double)kept / (double)count);
    printf("consistent 0 %zu\n", consistent);
    printf("backward 0 %zu\n", backward_ok);

    /* The same seed again: the same mask. */
    CHECK(cudnnSetDropoutDescriptor(d, h, p, states, states_bytes, 1234ULL));
    float *y2 = buf(count), *hy2 = malloc(count * sizeof(float));
    CHECK(cudnnDropoutForward(h, d, t, x, t, y2, reserve, reserve_bytes));
    download(hy2, y2, count);
    size_t same = 0;
    for (size_t i = 0; i < count; i++) same += hy2[i] == hy[i];
    printf("# reseeded\nsame 0 %zu\n", same);

    free(hx);
    free(hy);
    free(hdy);
    free(hdx);
    free(hy2);
    buf_free(x);
    buf_free(y);
    buf_free(y2);
    buf_free(dy);
    buf_free(dx);
    buf_free(states);
    buf_free(reserve);
    CHECK(cudnnDestroyDropoutDescriptor(d));
    CHECK(cudnnDestroy(h));
    return 0;
}
