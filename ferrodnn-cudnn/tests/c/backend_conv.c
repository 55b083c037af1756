/* The backend descriptor API, as the cudnn frontend drives it: conv (NHWC, padding, stride 1)
 * + bias + ReLU as an operation graph of three operations with virtual intermediates, engine
 * heuristics (mode A, then the fallback list), the first engine configuration without reduced
 * precision (tensor-core or down-converting notes, so that both libraries compute in f32) that
 * finalizes into an execution plan, a variant pack, and cudnnBackendExecute. Prints y, and the
 * same graph run again through the plan's JSON where the library can serialize it. */
#include "common.h"
#include <stdbool.h>

#define BCHECK(call) CHECK(call)

static cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t t) {
    cudnnBackendDescriptor_t d;
    BCHECK(cudnnBackendCreateDescriptor(t, &d));
    return d;
}

static void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t n, const void *v) {
    BCHECK(cudnnBackendSetAttribute(d, a, t, n, v));
}

static cudnnBackendDescriptor_t tensor(int64_t uid, int nd, const int64_t *dims, const int64_t *strides, int is_virtual) {
    cudnnBackendDescriptor_t t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    cudnnDataType_t dt = CUDNN_DATA_FLOAT;
    int64_t align = 16;
    bool virt = is_virtual != 0;
    set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, nd, dims);
    set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, nd, strides);
    set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
    BCHECK(cudnnBackendFinalize(t));
    return t;
}

static cudnnBackendDescriptor_t pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    BCHECK(cudnnBackendFinalize(pw));
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    if (b) set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    BCHECK(cudnnBackendFinalize(op));
    cudnnBackendDestroyDescriptor(pw);
    return op;
}

/* Whether an engine configuration's engine reports reduced precision. */
static int reduced_precision(cudnnBackendDescriptor_t cfg) {
    cudnnBackendDescriptor_t engine = make(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    int64_t n = 0;
    BCHECK(cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &engine));
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    BCHECK(cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE, CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, notes));
    int reduced = 0;
    for (int64_t i = 0; i < n && i < CUDNN_NUMERICAL_NOTE_TYPE_COUNT; i++) {
        if (notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE || notes[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) reduced = 1;
    }
    cudnnBackendDestroyDescriptor(engine);
    return reduced;
}

/* An execution plan from the first full-precision configuration of heuristics in `mode` that
 * finalizes (any configuration when `any`), or NULL. */
static cudnnBackendDescriptor_t plan_from(cudnnHandle_t h, cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode, int any) {
    cudnnBackendDescriptor_t heur = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
    set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    BCHECK(cudnnBackendFinalize(heur));
    int64_t count = 0;
    BCHECK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL));
    cudnnBackendDescriptor_t cfgs[64];
    if (count > 64) count = 64;
    for (int64_t i = 0; i < count; i++) cfgs[i] = make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    BCHECK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &count, cfgs));
    cudnnBackendDescriptor_t plan = NULL;
    for (int64_t i = 0; i < count && !plan; i++) {
        if (!any && reduced_precision(cfgs[i])) continue;
        cudnnBackendDescriptor_t p = make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        set(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
        set(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]);
        if (cudnnBackendFinalize(p) == CUDNN_STATUS_SUCCESS) {
            plan = p;
            fprintf(stderr, "heuristics mode %d: configuration %lld of %lld\n", (int)mode, (long long)i, (long long)count);
        } else {
            cudnnBackendDestroyDescriptor(p);
        }
    }
    for (int64_t i = 0; i < count; i++) cudnnBackendDestroyDescriptor(cfgs[i]);
    cudnnBackendDestroyDescriptor(heur);
    return plan;
}

static void run(cudnnHandle_t h, cudnnBackendDescriptor_t plan, int64_t *uids, void **ptrs, int n) {
    int64_t ws_bytes = 0;
    BCHECK(cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, NULL, &ws_bytes));
    float *ws = ws_bytes ? buf((size_t)ws_bytes / sizeof(float) + 1) : NULL;
    cudnnBackendDescriptor_t pack = make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
    set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    BCHECK(cudnnBackendFinalize(pack));
    BCHECK(cudnnBackendExecute(h, plan, pack));
    cudnnBackendDestroyDescriptor(pack);
    if (ws) buf_free(ws);
}

int main(void) {
    cudnnHandle_t h = make_handle();
    const int64_t n = 2, c = 8, hh = 9, w = 7, k = 16;
    int64_t xd[4] = {n, c, hh, w}, xs[4] = {hh * w * c, 1, w * c, c};
    int64_t wd[4] = {k, c, 3, 3}, ws_[4] = {9 * c, 1, 3 * c, c};
    int64_t yd[4] = {n, k, hh, w}, ys[4] = {hh * w * k, 1, w * k, k};
    int64_t bd[4] = {1, k, 1, 1}, bs[4] = {k, 1, 1, 1};
    cudnnBackendDescriptor_t X = tensor('x', 4, xd, xs, 0), W = tensor('w', 4, wd, ws_, 0), B = tensor('b', 4, bd, bs, 0);
    cudnnBackendDescriptor_t C = tensor(1000, 4, yd, ys, 1), Z = tensor(1001, 4, yd, ys, 1), Y = tensor('y', 4, yd, ys, 0);

    cudnnBackendDescriptor_t conv = make(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    int64_t sd = 2, pad[2] = {1, 1}, one[2] = {1, 1};
    set(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    set(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
    set(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &sd);
    set(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
    set(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
    set(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, one);
    set(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, one);
    BCHECK(cudnnBackendFinalize(conv));
    cudnnBackendDescriptor_t fprop = make(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
    float alpha = 1.0f, beta = 0.0f;
    set(fprop, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &X);
    set(fprop, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &W);
    set(fprop, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &C);
    set(fprop, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv);
    set(fprop, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
    set(fprop, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
    BCHECK(cudnnBackendFinalize(fprop));
    cudnnBackendDescriptor_t add = pointwise(CUDNN_POINTWISE_ADD, C, B, Z);
    cudnnBackendDescriptor_t relu = pointwise(CUDNN_POINTWISE_RELU_FWD, Z, NULL, Y);

    cudnnBackendDescriptor_t graph = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    cudnnBackendDescriptor_t ops[3] = {fprop, add, relu};
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 3, ops);
    BCHECK(cudnnBackendFinalize(graph));
    int64_t engines = 0;
    BCHECK(cudnnBackendGetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, CUDNN_TYPE_INT64, 1, NULL, &engines));
    fprintf(stderr, "%lld engines\n", (long long)engines);

    cudnnBackendDescriptor_t plan = plan_from(h, graph, CUDNN_HEUR_MODE_A, 0);
    if (!plan) plan = plan_from(h, graph, CUDNN_HEUR_MODE_FALLBACK, 0);
    if (!plan) {
        /* Every configuration notes tensor cores: take one (capi_compare.sh sets
         * NVIDIA_TF32_OVERRIDE=0, so that NVIDIA's computes f32 in f32 anyway). */
        fprintf(stderr, "no full-precision engine configuration finalized; taking the first that does\n");
        plan = plan_from(h, graph, CUDNN_HEUR_MODE_A, 1);
    }
    if (!plan) {
        fprintf(stderr, "no engine configuration finalized\n");
        return 1;
    }
    size_t nx = (size_t)(n * c * hh * w), nw = (size_t)(k * c * 9), ny = (size_t)(n * k * hh * w);
    float *x = random_buf(nx, 1, -1, 1), *wt = random_buf(nw, 2, -1, 1), *bias = random_buf((size_t)k, 3, -1, 1), *y = random_buf(ny, 4, -1, 1);
    int64_t uids[4] = {'x', 'w', 'b', 'y'};
    void *ptrs[4] = {x, wt, bias, y};
    run(h, plan, uids, ptrs, 4);
    printf("# conv + bias + relu\n");
    print_buf("y", y, ny);

    cudnnBackendDestroyDescriptor(plan);
    cudnnBackendDestroyDescriptor(graph);
    cudnnBackendDestroyDescriptor(relu);
    cudnnBackendDestroyDescriptor(add);
    cudnnBackendDestroyDescriptor(fprop);
    cudnnBackendDestroyDescriptor(conv);
    cudnnBackendDescriptor_t ts[6] = {X, W, B, C, Z, Y};
    for (int i = 0; i < 6; i++) cudnnBackendDestroyDescriptor(ts[i]);
    buf_free(x);
    buf_free(wt);
    buf_free(bias);
    buf_free(y);
    CHECK(cudnnDestroy(h));
    return 0;
}
