#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "common/printable.h"
#include "dcr/checkpoint.h"
#include "format/safetensors_header.h"

namespace dcr {
namespace {

// The manifest digest is XXH3-128 (seed 0) over this serialization, all
// integers little-endian:
//
//   for each tensor in canonical (bytewise name) order:
//     u64  name length in bytes
//     ...  name bytes (no terminator)
//     u8   dtype enum value (include/dcr/dtype.h)
//     u64  rank (0 for a scalar)
//     u64  each dimension, outermost first
//
// An empty manifest hashes the empty string.
Digest128 ComputeManifestDigest(const std::vector<TensorInfo>& tensors) {
  Hasher128 h;
  for (const TensorInfo& t : tensors) {
    h.UpdateU64(t.name.size());
    h.Update(std::string_view(t.name));
    const std::byte dtype{static_cast<uint8_t>(t.dtype)};
    h.Update(std::span<const std::byte>(&dtype, 1));
    h.UpdateU64(t.shape.size());
    for (uint64_t d : t.shape) h.UpdateU64(d);
  }
  return h.Finish();
}

std::string ShapeString(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  s += "]";
  return s;
}

}  // namespace

bool CheckedNumBytes(DType dtype, std::span<const uint64_t> shape,
                     uint64_t* elements, uint64_t* bytes) {
  uint64_t n = 1;
  for (uint64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) return false;
  }
  uint64_t b;
  if (__builtin_mul_overflow(n, static_cast<uint64_t>(DTypeSize(dtype)), &b)) {
    return false;
  }
  if (elements != nullptr) *elements = n;
  if (bytes != nullptr) *bytes = b;
  return true;
}

uint64_t TensorInfo::NumElements() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

Result<Manifest> Manifest::Create(std::vector<TensorInfo> tensors) {
  std::sort(
      tensors.begin(), tensors.end(),
      [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  uint64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo& t = tensors[i];
    // Names are shown escaped (common/printable.h) in every message.
    auto name = [&t] { return Printable(t.name); };
    if (std::optional<size_t> at = FindControlByte(t.name)) {
      return Status::InvalidArgument(
          "tensor '" + name() + "': the name holds a control character (" +
          Printable(std::string_view(t.name).substr(*at, 1)) + " at byte " +
          std::to_string(*at) + "); tensor names must be printable");
    }
    if (i > 0 && tensors[i - 1].name == t.name) {
      return Status::InvalidArgument("duplicate tensor name '" + name() +
                                     "' in manifest");
    }
    if (!IsValidDType(static_cast<uint8_t>(t.dtype))) {
      return Status::InvalidArgument("tensor '" + name() +
                                     "' has invalid dtype value " +
                                     std::to_string(static_cast<int>(t.dtype)));
    }
    if (t.shape.size() > kMaxTensorRank) {
      return Status::InvalidArgument(
          "tensor '" + name() + "' has rank " + std::to_string(t.shape.size()) +
          ", more than the limit " + std::to_string(kMaxTensorRank));
    }
    uint64_t bytes;
    if (!CheckedNumBytes(t.dtype, t.shape, nullptr, &bytes) ||
        __builtin_add_overflow(total, bytes, &total)) {
      return Status::InvalidArgument("tensor '" + name() + "' with shape " +
                                     ShapeString(t.shape) +
                                     " overflows a 64-bit byte count");
    }
  }
  Manifest m;
  m.digest_ = ComputeManifestDigest(tensors);
  m.tensors_ = std::move(tensors);
  return m;
}

int64_t Manifest::Find(std::string_view name) const {
  auto it = std::lower_bound(
      tensors_.begin(), tensors_.end(), name,
      [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  if (it == tensors_.end() || it->name != name) return -1;
  return it - tensors_.begin();
}

uint64_t Manifest::TotalBytes() const {
  uint64_t total = 0;
  for (const TensorInfo& t : tensors_) total += t.NumBytes();
  return total;
}

uint64_t Manifest::TotalElements() const {
  uint64_t total = 0;
  for (const TensorInfo& t : tensors_) total += t.NumElements();
  return total;
}

std::string Manifest::Difference(const Manifest& a, const Manifest& b) {
  size_t i = 0;
  size_t j = 0;
  while (i < a.size() || j < b.size()) {
    if (j == b.size() || (i < a.size() && a[i].name < b[j].name)) {
      return "tensor '" + a[i].name + "' is in A but not in B";
    }
    if (i == a.size() || b[j].name < a[i].name) {
      return "tensor '" + b[j].name + "' is in B but not in A";
    }
    const TensorInfo& x = a[i];
    const TensorInfo& y = b[j];
    if (x.dtype != y.dtype) {
      return "tensor '" + x.name + "' has dtype " +
             std::string(DTypeName(x.dtype)) + " in A but " +
             std::string(DTypeName(y.dtype)) + " in B";
    }
    if (x.shape != y.shape) {
      return "tensor '" + x.name + "' has shape " + ShapeString(x.shape) +
             " in A but " + ShapeString(y.shape) + " in B";
    }
    ++i;
    ++j;
  }
  return std::string();
}

Digest128 VersionDigest(const Digest128& manifest_digest,
                        std::span<const Digest128> tensor_digests) {
  Hasher128 h;
  h.Update(manifest_digest);
  for (const Digest128& d : tensor_digests) h.Update(d);
  return h.Finish();
}

}  // namespace dcr
