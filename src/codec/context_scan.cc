// The generic compilation of the context loops, and the run-time choice.
#define DCR_SCAN_NS scan_generic
#include "codec/context_scan_impl.inc"

namespace dcr {
namespace scan_fast {
extern const ContextScanOps kOps;
}  // namespace scan_fast
namespace scan_avx512 {
extern const ContextScanOps kOps;
}  // namespace scan_avx512
namespace scan_vbmi2 {
extern const ContextScanOps kOps;
}  // namespace scan_vbmi2

namespace {

struct CpuHas {
  bool avx2 = false;
  bool avx512 = false;
  bool vbmi2 = false;
  CpuHas() {
#if defined(__x86_64__) && defined(__GNUC__)
    avx2 = __builtin_cpu_supports("popcnt") && __builtin_cpu_supports("bmi2") &&
           __builtin_cpu_supports("avx2");
    avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw");
    vbmi2 = avx512 && __builtin_cpu_supports("avx512vl") &&
            __builtin_cpu_supports("avx512vbmi") &&
            __builtin_cpu_supports("avx512vbmi2");
#endif
  }
};

const CpuHas& Cpu() {
  static const CpuHas has;
  return has;
}

}  // namespace

const ContextScanOps& ContextScan() {
  if (Cpu().vbmi2) return scan_vbmi2::kOps;
  if (Cpu().avx512) return scan_avx512::kOps;
  if (Cpu().avx2) return scan_fast::kOps;
  return scan_generic::kOps;
}

std::vector<std::pair<std::string, const ContextScanOps*>> ContextScans() {
  std::vector<std::pair<std::string, const ContextScanOps*>> all = {
      {"generic", &scan_generic::kOps}};
  if (Cpu().avx2) all.emplace_back("avx2", &scan_fast::kOps);
  if (Cpu().avx512) all.emplace_back("avx512", &scan_avx512::kOps);
  if (Cpu().vbmi2) all.emplace_back("avx512vbmi2", &scan_vbmi2::kOps);
  return all;
}

}  // namespace dcr
