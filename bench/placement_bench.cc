// Each producer's side of a refit without gathering (dcr/shard_diff.h): a
// rank diffs its own shards and projects the changes, against one process
// diffing the gathered canonical checkpoint with the same code (a layout
// of one rank holding every tensor whole). Same process, same rounds.
//
//   dcr-traingen --out D --steps 1 --layout L
//   placement_bench --layout L --dir D [--rounds R] [--out FILE]
//
// Prints per rank the bytes it read, the changes it produced and its
// throughput, and writes bench/results/placement.json.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/digest.h"
#include "dcr/layout.h"
#include "dcr/shard_diff.h"

namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

dcr::Result<std::unique_ptr<dcr::Checkpoint>> Open(const std::string& path) {
  return dcr::Checkpoint::Open(path, dcr::Checkpoint::Mode::kReadOnly);
}

dcr::ShardBytes Tensors(const dcr::Checkpoint& c) {
  dcr::ShardBytes out;
  for (size_t i = 0; i < c.manifest().size(); ++i) {
    out.emplace(c.manifest()[i].name, c.TensorData(i));
  }
  return out;
}

int Fail(const dcr::Status& s) {
  std::fprintf(stderr, "placement_bench: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string layout_path, dir, out = "bench/results/placement.json";
  int rounds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--layout") layout_path = argv[i + 1];
    if (a == "--dir") dir = argv[i + 1];
    if (a == "--rounds") rounds = std::stoi(argv[i + 1]);
    if (a == "--out") out = argv[i + 1];
  }
  if (layout_path.empty() || dir.empty()) {
    std::fprintf(stderr, "usage: placement_bench --layout L --dir D\n");
    return 2;
  }
  auto layout = dcr::LoadLayout(layout_path);
  if (!layout.ok()) return Fail(layout.status());

  // The gathered reference: one rank holding every canonical tensor whole.
  auto base = Open(dir + "/v0.safetensors");
  auto target = Open(dir + "/v1.safetensors");
  if (!base.ok()) return Fail(base.status());
  if (!target.ok()) return Fail(target.status());
  dcr::Layout whole;
  whole.source = "gathered";
  for (const dcr::TensorInfo& t : (*base)->manifest().tensors()) {
    dcr::LayoutTensor lt;
    lt.name = t.name;
    lt.shape = t.shape;
    lt.dtype = t.dtype;
    lt.conversion.shard_dtype = t.dtype;
    lt.pieces.push_back(dcr::AffinePiece::Block(0, t.name, t.shape,
                                                dcr::Shape(t.shape.size(), 0)));
    whole.tensors.push_back(std::move(lt));
  }
  const dcr::ShardBytes cb = Tensors(**base), ct = Tensors(**target);

  struct Rank {
    std::unique_ptr<dcr::Checkpoint> base, target;
    dcr::ShardBytes b, t;
    std::vector<double> seconds;
    dcr::ShardDiffStats stats;
    // The host's side of a rank whose shards live on a GPU: each shard's
    // changed elements (what the GPU's diff copies back, found here once,
    // untimed), projected and folded into the digests; against the host
    // producer's diff plus its hash of the target's regions.
    std::map<std::string, dcr::ShardChanges> changes;
    std::vector<double> host_step_s, gpu_host_s;
  };
  std::vector<Rank> ranks(layout->ranks());
  for (uint32_t r = 0; r < layout->ranks(); ++r) {
    char name[64];
    std::snprintf(name, sizeof name, "/rank-%05u.safetensors", r);
    auto b = Open(dir + "/v0.shards" + name);
    auto t = Open(dir + "/v1.shards" + name);
    if (!b.ok()) return Fail(b.status());
    if (!t.ok()) return Fail(t.status());
    ranks[r].base = std::move(*b);
    ranks[r].target = std::move(*t);
    ranks[r].b = Tensors(*ranks[r].base);
    ranks[r].t = Tensors(*ranks[r].target);
    for (const auto& [shard, info] : layout->ShardsOf(r)) {
      const size_t w = dcr::DTypeSize(info.dtype);
      auto sb = ranks[r].b.at(shard), st = ranks[r].t.at(shard);
      dcr::ShardChanges& c = ranks[r].changes[shard];
      for (uint64_t e = 0; e < sb.size() / w; ++e) {
        if (std::memcmp(&sb[e * w], &st[e * w], w) == 0) continue;
        c.positions.push_back(e);
        c.base.insert(c.base.end(), &sb[e * w], &sb[e * w] + w);
        c.target.insert(c.target.end(), &st[e * w], &st[e * w] + w);
      }
    }
  }

  std::vector<double> gathered_s, ratio;
  dcr::ShardDiffStats gathered;
  uint64_t changed_all = 0;
  for (int round = 0; round < rounds; ++round) {
    auto t0 = Clock::now();
    auto g = dcr::DiffShards(whole, 0, cb, ct, &gathered);
    const double gs = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!g.ok()) return Fail(g.status());
    gathered_s.push_back(gs);
    double sum = 0;
    changed_all = 0;
    for (uint32_t r = 0; r < layout->ranks(); ++r) {
      t0 = Clock::now();
      auto c =
          dcr::DiffShards(*layout, r, ranks[r].b, ranks[r].t, &ranks[r].stats);
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (!c.ok()) return Fail(c.status());
      ranks[r].seconds.push_back(s);
      sum += s;
      changed_all += ranks[r].stats.changed;

      // The host producer's step: the diff and the target's digests.
      t0 = Clock::now();
      auto c2 = dcr::DiffShards(*layout, r, ranks[r].b, ranks[r].t);
      auto h = dcr::HashShardRegions(*layout, r, ranks[r].t);
      ranks[r].host_step_s.push_back(
          std::chrono::duration<double>(Clock::now() - t0).count());
      if (!c2.ok()) return Fail(c2.status());
      if (!h.ok()) return Fail(h.status());
      // A GPU-resident rank's host side: projection and digest update.
      auto hb = dcr::HashShardRegions(*layout, r, ranks[r].b);
      if (!hb.ok()) return Fail(hb.status());
      std::vector<dcr::LinearDigest> digests = *hb;
      std::vector<std::byte> mask;
      t0 = Clock::now();
      dcr::Status ps = dcr::ProjectShardChanges(
          *layout, r,
          [&](const std::string& shard, dcr::ShardChanges* landed) {
            *landed = ranks[r].changes.at(shard);  // as the copy lands
            return dcr::Status::OK();
          },
          [&](dcr::CanonicalChanges&& ch) {
            const size_t w = dcr::DTypeSize(layout->tensors[ch.tensor].dtype);
            mask.resize(ch.base.size());
            for (size_t i = 0; i < mask.size(); ++i) {
              mask[i] = ch.base[i] ^ ch.target[i];
            }
            digests[ch.tensor] ^= dcr::LinearHashElements(
                0, w, ch.positions.data(), ch.positions.size(), mask.data());
            return dcr::Status::OK();
          });
      ranks[r].gpu_host_s.push_back(
          std::chrono::duration<double>(Clock::now() - t0).count());
      if (!ps.ok()) return Fail(ps);
      if (digests != *h) {
        std::fprintf(stderr,
                     "rank %u: the updated digests are not the "
                     "target's\n",
                     r);
        return 1;
      }
    }
    ratio.push_back(sum / gs);
  }
  if (changed_all != gathered.changed) {
    std::fprintf(stderr,
                 "the ranks produced %llu changes, the gathered diff %llu\n",
                 static_cast<unsigned long long>(changed_all),
                 static_cast<unsigned long long>(gathered.changed));
    return 1;
  }

  nlohmann::json j;
  std::printf("%-10s %14s %12s %10s %10s\n", "producer", "bytes read",
              "changes", "seconds", "GB/s");
  const double g = Median(gathered_s);
  std::printf("%-10s %14llu %12llu %10.3f %10.2f\n", "gathered",
              static_cast<unsigned long long>(gathered.shard_bytes_read),
              static_cast<unsigned long long>(gathered.changed), g,
              gathered.shard_bytes_read / 2 / g / 1e9);
  j["gathered"] = {{"bytes_read", gathered.shard_bytes_read},
                   {"changes", gathered.changed},
                   {"seconds", g}};
  for (uint32_t r = 0; r < layout->ranks(); ++r) {
    const Rank& x = ranks[r];
    const double s = Median(x.seconds);
    std::printf("rank %-5u %14llu %12llu %10.3f %10.2f\n", r,
                static_cast<unsigned long long>(x.stats.shard_bytes_read),
                static_cast<unsigned long long>(x.stats.changed), s,
                x.stats.shard_bytes_read / 2 / s / 1e9);
    j["ranks"].push_back({{"rank", r},
                          {"bytes_read", x.stats.shard_bytes_read},
                          {"changes", x.stats.changed},
                          {"seconds", s}});
  }
  std::printf(
      "all ranks' time over the gathered diff's (same rounds, one core): "
      "%.2f\n",
      Median(ratio));
  std::printf(
      "\nhost CPU per step: the host producer (diff + hash of the "
      "target) against a rank\nwhose shards live on a GPU (projection "
      "of the changes + digest update)\n");
  std::printf("%-10s %12s %12s %8s\n", "producer", "host s", "GPU's host s",
              "ratio");
  for (uint32_t r = 0; r < layout->ranks(); ++r) {
    const double a = Median(ranks[r].host_step_s);
    const double b = Median(ranks[r].gpu_host_s);
    std::printf("rank %-5u %12.3f %12.3f %8.2f\n", r, a, b, b / a);
    j["ranks"][r]["host_step_seconds"] = a;
    j["ranks"][r]["gpu_resident_host_seconds"] = b;
  }
  j["ranks_over_gathered"] = Median(ratio);
  j["layout"] = layout_path;
  j["rounds"] = rounds;
  std::ofstream(out) << j.dump(2) << "\n";
  std::printf("wrote %s\n", out.c_str());
  return 0;
}
