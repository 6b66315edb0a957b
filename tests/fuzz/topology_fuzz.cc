// Fuzzes the topology loader: YAML text in, a validated Topology or an
// error out, never a crash. A topology that parses must dump to YAML that
// parses back to the same topology, and must build a tree or say why not.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "dcr/topology.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return 0;  // bounded: yaml-cpp is recursive
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto topo = dcr::ParseTopology(text, "fuzz.yaml");
  if (!topo.ok()) return 0;
  auto again = dcr::ParseTopology(dcr::DumpTopology(*topo), "dump.yaml");
  if (!again.ok() || !(*again == *topo)) std::abort();
  (void)dcr::BuildTree(*topo);
  return 0;
}
