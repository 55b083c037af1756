// The atomic path's f32 dQ accumulator zeroed alone, where D has the general launch
// (attention/bwd90.rs).
//
// Reads bwd90_acc.cuh's defines.

extern "C" __global__ void __launch_bounds__(256) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    fa90_zero_acc(dqa_p);
}
