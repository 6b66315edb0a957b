// The memory backend: heap memory, for tests and tools.
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "dcr/store.h"
#include "store/store_internal.h"

namespace dcr {
namespace {

// Memory stores align every tensor to a cache line.
constexpr uint64_t kMemoryAlign = 64;

// Heap memory for tests: all tensors in one zero-initialized buffer.
class MemoryStore final : public WeightStore {
 public:
  explicit MemoryStore(Manifest manifest)
      : WeightStore("memory:", "",
                    VersionRecord{manifest.digest(), {}, {}, {}}),
        manifest_(std::move(manifest)) {
    offsets_.reserve(manifest_.size());
    uint64_t total = 0;
    for (const TensorInfo& t : manifest_.tensors()) {
      offsets_.push_back(total);
      total += (t.NumBytes() + kMemoryAlign - 1) / kMemoryAlign * kMemoryAlign;
    }
    // make_unique value-initializes, so the store starts as zeros.
    buffer_ = std::make_unique<std::byte[]>(total + kMemoryAlign);
    const uintptr_t p = reinterpret_cast<uintptr_t>(buffer_.get());
    base_ = buffer_.get() + (kMemoryAlign - p % kMemoryAlign) % kMemoryAlign;
  }

  const Manifest& manifest() const override { return manifest_; }
  std::span<const std::byte> Tensor(size_t i) const override {
    return {base_ + offsets_[i], manifest_[i].NumBytes()};
  }
  std::span<std::byte> MutableTensor(size_t i) override {
    return {base_ + offsets_[i], manifest_[i].NumBytes()};
  }

 protected:
  Status SyncData(size_t) override { return Status::OK(); }

 private:
  Manifest manifest_;
  std::vector<uint64_t> offsets_;
  std::unique_ptr<std::byte[]> buffer_;
  std::byte* base_ = nullptr;
};

}  // namespace

namespace store_internal {

std::unique_ptr<WeightStore> CreateMemoryStore(const Manifest& manifest) {
  return std::make_unique<MemoryStore>(manifest);
}

}  // namespace store_internal

Result<std::unique_ptr<WeightStore>> CreateMemoryStoreFrom(
    const Checkpoint& checkpoint) {
  auto store = std::make_unique<MemoryStore>(checkpoint.manifest());
  for (size_t i = 0; i < checkpoint.manifest().size(); ++i) {
    const std::span<const std::byte> src = checkpoint.TensorData(i);
    if (!src.empty()) {
      std::memcpy(store->MutableTensor(i).data(), src.data(), src.size());
    }
  }
  return std::unique_ptr<WeightStore>(std::move(store));
}

}  // namespace dcr
