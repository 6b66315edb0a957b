// The generic compilation of the context loops, and the run-time choice.
#define DCR_SCAN_NS scan_generic
#include "codec/context_scan_impl.inc"

namespace dcr {
namespace scan_fast {
extern const ContextScanOps kOps;
}  // namespace scan_fast

const ContextScanOps& ContextScan() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool fast = __builtin_cpu_supports("popcnt") &&
                           __builtin_cpu_supports("bmi2") &&
                           __builtin_cpu_supports("avx2");
  if (fast) return scan_fast::kOps;
#endif
  return scan_generic::kOps;
}

}  // namespace dcr
