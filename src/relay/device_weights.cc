#include "relay/device_weights.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>

#include "codec/diff.h"
#include "dcr/placement.h"

namespace dcr {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t)
      .count();
}

// Where each device tensor lies in `host`: found by name, with its dtype
// and shape.
Result<std::vector<size_t>> Locate(const std::vector<TensorInfo>& tensors,
                                   const WeightStore& host) {
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

// Where each device tensor lies in `base`, where it lies there alike; -1
// where it does not (that tensor is not patched).
std::vector<int64_t> LocateBase(const std::vector<TensorInfo>& tensors,
                                const WeightStore* base) {
  std::vector<int64_t> at(tensors.size(), -1);
  if (base == nullptr) return at;
  const Manifest& m = base->manifest();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t j = m.Find(tensors[i].name);
    if (j >= 0 && m[static_cast<size_t>(j)].dtype == tensors[i].dtype &&
        m[static_cast<size_t>(j)].shape == tensors[i].shape) {
      at[i] = j;
    }
  }
  return at;
}

// The elements FindChanges scans at a time: the scratch each worker holds
// (positions and byte planes, 12 bytes an element at most).
constexpr uint64_t kDiffBlockElems = uint64_t{1} << 18;
static_assert(kDiffBlockElems * 12 <= kPatchScratchPerThread);

// Adds `bytes` to `held` unless that would pass `budget`.
bool Reserve(std::atomic<uint64_t>& held, uint64_t bytes, uint64_t budget) {
  uint64_t now = held.load();
  do {
    if (now + bytes > budget) return false;
  } while (!held.compare_exchange_weak(now, now + bytes));
  return true;
}

struct Stretch {
  size_t tensor = 0;
  uint64_t first = 0;
  uint64_t elems = 0;
};

}  // namespace

Result<DeviceChanges> StageDeviceChanges(const std::vector<TensorInfo>& tensors,
                                         const WeightStore* base,
                                         const WeightStore& target,
                                         ThreadPool* pool, uint64_t budget) {
  const auto start = std::chrono::steady_clock::now();
  DCR_ASSIGN_OR_RETURN(std::vector<size_t> at, Locate(tensors, target));
  const std::vector<int64_t> base_at = LocateBase(tensors, base);
  std::vector<Stretch> stretches;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t n = tensors[i].NumElements();
    uint64_t first = 0;
    do {
      const uint64_t k = std::min(kPatchStretchElems, n - first);
      stretches.push_back({i, first, k});
      first += k;
    } while (first < n);
  }
  // Per tensor: its bits changed; it is not patched (too dense, over the
  // budget, or no base to diff).
  auto changed = std::make_unique<std::atomic<bool>[]>(tensors.size());
  auto whole = std::make_unique<std::atomic<bool>[]>(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) whole[i] = base_at[i] < 0;
  std::atomic<uint64_t> held{0};
  std::vector<LinearDigest> parts(stretches.size());
  std::vector<DevicePatch> patches(stretches.size());
  const size_t workers = pool != nullptr ? pool->size() : 1;
  std::vector<std::vector<uint32_t>> positions(workers);
  std::vector<std::vector<uint8_t>> planes(workers);

  auto diff = [&](size_t k, size_t worker) {
    const Stretch& st = stretches[k];
    const size_t i = st.tensor;
    const size_t w = DTypeSize(tensors[i].dtype);
    const std::byte* to = target.Tensor(at[i]).data() + st.first * w;
    const std::byte* from =
        base_at[i] < 0 ? nullptr
                       : base->Tensor(static_cast<size_t>(base_at[i])).data() +
                             st.first * w;
    DevicePatch& patch = patches[k];
    patch.tensor = i;
    patch.first = st.first;
    // The budget counts what the patch's vectors allocate: their capacity,
    // grown here by half at a time rather than by the library's doubling.
    uint64_t reserved = 0;
    // Frees this stretch's patch and its budget (swapped away: clear()
    // would keep the capacity).
    auto give_up = [&] {
      whole[i] = true;
      held -= reserved;
      reserved = 0;
      std::vector<uint32_t>().swap(patch.positions);
      std::vector<std::byte>().swap(patch.values);
    };
    auto grow = [](size_t capacity, size_t need) {
      return need <= capacity ? capacity : std::max(need, capacity * 3 / 2);
    };
    std::vector<uint32_t>& pos = positions[worker];
    std::vector<uint8_t>& plane = planes[worker];
    LinearDigest part;
    for (uint64_t o = 0; o < st.elems; o += kDiffBlockElems) {
      const uint64_t m = std::min(kDiffBlockElems, st.elems - o);
      part ^= LinearHash((st.first + o) * w, {to + o * w, m * w});
      if (from == nullptr) {
        changed[i] = true;  // unknown: the digests decide
        continue;
      }
      if (whole[i]) {
        // Another stretch gave up on this tensor (having found it changed):
        // hashing is all that is left.
        if (reserved != 0) give_up();
        continue;
      }
      if (pos.empty()) {
        pos.resize(kDiffBlockElems);
        plane.resize(8 * kDiffBlockElems);
      }
      uint8_t* p[8];
      for (size_t j = 0; j < w; ++j) p[j] = plane.data() + j * kDiffBlockElems;
      const size_t count =
          FindChanges(w, from + o * w, to + o * w, m, false, pos.data(), p);
      if (count == 0) continue;
      changed[i] = true;
      const size_t had = patch.positions.size();
      const bool dense =
          (had + count) * (sizeof(uint32_t) + w) * 2 > st.elems * w;
      const size_t positions_cap =
          grow(patch.positions.capacity(), had + count);
      const size_t values_cap =
          grow(patch.values.capacity(), (had + count) * w);
      const uint64_t cap_bytes = positions_cap * sizeof(uint32_t) + values_cap;
      if (dense || !Reserve(held, cap_bytes - reserved, budget)) {
        give_up();
        continue;
      }
      reserved = cap_bytes;
      patch.positions.reserve(positions_cap);
      patch.values.reserve(values_cap);
      patch.positions.resize(had + count);
      for (size_t c = 0; c < count; ++c) {
        patch.positions[had + c] = static_cast<uint32_t>(o + pos[c]);
      }
      patch.values.resize((had + count) * w);
      JoinPlanes(w, p, count, patch.values.data() + had * w);
    }
    parts[k] = part;
  };
  if (pool != nullptr) {
    pool->ParallelFor(stretches.size(), diff);
  } else {
    for (size_t k = 0; k < stretches.size(); ++k) diff(k, 0);
  }

  DeviceChanges out;
  std::vector<LinearDigest> sums(tensors.size());
  for (size_t k = 0; k < stretches.size(); ++k) {
    sums[stretches[k].tensor] ^= parts[k];
    DevicePatch& p = patches[k];
    if (whole[p.tensor] || p.positions.empty()) continue;
    out.bytes += p.positions.size() * sizeof(uint32_t) + p.values.size();
    out.patches.push_back(std::move(p));
  }
  out.target.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    out.target.push_back(FinishTensorDigest(sums[i], tensors[i].NumBytes()));
    if (!changed[i]) continue;
    out.changed += 1;
    if (!whole[i]) out.patched += 1;
  }
  out.seconds = SecondsSince(start);
  return out;
}

Result<DeviceSync> SyncDeviceWeights(DeviceWeights& device,
                                     const WeightStore& host, ThreadPool* pool,
                                     const DeviceChanges* staged) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<TensorInfo>& tensors = device.tensors();
  DCR_ASSIGN_OR_RETURN(std::vector<size_t> at, Locate(tensors, host));
  if (staged != nullptr && staged->target.size() != tensors.size()) {
    return Status::Internal(fmt::format("{} staged digests for {} GPU tensors",
                                        staged->target.size(), tensors.size()));
  }
  DeviceSync out;
  out.tensors = tensors.size();
  if (staged != nullptr && !staged->patches.empty()) {
    size_t last = tensors.size();
    for (const DevicePatch& p : staged->patches) {
      if (p.tensor >= tensors.size()) {
        return Status::Internal(fmt::format("a patch for GPU tensor {} of {}",
                                            p.tensor, tensors.size()));
      }
      DCR_RETURN_IF_ERROR(
          device.Patch(p.tensor, p.first, p.positions, p.values));
      out.patched += p.tensor != last ? 1 : 0;
      last = p.tensor;
      out.patched_bytes +=
          p.positions.size() * sizeof(uint32_t) + p.values.size();
    }
    DCR_RETURN_IF_ERROR(device.Flush());
    out.patch_seconds = SecondsSince(start);
  }
  const auto hash_start = std::chrono::steady_clock::now();
  const std::vector<Digest128> want =
      staged != nullptr ? staged->target : HashAt(host, at, pool);
  std::vector<size_t> differ;
  for (size_t i = 0; i < tensors.size(); ++i) {
    DCR_ASSIGN_OR_RETURN(Digest128 got, device.Digest(i));
    if (got != want[i]) differ.push_back(i);
  }
  out.hash_seconds = SecondsSince(hash_start);
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
