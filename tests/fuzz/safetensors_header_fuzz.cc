// Fuzzes the safetensors header parser: any bytes either parse into a
// header whose ranges lie inside the file, or fail with a Status.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "format/safetensors_header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data),
                                   size);
  auto h = dcr::ParseSafetensorsHeader(bytes, size, "fuzz.safetensors");
  if (h.ok()) {
    for (const auto& t : h->tensors) {
      if (t.end < t.begin || h->data_offset + t.end > size ||
          t.end - t.begin != t.info.NumBytes()) {
        std::abort();  // a range the parser should have refused
      }
    }
  }
  return 0;
}
