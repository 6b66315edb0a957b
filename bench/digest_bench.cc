// The linear digest (dcr/digest.h), the tensor digest, against XXH3-128, the
// earlier one, in the same process and rounds: dense throughput per kernel, the
// cost of hashing a tensor as parts of 1-64 KiB cut at random byte offsets (as
// producers hash the runs of their pieces), of a column split's 1 KiB rows
// one by one and batched (LinearHashRuns), and of updating a digest change
// by change. Prints a table; writes bench/results/digest.json.
//
//   digest_bench [--mib N] [--rounds R] [--out FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/linear_digest.h"
#include "dcr/digest.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  size_t mib = 256;
  int rounds = 5;
  std::string out = "bench/results/digest.json";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--mib") mib = std::stoul(argv[i + 1]);
    if (a == "--rounds") rounds = std::stoi(argv[i + 1]);
    if (a == "--out") out = argv[i + 1];
  }
  const size_t n = mib << 20;
  std::vector<std::byte> buf(n);
  std::mt19937_64 rng(1);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v = rng();
    std::memcpy(&buf[i], &v, std::min<size_t>(8, n - i));
  }
  dcr::linear_digest::Powers k;
  k.k[0] = dcr::kLinearDigestKey;
  for (size_t j = 1; j < dcr::linear_digest::kGroup; ++j) {
    k.k[j] = dcr::linear_digest::MultiplyGeneric(k.k[j - 1], k.k[0]);
  }
  // Parts: runs of 1-64 KiB cut at random byte offsets.
  std::vector<std::pair<size_t, size_t>> parts;
  for (size_t at = 0; at < n;) {
    size_t len = std::min(n - at, size_t{1024} + rng() % (63 * 1024));
    parts.emplace_back(at, len);
    at += len;
  }
  // 1% of BF16 elements changed, as XOR masks.
  std::vector<uint64_t> changed;
  for (uint64_t e = 0; e < n / 2; e += 1 + rng() % 199) changed.push_back(e);
  const size_t updates = std::min<size_t>(changed.size(), 100000);

  std::map<std::string, std::vector<double>> gbps;  // per round
  std::vector<double> ratio_best, update_us, rows_ratio, scattered_us;
  // The same changes' masks side by side, for LinearHashElements.
  std::vector<std::byte> masks(2 * updates);
  for (size_t i = 0; i < updates; ++i) masks[2 * i] = std::byte{1};
  const auto kernels = dcr::linear_digest::AllKernels();
  const dcr::LinearDigest whole = dcr::LinearHash(0, buf);
  for (int r = 0; r < rounds; ++r) {
    auto t0 = Clock::now();
    volatile uint64_t sink = dcr::Hash128(buf).low;
    double xxh = n / Seconds(t0) / 1e9;
    gbps["xxh3-128"].push_back(xxh);
    for (const auto& [name, kern] : kernels) {
      if (std::string(name) == "generic" && mib > 16) continue;  // minutes
      t0 = Clock::now();
      sink = kern->body(buf.data(), n / 16, k).low;
      gbps[std::string("linear/") + name].push_back(n / Seconds(t0) / 1e9);
    }
    t0 = Clock::now();
    dcr::LinearDigest sum;
    for (const auto& [at, len] : parts) {
      sum ^= dcr::LinearHash(at, std::span(buf).subspan(at, len));
    }
    gbps["linear/1-64 KiB parts"].push_back(n / Seconds(t0) / 1e9);
    if (!(sum == whole)) {
      std::fprintf(stderr, "parts do not add up to the whole\n");
      return 1;
    }
    // A 4-way column split's rows: 1 KiB runs, each at a 4 KiB stride of
    // the canonical tensor; one LinearHash per row against LinearHashRuns.
    constexpr size_t kRow = 1024;
    const size_t rows = n / kRow;
    t0 = Clock::now();
    dcr::LinearDigest each;
    for (size_t i = 0; i < rows; ++i) {
      each ^= dcr::LinearHash(4 * kRow * i + kRow,
                              std::span(buf).subspan(i * kRow, kRow));
    }
    const double each_gbps = n / Seconds(t0) / 1e9;
    gbps["linear/1 KiB rows, each"].push_back(each_gbps);
    t0 = Clock::now();
    const dcr::LinearDigest batched =
        dcr::LinearHashRuns(kRow, 4 * kRow, kRow, rows, buf.data(), kRow);
    const double batched_gbps = n / Seconds(t0) / 1e9;
    gbps["linear/1 KiB rows, batched"].push_back(batched_gbps);
    rows_ratio.push_back(batched_gbps / each_gbps);
    if (!(each == batched)) {
      std::fprintf(stderr, "batched rows differ from the rows hashed each\n");
      return 1;
    }
    if (auto it = gbps.find(std::string("linear/") + kernels.back().first);
        it != gbps.end()) {
      ratio_best.push_back(it->second.back() / xxh);
    }
    t0 = Clock::now();
    dcr::LinearDigest d;
    const std::byte mask[2] = {std::byte{1}, std::byte{0}};
    for (size_t i = 0; i < updates; ++i) {
      d ^= dcr::LinearHash(2 * changed[i], mask);
    }
    sink = d.low;
    update_us.push_back(Seconds(t0) / static_cast<double>(updates) * 1e6);
    // All of them at once, as a producer whose shards live on a GPU
    // updates its digests by the changes it copied back.
    t0 = Clock::now();
    const dcr::LinearDigest scattered =
        dcr::LinearHashElements(0, 2, changed.data(), updates, masks.data());
    scattered_us.push_back(Seconds(t0) / static_cast<double>(updates) * 1e6);
    if (!(scattered == d)) {
      std::fprintf(stderr, "scattered elements differ from their updates\n");
      return 1;
    }
    (void)sink;
  }

  std::printf("%-28s %10s\n", "digest", "GB/s");
  nlohmann::json j;
  for (const auto& [name, v] : gbps) {
    std::printf("%-28s %10.2f\n", name.c_str(), Median(v));
    j["gbps"][name] = Median(v);
  }
  if (!ratio_best.empty()) {
    std::printf("best linear kernel / xxh3-128 (same round): %.2f\n",
                Median(ratio_best));
    j["best_over_xxh3"] = Median(ratio_best);
  }
  std::printf("1 KiB rows batched / each (same round): %.2f\n",
              Median(rows_ratio));
  j["rows_batched_over_each"] = Median(rows_ratio);
  std::printf("update by one changed element: %.2f us\n", Median(update_us));
  std::printf("the same changes at once (LinearHashElements): %.3f us each\n",
              Median(scattered_us));
  j["scattered_us_per_element"] = Median(scattered_us);
  j["best_kernel"] = kernels.back().first;
  j["update_us_per_element"] = Median(update_us);
  j["bytes"] = n;
  j["rounds"] = rounds;
  std::ofstream(out) << j.dump(2) << "\n";
  std::printf("wrote %s\n", out.c_str());
  return 0;
}
