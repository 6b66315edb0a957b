// The context loops compiled with AVX-512BW as well (one unsigned compare
// per 512 bits per range bound); used only where the CPU has it.
#define DCR_SCAN_NS scan_avx512
#include "codec/context_scan_impl.inc"
