// Fuzzes the CUDA IPC manifest a relay reads from a serving process's
// socket (dcr/cuda.h ParseIpcManifest). Never a crash; a manifest that
// parses encodes to text that parses to the same manifest.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "dcr/cuda.h"

namespace cu = dcr::cuda;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 256 * 1024) return 0;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto m = cu::ParseIpcManifest(text);
  if (!m.ok()) return 0;
  auto again = cu::ParseIpcManifest(cu::EncodeIpcManifest(*m));
  if (!again.ok() || again->tensors.size() != m->tensors.size() ||
      again->device != m->device) {
    std::abort();
  }
  for (size_t i = 0; i < m->tensors.size(); ++i) {
    const auto& a = m->tensors[i];
    const auto& b = again->tensors[i];
    if (a.name != b.name || a.dtype != b.dtype || a.shape != b.shape ||
        a.handle != b.handle || a.offset != b.offset || a.bytes != b.bytes) {
      std::abort();
    }
  }
  return 0;
}
