// The atomic path's last pass (attention/bwd90.rs): dQ from the f32 accumulator (times the
// attention scale, which dS leaves out), four channels (16 bytes of the accumulator) a thread.
//
// Reads common.cuh's defines and FA_NQT (the accumulator's tiled layout: 64 x 64 tiles),
// DQ_S0..3, DQ_PAIR, ST_DQ (dq's strides and store); the scale is the parameter fa_scale.

FA_DEFINE_STORE(dq, DQ_PAIR, ST_DQ, DQ_S3)

extern "C" __global__ void __launch_bounds__(256) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    GRID_STRIDE(e, FA_B * FA_HQ * FA_SQ * (FA_DR / 4)) {
        const i64 c = (e % (FA_DR / 4)) * 4, r = e / (FA_DR / 4);
        const i64 i = r % FA_SQ, h = (r / FA_SQ) % FA_HQ, bi = r / (FA_SQ * FA_HQ);
        // Tiles of 64 rows x 64 channels, 16 KiB each, pairs swizzled by row (see the dK/dV
        // kernel); the swizzle flips pair bits 2 and up, so a 4-aligned channel group stays
        // together and in order.
        const i64 t = ((bi * FA_HQ + h) * FA_NQT + i / 64) * (FA_D / 64) + c / 64, rr = i % 64, pp = ((c % 64) / 2) ^ (4 * (rr % 8));
        const float* a = reinterpret_cast<const float*>(dqa_p) + t * 4096 + rr * 64 + pp * 2;
        const float4 v = __ldcs(reinterpret_cast<const float4*>(a));
        const i64 at = bi * DQ_S0 + h * DQ_S1 + i * DQ_S2 + c * DQ_S3;
        fa_store_dq(dq_p, at, v.x * fa_scale, v.y * fa_scale);
        fa_store_dq(dq_p, at + 2 * DQ_S3, v.z * fa_scale, v.w * fa_scale);
    }
}
