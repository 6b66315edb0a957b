#include "relay/device_weights.h"

#include <fmt/format.h>

#include <chrono>

#include "dcr/placement.h"

namespace dcr {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t)
      .count();
}

// Where each device tensor lies in `host`: found by name, with its dtype
// and shape.
Result<std::vector<size_t>> Locate(const DeviceWeights& device,
                                   const WeightStore& host) {
  const std::vector<TensorInfo>& tensors = device.tensors();
  const Manifest& m = host.manifest();
  std::vector<size_t> at(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t j = m.Find(tensors[i].name);
    if (j < 0) {
      return Status::InvalidArgument(
          fmt::format("the GPU tensor '{}' is not in {}", tensors[i].name,
                      host.describe()));
    }
    const TensorInfo& h = m[static_cast<size_t>(j)];
    if (h.dtype != tensors[i].dtype || h.shape != tensors[i].shape) {
      return Status::InvalidArgument(fmt::format(
          "the GPU tensor '{}' is {} {}, {} holds it as {} {}", tensors[i].name,
          ShapeText(tensors[i].shape), DTypeName(tensors[i].dtype),
          host.describe(), ShapeText(h.shape), DTypeName(h.dtype)));
    }
    at[i] = static_cast<size_t>(j);
  }
  return at;
}

std::vector<Digest128> HashAt(const WeightStore& host,
                              const std::vector<size_t>& at, ThreadPool* pool) {
  std::vector<Digest128> out(at.size());
  auto hash = [&](size_t i, size_t) {
    out[i] = TensorDigest(host.Tensor(at[i]));
  };
  if (pool != nullptr) {
    pool->ParallelFor(at.size(), hash);
  } else {
    for (size_t i = 0; i < at.size(); ++i) hash(i, 0);
  }
  return out;
}

}  // namespace

Result<std::vector<Digest128>> HostDigests(const DeviceWeights& device,
                                           const WeightStore& host,
                                           ThreadPool* pool) {
  DCR_ASSIGN_OR_RETURN(std::vector<size_t> at, Locate(device, host));
  return HashAt(host, at, pool);
}

Result<DeviceSync> SyncDeviceWeights(
    DeviceWeights& device, const WeightStore& host, ThreadPool* pool,
    const std::vector<Digest128>* host_digests) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<TensorInfo>& tensors = device.tensors();
  DCR_ASSIGN_OR_RETURN(std::vector<size_t> at, Locate(device, host));
  if (host_digests != nullptr && host_digests->size() != tensors.size()) {
    return Status::Internal(fmt::format("{} host digests for {} GPU tensors",
                                        host_digests->size(), tensors.size()));
  }
  const std::vector<Digest128> want =
      host_digests != nullptr ? *host_digests : HashAt(host, at, pool);
  DeviceSync out;
  out.tensors = tensors.size();
  std::vector<size_t> differ;
  for (size_t i = 0; i < tensors.size(); ++i) {
    DCR_ASSIGN_OR_RETURN(Digest128 got, device.Digest(i));
    if (got != want[i]) differ.push_back(i);
  }
  out.hash_seconds = SecondsSince(start);
  for (size_t i : differ) {
    DCR_RETURN_IF_ERROR(device.Write(i, host.Tensor(at[i])));
    out.rewritten += 1;
    out.rewritten_bytes += tensors[i].NumBytes();
  }
  DCR_RETURN_IF_ERROR(device.Flush());
  for (size_t i : differ) {
    DCR_ASSIGN_OR_RETURN(Digest128 got, device.Digest(i));
    if (got != want[i]) {
      return Status::Corruption(fmt::format(
          "the GPU tensor '{}' does not hold what was written to it "
          "(digest {}, written {})",
          tensors[i].name, got.ShortHex(), want[i].ShortHex()));
    }
  }
  out.seconds = SecondsSince(start);
  return out;
}

}  // namespace dcr
