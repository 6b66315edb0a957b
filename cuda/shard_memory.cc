// dcr/cuda.h CreateShardMemory: a producer's baseline shards on a GPU,
// diffed there (dcr/shard_memory.h). Written on the public API of the
// kernels (Differ, Digester, the copies), so it builds with or without
// CUDA: without, Create says how to build with it.
#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dcr/cuda.h"

namespace dcr::cuda {
namespace {

// Makes `device` current for the scope and then makes current again the
// device that was (the caller's thread is the trainer's: its torch
// current device must not move); nothing where it is current already.
// ok() is false where `device` could not be made current. Restoring a
// device the thread never used creates a context there; the Python module
// calls inside torch's own guard (torch.cuda.device), which records such a
// device instead, so that this one finds the device current.
class OnDevice {
 public:
  explicit OnDevice(int device) {
    auto was = CurrentDevice();
    if (was.ok() && *was == device) return;
    if (was.ok()) previous_ = *was;
    status_ = UseDevice(device);
  }
  ~OnDevice() {
    if (previous_ >= 0) (void)UseDevice(previous_);
  }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;
  const Status& status() const { return status_; }

 private:
  int previous_ = -1;
  Status status_;
};

class DeviceShardMemory final : public ShardMemory {
 public:
  DeviceShardMemory(const ShardMemoryOptions& options,
                    std::unique_ptr<Differ> differ,
                    std::unique_ptr<Digester> digester, DeviceBuffer positions,
                    DeviceBuffer values)
      : options_(options),
        differ_(std::move(differ)),
        digester_(std::move(digester)),
        positions_(std::move(positions)),
        values_(std::move(values)) {}

  ~DeviceShardMemory() override {
    // The buffers are freed with the device that holds them current.
    OnDevice on(options_.device);
    baseline_.clear();
    differ_.reset();
    digester_.reset();
    positions_ = DeviceBuffer();
    values_ = DeviceBuffer();
  }

  std::string name() const override {
    return "cuda:" + std::to_string(options_.device);
  }

  Status SetBaseline(const ShardBytes& shards) override {
    OnDevice on(options_.device);
    DCR_RETURN_IF_ERROR(on.status());
    for (const auto& [name, span] : shards) {
      DCR_RETURN_IF_ERROR(CheckHeld("shard '" + name + "'", span));
    }
    baseline_.clear();  // the old copy's memory first
    for (const auto& [name, span] : shards) {
      DCR_ASSIGN_OR_RETURN(Shard * s, Hold(name, span.size()));
      DCR_RETURN_IF_ERROR(
          CopyOnDevice(s->buffer.data(), span.data(), span.size()));
    }
    return Synchronize(nullptr);
  }

  Status SetBaselineFromHost(const ShardBytes& shards) override {
    OnDevice on(options_.device);
    DCR_RETURN_IF_ERROR(on.status());
    baseline_.clear();
    for (const auto& [name, span] : shards) {
      DCR_ASSIGN_OR_RETURN(Shard * s, Hold(name, span.size()));
      DCR_RETURN_IF_ERROR(CopyToDevice(s->buffer.data(), span));
    }
    return Status::OK();
  }

  void DropBaseline() override {
    OnDevice on(options_.device);
    baseline_.clear();
  }

  uint64_t baseline_bytes() const override {
    uint64_t n = 0;
    for (const auto& [name, s] : baseline_) n += s.bytes;
    return n;
  }

  Status ReadBaseline(std::string_view shard, uint64_t offset,
                      std::span<std::byte> out) override {
    DCR_ASSIGN_OR_RETURN(const Shard* s, Find(shard));
    if (offset > s->bytes || out.size() > s->bytes - offset) {
      return Status::InvalidArgument(
          name() + ": shard '" + std::string(shard) + "' holds " +
          std::to_string(s->bytes) + " bytes; cannot read " +
          std::to_string(out.size()) + " at " + std::to_string(offset));
    }
    OnDevice on(options_.device);
    DCR_RETURN_IF_ERROR(on.status());
    return CopyToHost(out,
                      static_cast<const std::byte*>(s->buffer.data()) + offset);
  }

  Status FindChanges(std::string_view shard, size_t elem_size,
                     std::span<const std::byte> target,
                     ShardChanges* out) override {
    DCR_ASSIGN_OR_RETURN(const Shard* s, Find(shard));
    const size_t w = elem_size;
    if (w != 1 && w != 2 && w != 4 && w != 8) {
      return Status::InvalidArgument(name() + ": elements of " +
                                     std::to_string(w) + " bytes");
    }
    if (target.size() != s->bytes || s->bytes % w != 0) {
      return Status::InvalidArgument(name() + ": shard '" + std::string(shard) +
                                     "' has " + std::to_string(target.size()) +
                                     " bytes, its baseline " +
                                     std::to_string(s->bytes));
    }
    DCR_RETURN_IF_ERROR(
        CheckHeld("shard '" + std::string(shard) + "'", target));
    OnDevice on(options_.device);
    DCR_RETURN_IF_ERROR(on.status());
    // Emptied, keeping the buffers (faulted in already).
    out->positions.clear();
    out->base.clear();
    out->target.clear();
    const auto* base = static_cast<const std::byte*>(s->buffer.data());
    const uint64_t n = s->bytes / w;
    auto* d_pos = static_cast<uint32_t*>(positions_.data());
    // Piece by piece (positions are 32-bit and the scratch is bounded):
    // the positions and the target's bits, then, diffing the other way,
    // the baseline's bits at the same positions.
    for (uint64_t first = 0; first < n; first += options_.piece_elems) {
      const uint64_t m = std::min(options_.piece_elems, n - first);
      const std::byte* b = base + first * w;
      const std::byte* t = target.data() + first * w;
      DCR_ASSIGN_OR_RETURN(
          uint64_t k, differ_->FindChanges(w, b, t, m, /*xor_values=*/false,
                                           d_pos, values_.data()));
      if (k == 0) continue;
      const size_t at = out->positions.size();
      host_positions_.resize(k);
      DCR_RETURN_IF_ERROR(CopyToHost(
          std::as_writable_bytes(std::span(host_positions_)), d_pos));
      out->positions.resize(at + k);
      for (uint64_t i = 0; i < k; ++i) {
        out->positions[at + i] = first + host_positions_[i];
      }
      out->target.resize((at + k) * w);
      DCR_RETURN_IF_ERROR(CopyToHost(
          std::span(out->target).subspan(at * w, k * w), values_.data()));
      DCR_ASSIGN_OR_RETURN(
          uint64_t again, differ_->FindChanges(w, t, b, m, /*xor_values=*/false,
                                               d_pos, values_.data()));
      if (again != k) {
        return Status::Internal(name() + ": shard '" + std::string(shard) +
                                "' changed while it was diffed (" +
                                std::to_string(k) + " then " +
                                std::to_string(again) + " elements)");
      }
      out->base.resize((at + k) * w);
      DCR_RETURN_IF_ERROR(CopyToHost(
          std::span(out->base).subspan(at * w, k * w), values_.data()));
    }
    return Status::OK();
  }

  Result<Digest128> Fingerprint(std::span<const std::byte> shard) override {
    if (shard.empty()) return TensorDigest(shard);
    DCR_RETURN_IF_ERROR(CheckHeld("a shard", shard));
    OnDevice on(options_.device);
    DCR_RETURN_IF_ERROR(on.status());
    return digester_->TensorDigest(shard.data(), shard.size());
  }

  Status Advance(const ShardBytes& target) override {
    for (const auto& [name, span] : target) {
      DCR_ASSIGN_OR_RETURN(const Shard* s, Find(name));
      if (span.size() != s->bytes) {
        return Status::InvalidArgument(this->name() + ": shard '" + name +
                                       "' has " + std::to_string(span.size()) +
                                       " bytes, its baseline " +
                                       std::to_string(s->bytes));
      }
      DCR_RETURN_IF_ERROR(CheckHeld("shard '" + name + "'", span));
    }
    OnDevice on(options_.device);
    DCR_RETURN_IF_ERROR(on.status());
    for (const auto& [name, span] : target) {
      DCR_RETURN_IF_ERROR(CopyOnDevice(baseline_.at(name).buffer.data(),
                                       span.data(), span.size()));
    }
    return Synchronize(nullptr);
  }

 private:
  // Whether `span` lies in this device's memory: host memory, or another
  // device's, would fault in a kernel, an error that stays with the
  // context the trainer shares.
  Status CheckHeld(const std::string& what,
                   std::span<const std::byte> span) const {
    if (span.empty()) return Status::OK();
    // Its first and last bytes (a span past its allocation faults too).
    DCR_ASSIGN_OR_RETURN(int device, DeviceOfPointer(span.data()));
    if (device == options_.device) {
      DCR_ASSIGN_OR_RETURN(device, DeviceOfPointer(&span.back()));
      if (device == options_.device) return Status::OK();
    }
    return Status::InvalidArgument(
        name() + ": " + what + " is in " +
        (device < 0 ? std::string("host memory")
                    : "cuda:" + std::to_string(device) + "'s memory") +
        "; a producer's shards must all be on " + name());
  }

  struct Shard {
    DeviceBuffer buffer;  // empty for a shard of no bytes
    uint64_t bytes = 0;
  };

  Result<Shard*> Hold(const std::string& name, uint64_t bytes) {
    Shard s;
    s.bytes = bytes;
    if (bytes > 0) {
      auto b = DeviceBuffer::Allocate(bytes);
      if (!b.ok()) {
        return b.status().WithContext(
            this->name() + ": the baseline copy of shard '" + name + "'");
      }
      s.buffer = std::move(*b);
    }
    return &(baseline_[name] = std::move(s));
  }

  Result<const Shard*> Find(std::string_view shard) const {
    auto it = baseline_.find(shard);
    if (it == baseline_.end()) {
      return Status::NotFound(name() + ": no baseline of shard '" +
                              std::string(shard) + "'");
    }
    return &it->second;
  }

  const ShardMemoryOptions options_;
  std::unique_ptr<Differ> differ_;
  std::unique_ptr<Digester> digester_;
  DeviceBuffer positions_;  // piece_elems 32-bit positions
  DeviceBuffer values_;     // piece_elems values of up to 8 bytes
  std::vector<uint32_t> host_positions_;
  std::map<std::string, Shard, std::less<>> baseline_;
};

}  // namespace

Result<std::unique_ptr<ShardMemory>> CreateShardMemory(
    const ShardMemoryOptions& options) {
  const std::string where = "cuda:" + std::to_string(options.device);
  if (options.device < 0) {
    return Status::InvalidArgument(where + " is not a device");
  }
  if (options.piece_elems == 0 || options.piece_elems > kMaxDiffElems) {
    return Status::InvalidArgument(
        "a producer's GPU diff takes pieces of 1 to 2^32 - 1 elements, not " +
        std::to_string(options.piece_elems));
  }
  auto refuse = [&](const Status& s) {
    return s.WithContext("cannot keep a producer's shards on " + where);
  };
  OnDevice on(options.device);
  if (!on.status().ok()) return refuse(on.status());
  auto differ = Differ::Create(options.piece_elems);
  if (!differ.ok()) return refuse(differ.status());
  auto digester = Digester::Create();
  if (!digester.ok()) return refuse(digester.status());
  auto positions = DeviceBuffer::Allocate(options.piece_elems * 4);
  if (!positions.ok()) return refuse(positions.status());
  auto values = DeviceBuffer::Allocate(options.piece_elems * 8);
  if (!values.ok()) return refuse(values.status());
  return std::unique_ptr<ShardMemory>(
      new DeviceShardMemory(options, std::move(*differ), std::move(*digester),
                            std::move(*positions), std::move(*values)));
}

}  // namespace dcr::cuda
