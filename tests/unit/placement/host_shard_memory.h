// A ShardMemory (dcr/shard_memory.h) in host memory, for the tests of a
// producer whose shards live elsewhere: it does what the GPU's does (the
// whole shard compared, element by element; a copy kept per shard), so the
// producer's path through a ShardMemory runs without a GPU. It counts
// what it is asked and can be told to fail or to return bad changes.
#ifndef DCR_TESTS_UNIT_PLACEMENT_HOST_SHARD_MEMORY_H_
#define DCR_TESTS_UNIT_PLACEMENT_HOST_SHARD_MEMORY_H_

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/shard_memory.h"

namespace dcr::placement_testing {

class HostShardMemory final : public ShardMemory {
 public:
  // What the memory was asked, for the tests to check.
  struct Calls {
    std::map<std::string, int> find_changes;  // by shard
    int set_baselines = 0;                    // SetBaseline
    int baselines_from_host = 0;              // SetBaselineFromHost
    int fingerprints = 0;
    int reads = 0;
    int advances = 0;
  };
  // Faults to inject.
  struct Faults {
    bool swap_first_positions = false;  // positions out of order
    bool position_past_end = false;
    bool short_values = false;
    bool fail_read = false;
    bool fail_advance = false;
  };

  std::string name() const override { return "host-test"; }

  Status SetBaseline(const ShardBytes& shards) override {
    ++calls_.set_baselines;
    return Copy(shards);
  }
  Status SetBaselineFromHost(const ShardBytes& shards) override {
    ++calls_.baselines_from_host;
    return Copy(shards);
  }
  void DropBaseline() override { baseline_.clear(); }
  uint64_t baseline_bytes() const override {
    uint64_t n = 0;
    for (const auto& [name, b] : baseline_) n += b.size();
    return n;
  }
  Status ReadBaseline(std::string_view shard, uint64_t offset,
                      std::span<std::byte> out) override {
    ++calls_.reads;
    if (faults_.fail_read) return Status::IOError("injected read failure");
    auto it = baseline_.find(std::string(shard));
    if (it == baseline_.end()) return Status::NotFound(std::string(shard));
    if (offset + out.size() > it->second.size()) {
      return Status::InvalidArgument("past the shard");
    }
    std::memcpy(out.data(), it->second.data() + offset, out.size());
    return Status::OK();
  }
  Status FindChanges(std::string_view shard, size_t elem_size,
                     std::span<const std::byte> target,
                     ShardChanges* out) override {
    ++calls_.find_changes[std::string(shard)];
    auto it = baseline_.find(std::string(shard));
    if (it == baseline_.end()) return Status::NotFound(std::string(shard));
    const std::vector<std::byte>& base = it->second;
    if (base.size() != target.size()) {
      return Status::InvalidArgument("sizes differ");
    }
    // Emptied, keeping the buffers (faulted in already).
    out->positions.clear();
    out->base.clear();
    out->target.clear();
    const size_t w = elem_size;
    for (uint64_t e = 0; e < base.size() / w; ++e) {
      if (std::memcmp(&base[e * w], &target[e * w], w) == 0) continue;
      out->positions.push_back(e);
      out->base.insert(out->base.end(), base.begin() + e * w,
                       base.begin() + (e + 1) * w);
      out->target.insert(out->target.end(), target.begin() + e * w,
                         target.begin() + (e + 1) * w);
    }
    if (faults_.swap_first_positions && out->positions.size() >= 2) {
      std::swap(out->positions[0], out->positions[1]);
    }
    if (faults_.position_past_end && !out->positions.empty()) {
      out->positions.back() = base.size() / w;
    }
    if (faults_.short_values && !out->base.empty()) out->base.pop_back();
    if (after_find_) after_find_(shard);
    return Status::OK();
  }
  Result<Digest128> Fingerprint(std::span<const std::byte> shard) override {
    ++calls_.fingerprints;
    return TensorDigest(shard);
  }
  Status Advance(const ShardBytes& target) override {
    ++calls_.advances;
    if (faults_.fail_advance) return Status::IOError("injected copy failure");
    for (const auto& [n, t] : target) {
      auto it = baseline_.find(n);
      if (it == baseline_.end() || it->second.size() != t.size()) {
        return Status::InvalidArgument("not held: " + n);
      }
    }
    for (const auto& [n, t] : target) {
      std::memcpy(baseline_.at(n).data(), t.data(), t.size());
    }
    return Status::OK();
  }

  Calls& calls() { return calls_; }
  Faults& faults() { return faults_; }
  // Runs after each FindChanges, before it returns: a trainer's kernel
  // that writes a shard while the producer diffs it.
  void set_after_find(std::function<void(std::string_view shard)> f) {
    after_find_ = std::move(f);
  }

 private:
  Status Copy(const ShardBytes& shards) {
    baseline_.clear();
    for (const auto& [n, b] : shards) baseline_[n].assign(b.begin(), b.end());
    return Status::OK();
  }

  std::map<std::string, std::vector<std::byte>> baseline_;
  Calls calls_;
  Faults faults_;
  std::function<void(std::string_view)> after_find_;
};

}  // namespace dcr::placement_testing

#endif  // DCR_TESTS_UNIT_PLACEMENT_HOST_SHARD_MEMORY_H_
