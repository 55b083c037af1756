// The atomic path of the Hopper backward (attention/bwd90.rs): its f32 dQ accumulator zeroed, 16
// bytes a thread (grid-stride), in the D launch (bwd90_d.cuh) or alone (bwd90_zero.cuh).
//
// Reads common.cuh's defines and FA_DQA_ROWS (the accumulator's rows per head).

__device__ __forceinline__ void fa90_zero_acc(void* dqa_p) {
    GRID_STRIDE(e, FA_B * FA_HQ * FA_DQA_ROWS * FA_D / 4) {
        asm volatile("st.global.v4.u32 [%0], {%1, %1, %1, %1};" :: "l"(reinterpret_cast<float*>(dqa_p) + 4 * e), "r"(0u) : "memory");
    }
}
