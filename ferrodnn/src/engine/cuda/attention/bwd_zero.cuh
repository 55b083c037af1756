// The sm_80 backward with dbias (attention/bwd.rs): the dS target zeroed before the dQ kernel
// writes the visible elements: dbias itself (FA_DBIAS 1, through ST_DB at DB_S0..3) or the f32
// scratch of the scores' dims (FA_DBIAS 2).
//
// Reads common.cuh's defines and FA_DBIAS (with ST_DB, DB_S0..3).

extern "C" __global__ void __launch_bounds__(256) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    GRID_STRIDE(e, FA_B * FA_HQ * FA_SQ * FA_SKV) {
#if FA_DBIAS == 1
        const i64 j = e % FA_SKV, i = (e / FA_SKV) % FA_SQ, h = (e / (FA_SKV * FA_SQ)) % FA_HQ, bi = e / (FA_SKV * FA_SQ * FA_HQ);
        ST_DB(db_p, bi * DB_S0 + h * DB_S1 + i * DB_S2 + j * DB_S3, 0.0);
#else
        reinterpret_cast<float*>(db_p)[e] = 0.0f;
#endif
    }
}
