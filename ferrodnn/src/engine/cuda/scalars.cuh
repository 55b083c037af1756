// Writes the by-value scalars a plan takes from the variant pack when it executes into the words
// where its kernels read them through a pointer (engine.rs): one 8-byte word per scalar, holding
// the value encoded in the tensor's own type, zero-extended. The instantiation defines
// SCALAR_COUNT and SCALAR_WORDS (the parameters w0, w1, ... in order); `dst` points at the first
// word, the others follow it.
extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    // After the kernels before it in the stream (an earlier execute may still read these words).
    pdl_site();
    const unsigned long long words[SCALAR_COUNT] = {SCALAR_WORDS};
    if (threadIdx.x < SCALAR_COUNT) {
        dst[threadIdx.x] = words[threadIdx.x];
    }
}
