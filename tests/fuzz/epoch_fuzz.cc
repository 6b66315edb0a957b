// Fuzzes the epoch file parser (protocol/epoch_file.h): bytes in, an epoch
// or Corruption out, never a crash. An accepted text must be digits then
// only newlines, and the number written back must parse to the same epoch.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "protocol/epoch_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto epoch = dcr::ParseEpoch(text);
  if (!epoch.ok()) return 0;
  size_t digits = text.find_first_not_of("0123456789");
  if (digits == 0 ||
      (digits != std::string_view::npos &&
       text.substr(digits).find_first_not_of('\n') != std::string_view::npos)) {
    std::abort();
  }
  auto again = dcr::ParseEpoch(std::to_string(*epoch) + "\n");
  if (!again.ok() || *again != *epoch) std::abort();
  return 0;
}
