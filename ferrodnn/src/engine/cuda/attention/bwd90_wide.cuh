// Device helpers of the Hopper backward's kernels for 256-wide heads (attention/bwd90.rs,
// bwd90_dkdv_wide.cuh, bwd90_dq_wide.cuh). A whole row of a 256-wide accumulator is 128 floats a
// thread, so one warpgroup holds one accumulator at most: the two consumer warpgroups share each
// step's 64 x 64 block, one computing the scores' side and the other the gradient's side, and
// hand each other the block's values through shared memory.
//
// A hand-over buffer keeps 32 values a thread of a 64 x 64 block in the accumulator layout both
// warpgroups share (the same thread of the other warpgroup holds the same elements): value x of
// thread t at word x * 128 + t, so that a warp's 32 lanes touch 32 banks. Two mbarriers of 128
// arrivals order each buffer's writes and reads: FULL, which the writer's threads arrive at and
// the reader waits on, and FREE, which the reader's threads arrive at (after each read but the
// last) and the writer waits on (before each write but the first). Hand-over k completes phase
// k of each (`fa90_hand_wait`).

// Waits for the completion of phase k of mbarrier `bar`.
__device__ __forceinline__ void fa90_hand_wait(unsigned bar, i64 k) {
    mbar_wait(bar, (unsigned)(k & 1));
}

// The k width of the first product of each step (S and dP alike): the wider of the two head
// dims rounded to 16.
#define FA_WK (FA_DK > FA_DVK ? FA_DK : FA_DVK)

// Writes a thread's 32 floats (and with `keep` its dropout bits, word 32) into buffer `buf`.
__device__ __forceinline__ void fa90_hand_f32(float* buf, int tid, const float (&v)[32], unsigned keep) {
    #pragma unroll
    for (int x = 0; x < 32; ++x) buf[x * 128 + tid] = v[x];
    reinterpret_cast<unsigned*>(buf)[32 * 128 + tid] = keep;
}

// Reads what `fa90_hand_f32` wrote; returns the dropout bits.
__device__ __forceinline__ unsigned fa90_take_f32(const float* buf, int tid, float (&v)[32]) {
    #pragma unroll
    for (int x = 0; x < 32; ++x) v[x] = buf[x * 128 + tid];
    return reinterpret_cast<const unsigned*>(buf)[32 * 128 + tid];
}

// The bytes of an f32 hand-over buffer (32 values and the keep word of 128 threads).
#define FA90_HAND_BYTES (33u * 128u * 4u)

// acc0 (columns 0..127) and acc1 (128..255) += A B over one k step of 16: A from registers, B
// N-major at sb (64-channel chunks cb bytes apart; the second half from chunk 2).
__device__ __forceinline__ void fa90_wide_rs(float (&acc0)[64], float (&acc1)[64], const u32 (&a)[4], unsigned sb, unsigned cb) {
    fa90_wgmma_rs<128>(acc0, a, make_desc(sb, cb, 1024u));
    fa90_wgmma_rs<128>(acc1, a, make_desc(sb + 2u * cb, cb, 1024u));
}
