// The context loops compiled with AVX-512 VBMI2 as well (Ice Lake, Zen 4
// and later): the decoder's scan compresses a block's changes and their
// value groups to the front of a register instead of a loop per change.
// Used only where the CPU has it.
#define DCR_SCAN_NS scan_vbmi2
#include "codec/context_scan_impl.inc"
