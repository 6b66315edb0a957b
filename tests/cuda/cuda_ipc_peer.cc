// The relay's side of tests/cuda's IPC test, as its own process: fetches
// the serving process's IPC manifest from SOCKET, maps its buffers, applies
// the chunks in DIR/<tensor>.chunks (concatenated, spans of SPAN elements)
// into them through ChunkApplier, and prints "<name> <tensor digest>" per
// tensor, computed on the device.
//
//   cuda_ipc_peer SOCKET DIR SPAN
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "dcr/codec.h"
#include "dcr/cuda.h"

namespace cu = dcr::cuda;

int Fail(const std::string& what, const dcr::Status& st) {
  std::fprintf(stderr, "cuda_ipc_peer: %s: %s\n", what.c_str(),
               st.ToString().c_str());
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: cuda_ipc_peer SOCKET DIR SPAN\n");
    return 2;
  }
  const uint64_t span = std::stoull(argv[3]);
  auto manifest = cu::FetchIpcManifest(argv[1]);
  if (!manifest.ok()) return Fail("fetch", manifest.status());
  auto import = cu::IpcImport::Open(manifest.value());
  if (!import.ok()) return Fail("import", import.status());
  auto applier = cu::ChunkApplier::Create({8 << 20, 4});
  if (!applier.ok()) return Fail("applier", applier.status());
  auto digester = cu::Digester::Create();
  if (!digester.ok()) return Fail("digester", digester.status());
  const auto& tensors = manifest.value().tensors;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const cu::IpcTensor& t = tensors[i];
    std::ifstream in(std::string(argv[2]) + "/" + t.name + ".chunks",
                     std::ios::binary);
    std::vector<char> raw((std::istreambuf_iterator<char>(in)), {});
    auto bytes = std::as_bytes(std::span(raw));
    const size_t w = dcr::DTypeSize(t.dtype);
    auto* base = static_cast<std::byte*>(import.value()->Tensor(i));
    while (!bytes.empty()) {
      auto h = dcr::PeekChunkHeader(bytes);
      if (!h.ok()) return Fail(t.name, h.status());
      auto chunk = bytes.first(h->total_bytes);
      dcr::Status st = applier.value()->Apply(
          chunk, base + uint64_t{h->id.span} * span * w, h->span_elems);
      if (!st.ok()) return Fail(t.name, st);
      bytes = bytes.subspan(h->total_bytes);
    }
  }
  dcr::Status st = applier.value()->Flush();
  if (!st.ok()) return Fail("flush", st);
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto d = digester.value()->TensorDigest(import.value()->Tensor(i),
                                            tensors[i].bytes);
    if (!d.ok()) return Fail("digest", d.status());
    std::printf("%s %s\n", tensors[i].name.c_str(), d->ToHex().c_str());
  }
  return 0;
}
