// The context loops compiled with POPCNT, BMI2 and AVX2 (pdep selects the j-th
// set bit in one instruction); used only where the CPU has both.
#define DCR_SCAN_NS scan_fast
#include "codec/context_scan_impl.inc"
