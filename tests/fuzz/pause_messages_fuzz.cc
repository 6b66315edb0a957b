// Fuzzes the pause protocol's line parser (serving/pause_messages.h): bytes
// in, a message or InvalidArgument out, never a crash. An accepted message
// encodes to one line that decodes to the same message.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "serving/pause_messages.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view line(reinterpret_cast<const char*>(data), size);
  auto msg = dcr::DecodePauseMsg(line);
  if (!msg.ok()) return 0;
  const std::string out = dcr::EncodePauseMsg(*msg);
  if (out.size() > dcr::kMaxPauseLine || out.back() != '\n' ||
      out.find('\n') != out.size() - 1) {
    std::abort();
  }
  auto again =
      dcr::DecodePauseMsg(std::string_view(out).substr(0, out.size() - 1));
  if (!again.ok() || !(*again == *msg)) std::abort();
  return 0;
}
