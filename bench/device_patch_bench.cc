// What a flip costs the relay for a GPU server (relay/device_weights.h):
// StageDeviceChanges, the diff of the old live image against the new one
// that finds the patches, against the pass it replaced, a TensorDigest of
// every tensor of the new image, in the same process and rounds; and the
// bytes a pause then copies to the GPU (the patches) against the rank.
// Host memory only: the GPU side is bench/gpu_check.sh's.
//
//   device_patch_bench [--mib N] [--threads T] [--rounds R] [--out FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "dcr/digest.h"
#include "dcr/store.h"
#include "dcr/thread_pool.h"
#include "relay/device_weights.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::unique_ptr<dcr::WeightStore> Store(const dcr::Manifest& m) {
  auto s = dcr::CreateStore(*dcr::ParseStoreSpec("memory:"), m);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(s);
}

}  // namespace

int main(int argc, char** argv) {
  size_t mib = 1024;
  size_t threads = 2;
  int rounds = 3;
  std::string out = "bench/results/device_patch.json";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--mib") mib = std::stoul(argv[i + 1]);
    if (a == "--threads") threads = std::stoul(argv[i + 1]);
    if (a == "--rounds") rounds = std::stoi(argv[i + 1]);
    if (a == "--out") out = argv[i + 1];
  }
  // A rank of BF16 matrices of 16 MiB (8 Mi elements) each.
  const uint64_t elems = uint64_t{8} << 20;
  std::vector<dcr::TensorInfo> tensors;
  for (size_t t = 0; t < std::max<size_t>(mib / 16, 1); ++t) {
    tensors.push_back({"layers." + std::to_string(1000 + t) + ".weight",
                       dcr::DType::kBF16,
                       {elems}});
  }
  auto manifest = dcr::Manifest::Create(tensors);
  if (!manifest.ok()) return 1;
  auto base = Store(*manifest);
  auto target = Store(*manifest);
  std::mt19937_64 rng(1);
  for (size_t t = 0; t < manifest->size(); ++t) {
    auto b = base->MutableTensor(t);
    for (size_t i = 0; i + 8 <= b.size(); i += 8) {
      const uint64_t v = rng();
      std::memcpy(b.data() + i, &v, 8);
    }
  }
  const double rank_bytes = static_cast<double>(manifest->TotalBytes());
  dcr::ThreadPool pool(threads);
  // The default patch budget of a relay with 2 apply threads at the
  // default 2 GiB limit (docs/PROTOCOL.md §"GPU servers").
  const uint64_t default_budget = (500ull - 32 - 6) << 20;
  nlohmann::json rows = nlohmann::json::array();
  std::printf("rank %.0f MiB of BF16, %zu threads, median of %d\n",
              rank_bytes / (1 << 20), threads, rounds);
  std::printf("%6s %10s %10s %9s %11s %11s %14s\n", "change", "hash GB/s",
              "diff GB/s", "diff/hash", "patches MB", "of the rank",
              "patched @460M");
  for (double rate : {0.01, 0.03, 0.05}) {
    for (size_t t = 0; t < manifest->size(); ++t) {
      auto from = base->Tensor(t);
      auto to = target->MutableTensor(t);
      std::memcpy(to.data(), from.data(), from.size());
      std::geometric_distribution<uint64_t> gap(rate);
      for (uint64_t e = gap(rng); e < elems; e += 1 + gap(rng)) {
        to[e * 2] ^= std::byte{1};  // the lowest mantissa bit
      }
    }
    std::vector<double> hash_s, diff_s;
    dcr::DeviceChanges staged;
    for (int r = 0; r < rounds; ++r) {
      auto t0 = Clock::now();
      std::vector<dcr::Digest128> d(manifest->size());
      pool.ParallelFor(manifest->size(), [&](size_t i, size_t) {
        d[i] = dcr::TensorDigest(target->Tensor(i));
      });
      hash_s.push_back(Seconds(t0));
      t0 = Clock::now();
      auto s = dcr::StageDeviceChanges(tensors, base.get(), *target, &pool,
                                       uint64_t{1} << 40);
      diff_s.push_back(Seconds(t0));
      if (!s.ok()) {
        std::fprintf(stderr, "%s\n", s.status().ToString().c_str());
        return 1;
      }
      if (s->target != d) {
        std::fprintf(stderr, "the diff's digests are not the hash's\n");
        return 1;
      }
      staged = *std::move(s);
    }
    auto budgeted = dcr::StageDeviceChanges(tensors, base.get(), *target, &pool,
                                            default_budget);
    if (!budgeted.ok()) return 1;
    const double hash = Median(hash_s), diff = Median(diff_s);
    const double patches = static_cast<double>(staged.bytes);
    std::printf(
        "%5.0f%% %10.2f %10.2f %9.2f %11.1f %10.1f%% %8llu of %zu\n",
        rate * 100, rank_bytes / hash / 1e9, 2 * rank_bytes / diff / 1e9,
        diff / hash, patches / 1e6, 100 * patches / rank_bytes,
        static_cast<unsigned long long>(budgeted->patched), manifest->size());
    rows.push_back({{"change", rate},
                    {"hash_seconds", hash},
                    {"diff_seconds", diff},
                    {"diff_over_hash", diff / hash},
                    {"patch_bytes", staged.bytes},
                    {"rank_bytes", manifest->TotalBytes()},
                    {"patched_at_default_budget", budgeted->patched},
                    {"tensors", manifest->size()}});
  }
  std::printf(
      "hash: the old flip pass (the new image read once); diff: "
      "StageDeviceChanges (both images read: GB/s of the two)\n");
  std::ofstream f(out);
  f << nlohmann::json{{"rank_mib", mib},
                      {"threads", threads},
                      {"rounds", rounds},
                      {"rows", rows}}
           .dump(2)
    << "\n";
  return 0;
}
