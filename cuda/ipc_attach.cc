// dcr/cuda.h CheckIpcManifest: a serving process's exported GPU buffers
// against what its rank holds. No CUDA here (builds without it check
// manifests too).
#include <map>
#include <string>
#include <vector>

#include "dcr/cuda.h"
#include "dcr/receiver_map.h"

namespace dcr::cuda {

Status CheckIpcManifest(const IpcManifest& manifest,
                        std::span<const TensorInfo> want,
                        std::string_view whose, std::string_view source) {
  std::map<std::string, const IpcTensor*, std::less<>> exported;
  for (const IpcTensor& t : manifest.tensors) exported.emplace(t.name, &t);
  std::vector<std::string> problems;
  for (const TensorInfo& w : want) {
    auto it = exported.find(w.name);
    if (it == exported.end()) {
      problems.push_back("'" + w.name + "' is not exported");
      continue;
    }
    const IpcTensor& got = *it->second;
    if (got.dtype != w.dtype || got.shape != w.shape) {
      problems.push_back("'" + w.name + "' is " + ShapeText(got.shape) + " " +
                         std::string(DTypeName(got.dtype)) + ", " +
                         std::string(source) + " gives " + ShapeText(w.shape) +
                         " " + std::string(DTypeName(w.dtype)));
    }
  }
  if (problems.empty()) return Status::OK();
  std::string msg = "the GPU buffers " + std::string(whose) +
                    " exported do not match " + std::string(source) + ": ";
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
      "codes and scales included, as " +
      std::string(source) + " declares them)");
}

Status CheckIpcManifest(const IpcManifest& manifest, const ReceiverMap& map) {
  std::vector<TensorInfo> want;
  for (const auto& [name, shard] : map.DeviceShards()) {
    want.push_back({name, shard.dtype, shard.shape});
  }
  return CheckIpcManifest(manifest, want,
                          "serving rank " + std::to_string(map.rank()),
                          "the layout");
}

}  // namespace dcr::cuda
