// The CUDA kernels (dcr/cuda.h) against the device-to-device copy bandwidth
// measured in the same run: a cudaMemcpyAsync of the same canonical bytes.
// For BF16 tensors with 0.1-50% of elements changed:
//   - diff: changed positions and XOR values (stream compaction),
//   - apply: those changes XORed into the span in place (sparse kernel),
//   - dense apply: a whole span's XOR mask,
//   - digest: the tensor digest of the span,
// each in GB/s of canonical bytes and as a fraction of the copy. Then the
// end-to-end encode of 1M-element spans (GPU diff, changes to the host,
// chunks built by the CPU encoder), whose chunk bytes must equal the CPU
// encoder's on host copies of the same spans, and decode + apply the other
// way (CPU decode, changes to the device, GPU apply; one chunk at a time,
// then through ChunkApplier's pipeline on 1-8 threads), with the CPU
// equivalents timed in the same process. Every figure is the median of
// --reps runs, timed on the host after the stream is synchronized.
// Prints a table; writes bench/results/gpu.json. Exit 1 on any mismatch.
//
//   gpu_bench [--gib G] [--reps R] [--e2e-spans S] [--out FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dcr/codec.h"
#include "dcr/cuda.h"
#include "dcr/digest.h"
#include "dcr/fp8.h"

namespace {

namespace cu = dcr::cuda;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

[[noreturn]] void Die(const std::string& what, const dcr::Status& st) {
  std::fprintf(stderr, "gpu_bench: %s: %s\n", what.c_str(),
               st.ToString().c_str());
  std::exit(1);
}

template <typename T>
T Must(dcr::Result<T> r, const std::string& what) {
  if (!r.ok()) Die(what, r.status());
  return std::move(r).value();
}

void Must(const dcr::Status& st, const std::string& what) {
  if (!st.ok()) Die(what, st);
}

// Median seconds of `reps` runs of fn (after one warm-up run).
template <typename F>
double Time(int reps, F&& fn) {
  fn();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    fn();
    t.push_back(Seconds(t0));
  }
  return Median(t);
}

// A BF16-like base (random normal-ish bits) and a target changing
// `density` of the elements in their low mantissa bits, as an optimizer
// step does.
void MakeStep(std::vector<uint16_t>* base, std::vector<uint16_t>* target,
              double density, std::mt19937_64& rng) {
  for (auto& v : *base) {
    v = static_cast<uint16_t>(0x3c00 + (rng() & 0x7ff)) ^
        static_cast<uint16_t>((rng() & 1) << 15);
  }
  *target = *base;
  const uint64_t gap = std::max<uint64_t>(1, uint64_t(2 / density));
  for (uint64_t i = rng() % gap; i < target->size(); i += 1 + rng() % gap) {
    (*target)[i] ^= static_cast<uint16_t>(1 + rng() % 15);
  }
}

}  // namespace

int main(int argc, char** argv) {
  double gib = 2;
  int reps = 5;
  uint64_t e2e_spans = 256;
  std::string out = "bench/results/gpu.json";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--gib") gib = std::stod(argv[i + 1]);
    if (a == "--reps") reps = std::stoi(argv[i + 1]);
    if (a == "--e2e-spans") e2e_spans = std::stoull(argv[i + 1]);
    if (a == "--out") out = argv[i + 1];
  }
  auto rt = cu::Probe();
  if (!rt.ok()) {
    std::printf("gpu_bench: skipped: %s\n", rt.status().ToString().c_str());
    return 77;
  }
  const cu::DeviceInfo& dev = rt.value().devices.front();
  const size_t w = 2;
  const uint64_t n = uint64_t(gib * (1ull << 30)) / w;
  const uint64_t bytes = n * w;
  std::printf("GPU: %s (cc %d.%d, %d SMs, %.0f GiB), driver %d, runtime %d\n",
              dev.name.c_str(), dev.cc_major, dev.cc_minor, dev.multiprocessors,
              dev.memory_bytes / 1073741824.0, rt.value().driver_version,
              rt.value().runtime_version);
  std::printf("canonical bytes per run: %.2f GiB of BF16; median of %d\n\n",
              bytes / 1073741824.0, reps);

  cu::DeviceBuffer d_base = Must(cu::DeviceBuffer::Allocate(bytes), "alloc");
  cu::DeviceBuffer d_target = Must(cu::DeviceBuffer::Allocate(bytes), "alloc");
  cu::DeviceBuffer d_copy = Must(cu::DeviceBuffer::Allocate(bytes), "alloc");
  cu::DeviceBuffer d_pos = Must(cu::DeviceBuffer::Allocate(4 * n), "alloc");
  cu::DeviceBuffer d_val = Must(cu::DeviceBuffer::Allocate(bytes), "alloc");
  auto differ = Must(cu::Differ::Create(n), "differ");
  auto digester = Must(cu::Digester::Create(), "digester");

  std::mt19937_64 rng(42);
  std::vector<uint16_t> base(n), target(n);
  nlohmann::json j;
  j["gpu"] = dev.name;
  j["canonical_bytes"] = bytes;
  j["reps"] = reps;
  bool ok = true;

  // The reference: a device-to-device copy of the same bytes.
  const double t_copy = Time(reps, [&] {
    Must(cu::CopyOnDevice(d_copy.data(), d_base.data(), bytes), "copy");
    Must(cu::Synchronize(nullptr), "copy");
  });
  const double copy_gbps = bytes / t_copy / 1e9;
  j["copy_gbps"] = copy_gbps;
  std::printf("%-28s %9.1f GB/s  (reads + writes: %.1f GB/s)\n",
              "device-to-device copy", copy_gbps, 2 * copy_gbps);
  std::printf("\n%-9s %10s %12s %12s %12s %12s\n", "density", "changed",
              "diff GB/s", "apply GB/s", "dense GB/s", "digest GB/s");
  std::printf("%-9s %10s %12s %12s %12s %12s\n", "", "", "(x copy)", "(x copy)",
              "(x copy)", "(x copy)");

  for (double density : {0.001, 0.01, 0.03, 0.05, 0.5}) {
    MakeStep(&base, &target, density, rng);
    Must(cu::CopyToDevice(d_base.data(), std::as_bytes(std::span(base))), "up");
    Must(cu::CopyToDevice(d_target.data(), std::as_bytes(std::span(target))),
         "up");
    uint64_t k = 0;
    const double t_diff = Time(reps, [&] {
      k = Must(differ->FindChanges(w, d_base.data(), d_target.data(), n, true,
                                   static_cast<uint32_t*>(d_pos.data()),
                                   d_val.data()),
               "diff");
    });
    // Check the count against the host (the unit tests check the bits).
    uint64_t want = 0;
    for (uint64_t i = 0; i < n; ++i) want += base[i] != target[i];
    if (k != want) {
      std::fprintf(stderr, "diff found %llu changes, the CPU %llu\n",
                   (unsigned long long)k, (unsigned long long)want);
      ok = false;
    }
    // Apply the XOR masks to a copy of the base: an even number of runs
    // leaves the base, an odd one the target.
    Must(cu::CopyOnDevice(d_copy.data(), d_base.data(), bytes), "copy");
    int applies = 0;
    const double t_apply = Time(reps, [&] {
      Must(cu::ApplyChanges(dcr::ChunkKind::kXor, w, d_copy.data(), n,
                            static_cast<uint32_t*>(d_pos.data()), d_val.data(),
                            k),
           "apply");
      Must(cu::Synchronize(nullptr), "apply");
      ++applies;
    });
    const dcr::Digest128 got =
        Must(digester->TensorDigest(d_copy.data(), bytes), "digest");
    const dcr::Digest128 expect = dcr::TensorDigest(
        std::as_bytes(std::span(applies % 2 == 1 ? target : base)));
    if (!(got == expect)) {
      std::fprintf(stderr, "apply or digest differs from the CPU's\n");
      ok = false;
    }
    const double t_dense = Time(reps, [&] {
      Must(cu::ApplyDense(dcr::ChunkKind::kXor, w, d_copy.data(), n,
                          d_target.data()),
           "dense");
      Must(cu::Synchronize(nullptr), "dense");
    });
    const double t_digest = Time(reps, [&] {
      Must(digester->TensorDigest(d_target.data(), bytes).status(), "digest");
    });
    auto gb = [&](double t) { return bytes / t / 1e9; };
    std::printf(
        "%-9.3f %10llu %7.1f %4.2f %7.1f %4.2f %7.1f %4.2f %7.1f %4.2f\n",
        density, (unsigned long long)k, gb(t_diff), gb(t_diff) / copy_gbps,
        gb(t_apply), gb(t_apply) / copy_gbps, gb(t_dense),
        gb(t_dense) / copy_gbps, gb(t_digest), gb(t_digest) / copy_gbps);
    j["kernels"].push_back({{"density", density},
                            {"changed", k},
                            {"diff_gbps", gb(t_diff)},
                            {"apply_gbps", gb(t_apply)},
                            {"dense_apply_gbps", gb(t_dense)},
                            {"digest_gbps", gb(t_digest)}});
  }

  // FP8 requantization of every 128x128 block of the target as a BF16
  // [rows, 16384] matrix (what a serving relay does to the blocks a refit
  // touched; all of them here), against the CPU's on a 64 MiB slice.
  {
    dcr::Fp8Tensor t;
    t.dtype = dcr::DType::kBF16;
    t.cols = 16384;
    t.rows = n / t.cols;
    dcr::Fp8BlockSet all(t);
    all.MarkAll();
    cu::DeviceBuffer d_q = Must(cu::DeviceBuffer::Allocate(t.elements()), "q");
    cu::DeviceBuffer d_s =
        Must(cu::DeviceBuffer::Allocate(4 * t.blocks()), "scales");
    const double t_gpu = Time(reps, [&] {
      Must(cu::RequantizeFp8(t, d_target.data(), all,
                             static_cast<uint8_t*>(d_q.data()),
                             static_cast<float*>(d_s.data())),
           "fp8");
    });
    dcr::Fp8Tensor slice = t;
    slice.rows = std::min<uint64_t>(t.rows, 2048);
    dcr::Fp8BlockSet slice_all(slice);
    slice_all.MarkAll();
    std::vector<uint8_t> q(slice.elements());
    std::vector<float> sc(slice.blocks());
    const auto src = std::as_bytes(std::span(target.data(), slice.elements()));
    const double t_cpu = Time(reps, [&] {
      Must(dcr::RequantizeFp8(slice, src, slice_all, q, sc), "fp8 cpu");
    });
    // The GPU's codes and scales for the slice are the CPU's.
    std::vector<std::byte> gq(slice.elements()), gs(4 * slice.blocks());
    Must(cu::CopyToHost(gq, d_q.data()), "down");
    Must(cu::CopyToHost(gs, d_s.data()), "down");
    const bool same = std::memcmp(gq.data(), q.data(), gq.size()) == 0 &&
                      std::memcmp(gs.data(), sc.data(), gs.size()) == 0;
    if (!same) ok = false;
    const double gpu_gbps = bytes / t_gpu / 1e9;
    const double cpu_gbps = slice.elements() * 2.0 / t_cpu / 1e9;
    std::printf(
        "\nFP8 requantization, every 128x128 block: GPU %.1f GB/s "
        "(x%.2f copy), CPU (one thread) %.2f GB/s; %s\n",
        gpu_gbps, gpu_gbps / copy_gbps, cpu_gbps,
        same ? "identical" : "DIFFER");
    j["fp8_requant"] = {
        {"gpu_gbps", gpu_gbps}, {"cpu_gbps", cpu_gbps}, {"identical", same}};
  }

  // End to end over the first e2e_spans spans of 1M elements at 3%.
  const uint64_t span = dcr::kDefaultSpanElems;
  const uint64_t spans = std::min<uint64_t>(e2e_spans, n / span);
  const uint64_t en = spans * span;
  MakeStep(&base, &target, 0.03, rng);
  Must(cu::CopyToDevice(d_base.data(),
                        std::as_bytes(std::span(base.data(), en))),
       "up");
  Must(cu::CopyToDevice(d_target.data(),
                        std::as_bytes(std::span(target.data(), en))),
       "up");
  auto enc = Must(dcr::ChunkEncoder::Create(dcr::EncodeOptions{}), "encoder");
  auto dec = Must(dcr::ChunkDecoder::Create(), "decoder");
  std::vector<uint32_t> pos(en);
  std::vector<std::byte> vals(en * w);
  std::vector<std::vector<std::byte>> gpu_chunks(spans), cpu_chunks(spans);
  const double t_gpu_encode = Time(reps, [&] {
    const uint64_t k = Must(
        differ->FindChanges(w, d_base.data(), d_target.data(), en, true,
                            static_cast<uint32_t*>(d_pos.data()), d_val.data()),
        "diff");
    Must(cu::CopyToHost(std::as_writable_bytes(std::span(pos.data(), k)),
                        d_pos.data()),
         "down");
    Must(cu::CopyToHost(std::span(vals.data(), k * w), d_val.data()), "down");
    uint64_t at = 0;
    for (uint64_t s = 0; s < spans; ++s) {
      uint64_t end = at;
      while (end < k && pos[end] < (s + 1) * span) ++end;
      std::vector<uint32_t> rel(pos.begin() + at, pos.begin() + end);
      for (auto& p : rel) p -= static_cast<uint32_t>(s * span);
      gpu_chunks[s].clear();
      if (!rel.empty()) {
        Must(enc->EncodeChanges(dcr::ChunkKind::kXor,
                                {0, static_cast<uint32_t>(s), 0}, w,
                                static_cast<uint32_t>(span), rel,
                                std::span(vals.data() + at * w, rel.size() * w),
                                &gpu_chunks[s]),
             "encode");
      }
      at = end;
    }
  });
  const double t_cpu_encode = Time(reps, [&] {
    for (uint64_t s = 0; s < spans; ++s) {
      cpu_chunks[s].clear();
      auto b = std::as_bytes(std::span(base.data() + s * span, span));
      auto t = std::as_bytes(std::span(target.data() + s * span, span));
      Must(enc->EncodeDiff(dcr::ChunkKind::kXor,
                           {0, static_cast<uint32_t>(s), 0}, w, b, t,
                           &cpu_chunks[s])
               .status(),
           "encode");
    }
  });
  const bool same = gpu_chunks == cpu_chunks;
  if (!same) ok = false;
  uint64_t chunk_bytes = 0;
  for (const auto& c : cpu_chunks) chunk_bytes += c.size();

  // Decode on the CPU, changes to the device, apply there; against the
  // CPU's decode + apply into host memory.
  dcr::DecodedChunk dc;
  const double t_gpu_apply = Time(reps, [&] {
    for (uint64_t s = 0; s < spans; ++s) {
      if (gpu_chunks[s].empty()) continue;
      Must(dec->Decode(gpu_chunks[s], &dc), "decode");
      const uint64_t k = dc.positions.size();
      Must(cu::CopyToDevice(d_pos.data(),
                            std::as_bytes(std::span(dc.positions))),
           "up");
      Must(cu::CopyToDevice(d_val.data(), dc.values), "up");
      Must(cu::ApplyChanges(dc.header.kind, w,
                            static_cast<uint16_t*>(d_copy.data()) + s * span,
                            span, static_cast<uint32_t*>(d_pos.data()),
                            d_val.data(), k),
           "apply");
    }
    Must(cu::Synchronize(nullptr), "apply");
  });
  std::vector<uint16_t> host = base;
  const double t_cpu_apply = Time(reps, [&] {
    for (uint64_t s = 0; s < spans; ++s) {
      if (cpu_chunks[s].empty()) continue;
      Must(dec->Decode(cpu_chunks[s], &dc), "decode");
      Must(dcr::ApplyChunk(dc, std::as_writable_bytes(
                                   std::span(host.data() + s * span, span))),
           "apply");
    }
  });
  // The same through ChunkApplier (decode overlapping staging and apply),
  // on 1, 4 and 8 threads, each with its own applier and spans.
  std::vector<std::pair<int, double>> pipelined;
  for (int threads : {1, 4, 8}) {
    std::vector<std::unique_ptr<cu::ChunkApplier>> appliers;
    for (int t = 0; t < threads; ++t) {
      appliers.push_back(Must(
          cu::ChunkApplier::Create(cu::ChunkApplier::Options{}), "applier"));
    }
    const double t_pipe = Time(reps, [&] {
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
          for (uint64_t s = t; s < spans; s += threads) {
            if (gpu_chunks[s].empty()) continue;
            Must(appliers[t]->Apply(
                     gpu_chunks[s],
                     static_cast<uint16_t*>(d_copy.data()) + s * span, span),
                 "apply");
          }
          Must(appliers[t]->Flush(), "flush");
        });
      }
      for (auto& th : pool) th.join();
    });
    pipelined.emplace_back(threads, t_pipe);
  }
  const double e2e_bytes = double(en * w);
  std::printf(
      "\nend to end, %llu spans of 1M BF16 elements, 3%% changed "
      "(%.1f MiB of chunks):\n",
      (unsigned long long)spans, chunk_bytes / 1048576.0);
  std::printf(
      "  encode: GPU diff + CPU chunks %6.2f GB/s, CPU only %6.2f GB/s"
      " (x%.2f); chunk bytes %s\n",
      e2e_bytes / t_gpu_encode / 1e9, e2e_bytes / t_cpu_encode / 1e9,
      t_cpu_encode / t_gpu_encode, same ? "identical" : "DIFFER");
  std::printf(
      "  decode + apply: CPU decode + GPU apply %6.2f GB/s, CPU only "
      "%6.2f GB/s (x%.2f)\n",
      e2e_bytes / t_gpu_apply / 1e9, e2e_bytes / t_cpu_apply / 1e9,
      t_cpu_apply / t_gpu_apply);
  nlohmann::json pipe = nlohmann::json::array();
  for (const auto& [threads, t] : pipelined) {
    std::printf(
        "  decode + apply through ChunkApplier, %d thread%s: %6.2f GB/s\n",
        threads, threads == 1 ? "" : "s", e2e_bytes / t / 1e9);
    pipe.push_back({{"threads", threads}, {"gbps", e2e_bytes / t / 1e9}});
  }
  j["e2e"] = {{"spans", spans},
              {"density", 0.03},
              {"chunk_bytes", chunk_bytes},
              {"encode_gpu_gbps", e2e_bytes / t_gpu_encode / 1e9},
              {"encode_cpu_gbps", e2e_bytes / t_cpu_encode / 1e9},
              {"chunks_identical", same},
              {"decode_apply_gpu_gbps", e2e_bytes / t_gpu_apply / 1e9},
              {"decode_apply_cpu_gbps", e2e_bytes / t_cpu_apply / 1e9},
              {"decode_apply_pipelined", pipe}};
  j["ok"] = ok;
  std::ofstream(out) << j.dump(2) << "\n";
  std::printf("\n%s; wrote %s\n", ok ? "all results match the CPU" : "MISMATCH",
              out.c_str());
  return ok ? 0 : 1;
}
