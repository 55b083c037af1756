// The split tail's first launch (see sm90.rs, `Config::streamk`): the SK_FLAGS flags of the
// sm90 kernel's CTAs zeroed, since the workspace holds anything before an execute.
extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    for (int i = threadIdx.x; i < SK_FLAGS; i += blockDim.x) skflag[i] = 0u;
}
