// FP8 requantization on a relay (dcr/fp8.h, issue 18): after a refit's
// delta lands in a tensor's canonical shadow, the blocks it touched are
// requantized into the serving store's E4M3 values and scales. This times,
// per core, the whole-tensor quantization and the requantization after a
// step that changed 0.01%, 1% and 3% of the elements, against a memcpy of
// the same canonical bytes in the same process (the noise-free ratio), and
// a rank's requantization of a tensor with one scale (tp 1, 2, 8).
//
//   fp8_bench [--rows R] [--cols C] [--rounds N] [--out FILE]
//
// The weights are synthetic: N(0, 0.02) in BF16, and a step moves each
// changed element by one BF16 ulp (the size of most Adam-step changes).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "dcr/fp8.h"

namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <typename F>
double Seconds(F&& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int Fail(const dcr::Status& s) {
  std::fprintf(stderr, "fp8_bench: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t rows = 8192, cols = 8192;
  int rounds = 5;
  std::string out = "bench/results/fp8.json";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--rows")
      rows = std::stoull(argv[i + 1]);
    else if (a == "--cols")
      cols = std::stoull(argv[i + 1]);
    else if (a == "--rounds")
      rounds = std::stoi(argv[i + 1]);
    else if (a == "--out")
      out = argv[i + 1];
    else {
      std::fprintf(stderr,
                   "usage: fp8_bench [--rows R] [--cols C] "
                   "[--rounds N] [--out FILE]\n");
      return 2;
    }
  }
  dcr::Fp8Tensor t{dcr::DType::kBF16, rows, cols, 128, 128};
  const uint64_t n = t.elements();
  std::vector<uint16_t> w(n);
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (uint16_t& x : w) {
    uint32_t b;
    const float v = normal(rng);
    std::memcpy(&b, &v, 4);
    x = static_cast<uint16_t>((b + 0x7FFF + ((b >> 16) & 1)) >> 16);
  }
  std::vector<uint16_t> copy(n);
  std::vector<uint8_t> q(n);
  std::vector<float> s(t.blocks());
  const auto src = std::as_bytes(std::span(w));

  std::vector<double> copy_s, full_s;
  for (int r = 0; r < rounds + 1; ++r) {  // the first round warms the pages
    const double c =
        Seconds([&] { std::memcpy(copy.data(), w.data(), n * 2); });
    dcr::Status st;
    const double f = Seconds([&] { st = dcr::QuantizeFp8(t, src, q, s); });
    if (!st.ok()) return Fail(st);
    if (r > 0) {
      copy_s.push_back(c);
      full_s.push_back(f);
    }
  }
  const double gb = static_cast<double>(n * 2) / 1e9;
  nlohmann::json j;
  j["rows"] = rows;
  j["cols"] = cols;
  j["block"] = {128, 128};
  j["canonical_bytes"] = n * 2;
  j["rounds"] = rounds;
  j["memcpy_gbps"] = gb / Median(copy_s);
  j["quantize_gbps"] = gb / Median(full_s);
  std::printf(
      "BF16 [%llu, %llu] -> E4M3, 128x128 blocks, 1 thread, medians "
      "of %d; GB/s of canonical bytes\n",
      static_cast<unsigned long long>(rows),
      static_cast<unsigned long long>(cols), rounds);
  std::printf("%-22s %10s %10s %12s %12s\n", "", "blocks", "seconds", "GB/s",
              "vs memcpy");
  std::printf("%-22s %10s %10.3f %12.2f %12.2f\n", "memcpy", "-",
              Median(copy_s), gb / Median(copy_s), 1.0);
  std::printf("%-22s %10llu %10.3f %12.2f %12.2f\n", "quantize all",
              static_cast<unsigned long long>(t.blocks()), Median(full_s),
              gb / Median(full_s), Median(copy_s) / Median(full_s));

  for (double rate : {0.0001, 0.01, 0.03}) {
    std::vector<double> mark_s, req_s;
    uint64_t touched = 0;
    for (int r = 0; r < rounds; ++r) {
      // A step: `rate` of the elements move by one ulp.
      std::vector<uint32_t> pos;
      std::bernoulli_distribution moved(rate);
      for (uint64_t i = 0; i < n; ++i) {
        if (moved(rng)) {
          pos.push_back(static_cast<uint32_t>(i));
          w[i] = static_cast<uint16_t>(w[i] ^ 1);
        }
      }
      dcr::Fp8BlockSet blocks(t);
      mark_s.push_back(Seconds([&] { blocks.MarkElements(0, pos); }));
      touched = blocks.count();
      dcr::Status st;
      req_s.push_back(
          Seconds([&] { st = dcr::RequantizeFp8(t, src, blocks, q, s); }));
      if (!st.ok()) return Fail(st);
    }
    const double secs = Median(mark_s) + Median(req_s);
    char label[64];
    std::snprintf(label, sizeof label, "requantize at %g%%", rate * 100);
    std::printf("%-22s %10llu %10.3f %12.2f %12.2f\n", label,
                static_cast<unsigned long long>(touched), secs, gb / secs,
                Median(copy_s) / secs);
    nlohmann::json row;
    row["change_rate"] = rate;
    row["blocks_touched"] = touched;
    row["blocks"] = t.blocks();
    row["mark_seconds"] = Median(mark_s);
    row["requantize_seconds"] = Median(req_s);
    row["gbps"] = gb / secs;
    j["requantize"].push_back(row);
  }
  // One scale per tensor (`block: tensor`): a rank of tensor parallel k
  // reads all of the tensor for its scale, then quantizes its 1/k of the
  // rows (docs/PLACEMENT.md §"One scale per tensor").
  const dcr::Fp8Tensor whole{dcr::DType::kBF16, rows, cols, 0, 0};
  std::vector<uint8_t> q_whole(n);
  for (uint32_t tp : {1u, 2u, 8u}) {
    std::vector<double> secs_v;
    const uint64_t slice = rows / tp;
    for (int r = 0; r < rounds; ++r) {
      dcr::Status st;
      secs_v.push_back(Seconds([&] {
        auto scale = dcr::Fp8TensorScale(whole, src);
        st = scale.ok() ? dcr::QuantizeFp8Box(whole, src, *scale, 0, 0, slice,
                                              cols, q_whole, cols)
                        : scale.status();
      }));
      if (!st.ok()) return Fail(st);
    }
    const double secs = Median(secs_v);
    char label[64];
    std::snprintf(label, sizeof label, "per tensor, tp %u rank", tp);
    std::printf("%-22s %10s %10.3f %12.2f %12.2f\n", label, "1", secs,
                gb / secs, Median(copy_s) / secs);
    j["per_tensor"].push_back({{"tp", tp},
                               {"rows_quantized", slice},
                               {"seconds", secs},
                               {"gbps_of_tensor", gb / secs}});
  }
  // The check a relay makes implicitly: requantized == quantized afresh.
  std::vector<uint8_t> q2(n);
  std::vector<float> s2(t.blocks());
  if (dcr::Status st = dcr::QuantizeFp8(t, src, q2, s2); !st.ok()) {
    return Fail(st);
  }
  if (q2 != q || s2 != s) {
    std::fprintf(stderr,
                 "fp8_bench: requantized blocks differ from a fresh "
                 "quantization\n");
    return 1;
  }
  std::ofstream(out) << j.dump(2) << "\n";
  std::printf("wrote %s\n", out.c_str());
  return 0;
}
