// Fuzzes the DCR_FAILPOINTS spec parser (common/failpoint.h): any bytes are
// armed or refused with InvalidArgument, never a crash. A refusal changes
// nothing (the rules armed before stay armed), its message starts with the
// spec it quotes, and it is one line when the spec is. Nothing is hit:
// hang and wait would block.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/failpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view spec(reinterpret_cast<const char*>(data), size);
  // A rule that must survive a refused spec.
  if (!dcr::ArmFailpoints("relay.vote=drop@1000000").ok()) std::abort();
  const dcr::Status s = dcr::ArmFailpoints(spec);
  if (s.ok()) {
    dcr::DisarmFailpoints();
    return 0;
  }
  if (!s.IsInvalidArgument()) std::abort();
  if (!dcr::failpoint_internal::armed.load()) std::abort();
  const std::string prefix = "failpoints \"" + std::string(spec) + "\": ";
  if (s.message().substr(0, prefix.size()) != prefix) std::abort();
  if (spec.find('\n') == std::string_view::npos &&
      s.message().find('\n') != std::string_view::npos) {
    std::abort();
  }
  dcr::DisarmFailpoints();
  return 0;
}
