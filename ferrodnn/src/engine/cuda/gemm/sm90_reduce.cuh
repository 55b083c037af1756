// The split-k reduce of the Hopper GEMM (after sm90_common.cuh and the epilogue): for each pair
// of columns, the splits' f32 partial sums (`part`, [split][batch][M][NP]) added in split order
// (deterministic), then the epilogue and the store of C.

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    unsigned char* const cbase = (unsigned char*)c;
    const long long pairs = BATCH * M_ * (NP / 2);
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < pairs; e += (long long)gridDim.x * blockDim.x) {
        const long long col = (e % (NP / 2)) * 2;
        const long long rowg = e / (NP / 2);
        const long long row = rowg % M_;
        const int bt = (int)(rowg / M_);
        float2 acc = make_float2(0.f, 0.f);
        #pragma unroll 4
        for (int s = 0; s < GEMM_SPLITS; ++s) {
            const float2 v = *(const float2*)(part + (((long long)s * BATCH + bt) * M_ + row) * NP + col);
            acc.x += v.x;
            acc.y += v.y;
        }
        unsigned char* rp = cbase + (long long)bt * C_BS + row * C_RS;
        C_STORE_EPI(acc.x, acc.y)
    }
}
