// The sm_80 backward with a broadcast dbias (attention/bwd.rs): dbias from the f32 dS scratch
// (ds_p, the scores' dims), summed over the broadcast batch / head dims (batch outer), a thread
// per dbias element.
//
// Reads common.cuh's defines and ST_DB, DB_S0..3, DB_D0, DB_D1 (dbias's batch and head dims).

extern "C" __global__ void __launch_bounds__(256) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    const float* ds = reinterpret_cast<const float*>(ds_p);
    GRID_STRIDE(e, DB_D0 * DB_D1 * FA_SQ * FA_SKV) {
        const i64 j = e % FA_SKV, i = (e / FA_SKV) % FA_SQ, hb = (e / (FA_SKV * FA_SQ)) % DB_D1, bb = e / (FA_SKV * FA_SQ * DB_D1);
        double sum = 0.0;
        for (i64 bi = (DB_D0 == 1 ? 0 : bb); bi < (DB_D0 == 1 ? FA_B : bb + 1); ++bi)
            for (i64 h = (DB_D1 == 1 ? 0 : hb); h < (DB_D1 == 1 ? FA_HQ : hb + 1); ++h)
                sum += (double)ds[((bi * FA_HQ + h) * FA_SQ + i) * FA_SKV + j];
        ST_DB(db_p, bb * DB_S0 + hb * DB_S1 + i * DB_S2 + j * DB_S3, sum);
    }
}
