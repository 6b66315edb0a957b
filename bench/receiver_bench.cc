// A serving rank's apply (dcr/receiver_map.h, issue 18): the canonical
// delta between two checkpoints, as decoded XOR chunks, applied to each
// serving rank's shards through the layout's maps, against ApplyChunk on
// the canonical tensors (what a relay with a canonical store does) over
// the same chunks in the same process. Checks that every rank ends at the
// shards built from the target.
//
//   dcr-traingen --out D --steps 1
//   receiver_bench --layout layouts/traingen-serve-tp2.yaml --dir D
//                  [--rounds R] [--out FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/codec.h"
#include "dcr/receiver_map.h"

namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Fail(const dcr::Status& s) {
  std::fprintf(stderr, "receiver_bench: %s\n", s.ToString().c_str());
  return 1;
}

struct Chunk {
  uint32_t tensor;
  uint64_t first;
  dcr::DecodedChunk c;
};

}  // namespace

int main(int argc, char** argv) {
  std::string layout_path, dir, out = "bench/results/receiver.json";
  int rounds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--layout") {
      layout_path = argv[i + 1];
    } else if (a == "--dir") {
      dir = argv[i + 1];
    } else if (a == "--rounds") {
      rounds = std::stoi(argv[i + 1]);
    } else if (a == "--out") {
      out = argv[i + 1];
    }
  }
  if (layout_path.empty() || dir.empty()) {
    std::fprintf(stderr, "usage: receiver_bench --layout L --dir D\n");
    return 2;
  }
  auto layout = dcr::LoadLayout(layout_path);
  if (!layout.ok()) return Fail(layout.status());
  auto base = dcr::Checkpoint::Open(dir + "/v0.safetensors",
                                    dcr::Checkpoint::Mode::kReadOnly);
  auto target = dcr::Checkpoint::Open(dir + "/v1.safetensors",
                                      dcr::Checkpoint::Mode::kReadOnly);
  if (!base.ok()) return Fail(base.status());
  if (!target.ok()) return Fail(target.status());
  dcr::CanonicalBytes cb, ct;
  for (size_t i = 0; i < (*base)->manifest().size(); ++i) {
    cb.emplace((*base)->manifest()[i].name, (*base)->TensorData(i));
    ct.emplace((*target)->manifest()[i].name, (*target)->TensorData(i));
  }

  // The delta as decoded XOR chunks of the default span.
  const uint64_t span = dcr::kDefaultSpanElems;
  std::vector<Chunk> chunks;
  uint64_t changed = 0, bytes = 0;
  for (uint32_t t = 0; t < layout->tensors.size(); ++t) {
    const dcr::LayoutTensor& lt = layout->tensors[t];
    const size_t w = dcr::DTypeSize(lt.dtype);
    auto b = cb.at(lt.name), g = ct.at(lt.name);
    const uint64_t n = b.size() / w;
    bytes += b.size();
    for (uint64_t s = 0; s * span < n; ++s) {
      Chunk k{t, s * span, {}};
      k.c.header.kind = dcr::ChunkKind::kXor;
      k.c.header.id = dcr::ChunkId{t, static_cast<uint32_t>(s), 0};
      k.c.header.elem_size = static_cast<uint8_t>(w);
      k.c.header.span_elems =
          static_cast<uint32_t>(std::min(span, n - s * span));
      for (uint64_t e = 0; e < k.c.header.span_elems; ++e) {
        const uint64_t at = (s * span + e) * w;
        if (std::memcmp(&b[at], &g[at], w) == 0) continue;
        k.c.positions.push_back(static_cast<uint32_t>(e));
        for (size_t x = 0; x < w; ++x)
          k.c.values.push_back(b[at + x] ^ g[at + x]);
      }
      k.c.header.changed = static_cast<uint32_t>(k.c.positions.size());
      changed += k.c.positions.size();
      chunks.push_back(std::move(k));
    }
  }

  // The reference: ApplyChunk on a canonical copy of the base.
  std::vector<double> canon_s;
  for (int r = 0; r < rounds; ++r) {
    std::vector<std::vector<std::byte>> copy;
    for (const dcr::LayoutTensor& lt : layout->tensors) {
      auto b = cb.at(lt.name);
      copy.emplace_back(b.begin(), b.end());
    }
    const auto t0 = Clock::now();
    for (const Chunk& k : chunks) {
      const size_t w = k.c.header.elem_size;
      dcr::Status s = dcr::ApplyChunk(
          k.c, std::span(copy[k.tensor])
                   .subspan(k.first * w, uint64_t{k.c.header.span_elems} * w));
      if (!s.ok()) return Fail(s);
    }
    canon_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }

  nlohmann::json j;
  j["layout"] = layout_path;
  j["canonical_bytes"] = bytes;
  j["changed"] = changed;
  j["rounds"] = rounds;
  j["canonical_apply_seconds"] = Median(canon_s);
  const double gb = static_cast<double>(bytes) / 1e9;
  std::printf(
      "%s: %llu changes (%.2f%%), 1 thread, medians of %d\n",
      layout_path.c_str(), static_cast<unsigned long long>(changed),
      100.0 * static_cast<double>(changed) / static_cast<double>(bytes / 2),
      rounds);
  std::printf("%-24s %10s %12s %14s\n", "apply", "seconds", "GB/s model",
              "vs canonical");
  std::printf("%-24s %10.3f %12.2f %14.2f\n", "canonical (ApplyChunk)",
              Median(canon_s), gb / Median(canon_s), 1.0);
  for (uint32_t rank = 0; rank < layout->ranks(); ++rank) {
    auto m = dcr::ReceiverMap::Create(*layout, rank);
    if (!m.ok()) return Fail(m.status());
    auto want = m->Build(ct);
    if (!want.ok()) return Fail(want.status());
    std::vector<double> secs;
    for (int r = 0; r < rounds; ++r) {
      auto shards = m->Build(cb);
      if (!shards.ok()) return Fail(shards.status());
      dcr::MutableShardBytes writable;
      for (auto& [name, b] : *shards) writable.emplace(name, b);
      const auto t0 = Clock::now();
      for (const Chunk& k : chunks) {
        auto wrote = m->Apply(k.tensor, k.first, k.c, writable);
        if (!wrote.ok()) return Fail(wrote.status());
      }
      secs.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      if (*shards != *want) {
        std::fprintf(stderr,
                     "receiver_bench: rank %u's shards are not the "
                     "target's\n",
                     rank);
        return 1;
      }
    }
    char label[64];
    std::snprintf(label, sizeof label, "serving rank %u", rank);
    std::printf("%-24s %10.3f %12.2f %14.2f\n", label, Median(secs),
                gb / Median(secs), Median(secs) / Median(canon_s));
    j["ranks"].push_back({{"rank", rank},
                          {"apply_seconds", Median(secs)},
                          {"over_canonical", Median(secs) / Median(canon_s)}});
  }
  std::ofstream(out) << j.dump(2) << "\n";
  std::printf("wrote %s\n", out.c_str());
  return 0;
}
