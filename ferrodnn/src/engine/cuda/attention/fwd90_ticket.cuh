// The Hopper forward's ticket counter and split items' counts zeroed before the persistent kernel
// takes its items by ticket (attention/fwd90.rs).
//
// Reads FA_TICKET_WORDS: the words to zero at fa_ticket.

extern "C" __global__ void __launch_bounds__(256) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    for (int i = threadIdx.x; i < FA_TICKET_WORDS; i += 256) fa_ticket[i] = 0u;
}
