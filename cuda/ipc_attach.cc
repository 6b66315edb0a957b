// dcr/cuda.h CheckIpcManifest: a serving process's exported GPU buffers
// against what its rank holds. No CUDA here (builds without it check
// manifests too).
#include <map>
#include <string>
#include <vector>

#include "dcr/cuda.h"
#include "dcr/receiver_map.h"

namespace dcr::cuda {

Status CheckIpcManifest(const IpcManifest& manifest, const ReceiverMap& map) {
  std::map<std::string, const IpcTensor*> exported;
  for (const IpcTensor& t : manifest.tensors) exported.emplace(t.name, &t);
  std::vector<std::string> problems;
  for (const auto& [name, want] : map.DeviceShards()) {
    auto it = exported.find(name);
    if (it == exported.end()) {
      problems.push_back("'" + name + "' is not exported");
      continue;
    }
    const IpcTensor& got = *it->second;
    if (got.dtype != want.dtype || got.shape != want.shape) {
      problems.push_back("'" + name + "' is " + ShapeText(got.shape) + " " +
                         std::string(DTypeName(got.dtype)) +
                         ", the layout gives " + ShapeText(want.shape) + " " +
                         std::string(DTypeName(want.dtype)));
    }
  }
  if (problems.empty()) return Status::OK();
  std::string msg = "the GPU buffers serving rank " +
                    std::to_string(map.rank()) +
                    " exported do not match its layout: ";
  for (size_t i = 0; i < problems.size() && i < kMaxAttachErrors; ++i) {
    msg += (i ? "; " : "") + problems[i];
  }
  if (problems.size() > kMaxAttachErrors) {
    msg +=
        "; and " + std::to_string(problems.size() - kMaxAttachErrors) + " more";
  }
  return Status::InvalidArgument(
      msg +
      " (the server must export every tensor it computes with, FP8 "
      "codes and scales included, as the serving layout declares them)");
}

}  // namespace dcr::cuda
