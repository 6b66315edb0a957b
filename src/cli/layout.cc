// `dcr layout check` validates a placement layout (docs/PLACEMENT.md) and
// shows what each trainer rank holds and produces; `dcr layout verify`
// checks trainer shards against a canonical checkpoint through it.
#include "dcr/layout.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/cli_common.h"
#include "common/bytes.h"
#include "dcr/checkpoint.h"
#include "dcr/receiver_map.h"
#include "dcr/shard_delta.h"
#include "dcr/shard_diff.h"

namespace dcr::cli {
namespace {

using nlohmann::ordered_json;

uint64_t Volume(const Shape& s) {
  uint64_t n = 1;
  for (uint64_t d : s) n *= d;
  return n;
}

struct RankSummary {
  uint32_t rank = 0, tp = 0, ep = 0, pp = 0;
  size_t shards = 0;
  uint64_t shard_bytes = 0;
  uint64_t produced = 0;  // canonical elements this rank produces
};

// One pass over the pieces, whatever the number of ranks.
std::vector<RankSummary> Summarize(const Layout& l) {
  std::vector<RankSummary> out(l.ranks());
  std::vector<std::map<std::string, uint64_t>> shards(l.ranks());  // bytes
  for (const LayoutTensor& t : l.tensors) {
    for (const AffinePiece& p : t.pieces) {
      out[p.rank].produced += Volume(p.extent);
      shards[p.rank][p.shard] =
          Volume(p.shard_shape) * DTypeSize(t.conversion.shard_dtype);
    }
  }
  for (uint32_t r = 0; r < l.ranks(); ++r) {
    RankSummary& s = out[r];
    s.rank = r;
    s.tp = r % l.tp;
    s.ep = r / l.tp % l.ep;
    s.pp = r / (l.tp * l.ep);
    s.shards = shards[r].size();
    for (const auto& [name, bytes] : shards[r]) s.shard_bytes += bytes;
  }
  return out;
}

// The pieces rank `rank` holds, by shard, with their canonical tensors;
// with a serving rank's map `m` (of `l`'s file), also the boxes of its
// per-tensor FP8 codes, which its view maps into whole-tensor shadows.
std::map<std::string,
         std::vector<std::pair<const LayoutTensor*, const AffinePiece*>>>
PiecesOf(const Layout& l, uint32_t rank, const ReceiverMap* m = nullptr) {
  std::map<std::string,
           std::vector<std::pair<const LayoutTensor*, const AffinePiece*>>>
      out;
  for (const LayoutTensor& t : l.tensors) {
    for (const AffinePiece& p : t.pieces) {
      if (p.rank == rank) out[p.shard].emplace_back(&t, &p);
    }
  }
  if (m != nullptr) {
    for (const auto& [tensor, boxes] : m->fp8_boxes()) {
      for (const AffinePiece& p : boxes) {
        out[p.shard].emplace_back(&l.tensors[tensor], &p);
      }
    }
  }
  return out;
}

// The tensors each rank keeps: the shards a producer reads, or with
// `serving`, what a serving rank holds (copies; FP8 codes, scales and
// shadows).
Result<std::vector<std::map<std::string, LayoutShard>>> KeptShards(
    const Layout& l, bool serving) {
  std::vector<std::map<std::string, LayoutShard>> out;
  for (uint32_t r = 0; r < l.ranks(); ++r) {
    if (!serving) {
      out.push_back(l.ShardsOf(r));
      continue;
    }
    DCR_ASSIGN_OR_RETURN(ReceiverMap m, ReceiverMap::Create(l, r));
    out.push_back(m.shards());
  }
  return out;
}

int RunCheck(const GlobalOptions& g, const std::string& path,
             std::optional<uint32_t> rank, bool serving) {
  // The fingerprint is the file's, as dcr-traingen stamps it; the figures
  // are of the ranks as they hold it.
  auto file = LoadLayout(path);
  Result<Layout> l = file.ok() && serving ? ServingView(*file) : file;
  Result<std::vector<std::map<std::string, LayoutShard>>> kept =
      l.ok() ? KeptShards(*file, serving) : l.status();
  if (!kept.ok()) {
    if (g.format() == OutputFormat::kJson) {
      std::printf("%s\n", ordered_json{{"file", path},
                                       {"valid", false},
                                       {"error", kept.status().message()}}
                              .dump(2)
                              .c_str());
    }
    return ReportError(kept.status());
  }
  if (rank && *rank >= l->ranks()) {
    return ReportError(Status::InvalidArgument(fmt::format(
        "--rank {}: the layout has ranks 0-{}", *rank, l->ranks() - 1)));
  }
  uint64_t elements = 0, bytes = 0;
  for (const LayoutTensor& t : l->tensors) {
    elements += Volume(t.shape);
    bytes += Volume(t.shape) * DTypeSize(t.dtype);
  }
  std::vector<RankSummary> ranks = Summarize(*l);
  for (RankSummary& x : ranks) {
    x.shards = (*kept)[x.rank].size();
    x.shard_bytes = 0;
    for (const auto& [name, shard] : (*kept)[x.rank]) {
      x.shard_bytes += Volume(shard.shape) * DTypeSize(shard.dtype);
    }
  }
  const Digest128 fp = file->Fingerprint();
  // A serving rank's map, for the boxes of its per-tensor FP8 codes.
  std::optional<ReceiverMap> map;
  if (serving && rank) {
    auto m = ReceiverMap::Create(*file, *rank);
    if (!m.ok()) return ReportError(m.status());
    map = *std::move(m);
  }

  if (g.format() == OutputFormat::kJson) {
    ordered_json j{{"file", path},
                   {"valid", true},
                   {"fingerprint", fp.ToHex()},
                   {"ranks", l->ranks()},
                   {"tp", l->tp},
                   {"pp", l->pp},
                   {"ep", l->ep},
                   {"layers", l->layers},
                   {"experts", l->experts},
                   {"tensors", l->tensors.size()},
                   {"elements", elements},
                   {"bytes", bytes}};
    ordered_json per = ordered_json::array();
    for (const RankSummary& s : ranks) {
      per.push_back(
          {{"rank", s.rank},
           {"tp_rank", s.tp},
           {"ep_rank", s.ep},
           {"pp_rank", s.pp},
           {"shards", s.shards},
           {"shard_bytes", s.shard_bytes},
           {serving ? "held_elements" : "produced_elements", s.produced}});
    }
    j["per_rank"] = per;
    if (rank) {
      ordered_json shards = ordered_json::array();
      const auto pieces = PiecesOf(*l, *rank, map ? &*map : nullptr);
      for (const auto& [name, shard] : (*kept)[*rank]) {
        ordered_json feeds = ordered_json::array();
        auto fed = pieces.find(name);  // none for FP8 scales
        if (fed != pieces.end()) {
          for (const auto& [t, p] : fed->second) {
            feeds.push_back({{"tensor", t->name},
                             {"from", p->from},
                             {"extent", p->extent},
                             {"to", p->to},
                             {"axis", p->axis},
                             {"step", p->step}});
          }
        }
        shards.push_back({{"name", name},
                          {"shape", shard.shape},
                          {"dtype", DTypeName(shard.dtype)},
                          {"feeds", feeds}});
      }
      j["rank"] = *rank;
      j["shards"] = shards;
    }
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }

  std::printf(
      "%s: valid: %u ranks (tp %u x ep %u x pp %u), %zu canonical tensors, "
      "%s elements, %s\nfingerprint %s\n",
      path.c_str(), l->ranks(), l->tp, l->ep, l->pp, l->tensors.size(),
      fmt::format("{}", elements).c_str(), HumanBytes(bytes).c_str(),
      fp.ToHex().c_str());
  if (rank) {
    std::printf("\nrank %u holds:\n", *rank);
    const auto pieces = PiecesOf(*l, *rank, map ? &*map : nullptr);
    for (const auto& [name, shard] : (*kept)[*rank]) {
      std::printf("  %s %s %s\n", name.c_str(),
                  std::string(DTypeName(shard.dtype)).c_str(),
                  ShapeText(shard.shape).c_str());
      auto fed = pieces.find(name);  // none for FP8 scales
      if (fed == pieces.end()) continue;
      for (const auto& [t, p] : fed->second) {
        std::printf("    -> %s: box %s + %s at %s\n", t->name.c_str(),
                    ShapeText(p->from).c_str(), ShapeText(p->extent).c_str(),
                    ShapeText(p->to).c_str());
      }
    }
    return kExitOk;
  }
  std::printf("\n%-6s %-4s %-4s %-4s %7s %12s %16s\n", "rank", "tp", "ep", "pp",
              "shards", "shard bytes",
              serving ? "holds (elem)" : "produces (elem)");
  for (const RankSummary& s : ranks) {
    std::printf("%-6u %-4u %-4u %-4u %7zu %12s %16s\n", s.rank, s.tp, s.ep,
                s.pp, s.shards, HumanBytes(s.shard_bytes).c_str(),
                fmt::format("{}", s.produced).c_str());
  }
  return kExitOk;
}

std::string Hex(std::span<const std::byte> b) {
  std::string out = "0x";
  for (size_t i = b.size(); i-- > 0;) {
    out += fmt::format("{:02x}", static_cast<unsigned>(b[i]));
  }
  return out;
}

// A serving rank's shard file against the canonical tensors: its shards
// and FP8 shadows hold the canonical bits where the layout maps them, and
// its FP8 codes and scales are the quantizer's of the canonical tensors.
Result<std::vector<ShardMismatch>> CompareServingRank(
    const Layout& layout, uint32_t rank, const std::string& file,
    const CanonicalBytes& canonical) {
  DCR_ASSIGN_OR_RETURN(ReceiverMap m, ReceiverMap::Create(layout, rank));
  DCR_ASSIGN_OR_RETURN(auto ckpt,
                       Checkpoint::Open(file, Checkpoint::Mode::kReadOnly));
  ShardBytes held;
  for (const auto& [name, shard] : m.shards()) {
    const int64_t i = ckpt->manifest().Find(name);
    if (i < 0) {
      return Status::NotFound(
          fmt::format("{}: no tensor '{}', which serving rank {} of {} holds",
                      file, name, rank, layout.source));
    }
    const TensorInfo& t = ckpt->manifest()[static_cast<size_t>(i)];
    if (t.dtype != shard.dtype || t.shape != shard.shape) {
      return Status::InvalidArgument(fmt::format(
          "{}: tensor '{}' is {} {}, but serving rank {} of {} holds {} {}",
          file, name, DTypeName(t.dtype), ShapeText(t.shape), rank,
          layout.source, DTypeName(shard.dtype), ShapeText(shard.shape)));
    }
    held.emplace(name, ckpt->TensorData(static_cast<size_t>(i)));
  }
  DCR_ASSIGN_OR_RETURN(ShardBytes shadows, m.Shadows(held));
  DCR_ASSIGN_OR_RETURN(std::vector<ShardMismatch> out,
                       CompareShards(m.held(), rank, shadows, canonical));
  if (!m.serves_fp8()) return out;
  DCR_ASSIGN_OR_RETURN(auto built, m.Build(canonical));
  auto compare = [&](const std::string& name, size_t w) {
    std::span<const std::byte> got = held.at(name);
    const std::vector<std::byte>& want = built.at(name);
    ShardMismatch x;
    for (size_t e = 0; e * w < got.size(); ++e) {
      if (std::memcmp(&got[e * w], &want[e * w], w) == 0) continue;
      if (x.differing++ == 0) {
        x.shard = name;
        x.tensor = name + " as quantized from the canonical tensors";
        x.shard_element = x.element = e;
        x.shard_hex = Hex(got.subspan(e * w, w));
        x.canonical_hex = Hex(std::span(want).subspan(e * w, w));
      }
    }
    if (x.differing != 0) out.push_back(std::move(x));
  };
  for (const auto& [name, f] : m.fp8_shards()) {
    compare(name, 1);
    compare(f.scales, sizeof(float));
  }
  return out;
}

// `layout verify`, and `dcr verify --layout` (`store`: the file of rank
// `only`, a serving rank's store; empty: the ranks' files in shards_dir).
int RunVerify(const GlobalOptions& g, const std::string& path,
              const std::string& shards_dir, const std::string& canonical_path,
              std::optional<uint32_t> only, bool serving,
              const std::string& store = "") {
  auto l = LoadLayout(path);
  if (!l.ok()) return ReportError(l.status());
  if (only && *only >= l->ranks()) {
    return ReportError(Status::InvalidArgument(fmt::format(
        "--rank {}: the layout has ranks 0-{}", *only, l->ranks() - 1)));
  }
  auto ckpt = Checkpoint::Open(canonical_path, Checkpoint::Mode::kReadOnly);
  if (!ckpt.ok()) return ReportError(ckpt.status());
  // Every canonical tensor the layout places: in the checkpoint, with the
  // layout's dtype and shape.
  CanonicalBytes canonical;
  const Manifest& m = (*ckpt)->manifest();
  for (const LayoutTensor& t : l->tensors) {
    int64_t i = m.Find(t.name);
    if (i < 0) {
      return ReportError(Status::NotFound(
          fmt::format("{}: no tensor '{}', which layout {} places",
                      canonical_path, t.name, path)));
    }
    const TensorInfo& info = m[static_cast<size_t>(i)];
    if (info.dtype != t.dtype || info.shape != t.shape) {
      return ReportError(Status::InvalidArgument(fmt::format(
          "{}: tensor '{}' is {} {}, but layout {} says {} {}", canonical_path,
          t.name, DTypeName(info.dtype), ShapeText(info.shape), path,
          DTypeName(t.dtype), ShapeText(t.shape))));
    }
    canonical.emplace(t.name, (*ckpt)->TensorData(static_cast<size_t>(i)));
  }
  ordered_json ranks = ordered_json::array();
  uint64_t differing = 0;
  for (uint32_t r = 0; r < l->ranks(); ++r) {
    if (only && r != *only) continue;
    Result<std::vector<ShardMismatch>> mm =
        serving
            ? CompareServingRank(
                  *l, r, store.empty() ? ShardFilePath(shards_dir, r) : store,
                  canonical)
            : [&]() -> Result<std::vector<ShardMismatch>> {
      DCR_ASSIGN_OR_RETURN(RankShards shards,
                           RankShards::Open(*l, r, shards_dir));
      return CompareShards(*l, r, shards.bytes(), canonical);
    }();
    if (!mm.ok()) return ReportError(mm.status());
    ordered_json bad = ordered_json::array();
    for (const ShardMismatch& x : *mm) {
      differing += x.differing;
      bad.push_back({{"shard", x.shard},
                     {"shard_element", x.shard_element},
                     {"tensor", x.tensor},
                     {"element", x.element},
                     {"shard_bits", x.shard_hex},
                     {"canonical_bits", x.canonical_hex},
                     {"differing_elements", x.differing}});
      if (g.format() == OutputFormat::kText) {
        std::printf(
            "rank %u shard '%s' element %llu holds %s, but '%s' element "
            "%llu is %s (%llu elements of the shard differ)\n",
            r, x.shard.c_str(),
            static_cast<unsigned long long>(x.shard_element),
            x.shard_hex.c_str(), x.tensor.c_str(),
            static_cast<unsigned long long>(x.element), x.canonical_hex.c_str(),
            static_cast<unsigned long long>(x.differing));
      }
    }
    ranks.push_back({{"rank", r}, {"mismatches", bad}});
  }
  if (g.format() == OutputFormat::kJson) {
    std::printf("%s\n",
                ordered_json{{"layout", path},
                             {"shards", store.empty() ? shards_dir : store},
                             {"canonical", canonical_path},
                             {"identical", differing == 0},
                             {"differing_elements", differing},
                             {"ranks", ranks}}
                    .dump(2)
                    .c_str());
  } else if (differing == 0) {
    std::printf("identical: every element the layout maps matches %s\n",
                canonical_path.c_str());
  }
  return differing == 0 ? kExitOk : kExitFailed;
}

}  // namespace

int VerifyServingStore(const GlobalOptions& g, const std::string& layout,
                       uint32_t rank, const std::string& store,
                       const std::string& canonical) {
  return RunVerify(g, layout, "", canonical, rank, /*serving=*/true, store);
}

int InspectServingStore(const GlobalOptions& g, const std::string& layout,
                        uint32_t rank, const std::string& store) {
  auto l = LoadLayout(layout);
  if (!l.ok()) return ReportError(l.status());
  auto m = ReceiverMap::Create(*l, rank);
  if (!m.ok()) return ReportError(m.status());
  auto want = m->StoreManifest();
  if (!want.ok()) return ReportError(want.status());
  auto ckpt = Checkpoint::Open(store, Checkpoint::Mode::kReadOnly);
  if (!ckpt.ok()) return ReportError(ckpt.status());
  const Manifest& have = (*ckpt)->manifest();
  if (have.digest() != want->digest()) {
    return ReportError(Status::InvalidArgument(
        fmt::format("{} does not hold the shards of serving rank {} of {}: {}",
                    store, rank, layout, Manifest::Difference(*want, have))));
  }
  ShardBytes held;
  for (size_t i = 0; i < have.size(); ++i) {
    held.emplace(have[i].name, (*ckpt)->TensorData(i));
  }
  auto regions = m->HashRegions(held);
  if (!regions.ok()) return ReportError(regions.status());
  const Digest128 bits = m->BitsDigest(*regions);
  size_t holds = 0;
  for (uint32_t t = 0; t < l->tensors.size(); ++t) holds += m->Holds(t);
  if (g.format() == OutputFormat::kJson) {
    std::printf("%s\n",
                ordered_json{{"type", "serving store"},
                             {"path", store},
                             {"layout", layout},
                             {"layout_fingerprint", m->fingerprint().ToHex()},
                             {"rank", rank},
                             {"shards", have.size()},
                             {"bytes", have.TotalBytes()},
                             {"fp8_shards", m->fp8_shards().size()},
                             {"canonical_tensors", l->tensors.size()},
                             {"canonical_tensors_held", holds},
                             {"bits", bits.ToHex()}}
                    .dump(2)
                    .c_str());
    return kExitOk;
  }
  std::printf("serving store %s\n", store.c_str());
  std::printf("rank          %u of %s (layout %s, %u ranks)\n", rank,
              layout.c_str(), m->fingerprint().ShortHex().c_str(), l->ranks());
  std::printf("shards        %zu tensors, %s (%zu served as FP8)\n",
              have.size(), HumanBytes(have.TotalBytes()).c_str(),
              m->fp8_shards().size());
  std::printf("holds         %zu of %zu canonical tensors\n", holds,
              l->tensors.size());
  std::printf("bits          %s\n", bits.ToHex().c_str());
  return kExitOk;
}

void AddLayoutCommands(CLI::App* app, GlobalOptions* g, int* exit_code) {
  auto* layout = app->add_subcommand(
      "layout", "Check a placement layout: how trainer ranks hold the model");
  layout->require_subcommand(1);
  auto* cmd = layout->add_subcommand(
      "check", "Validate a layout file and show what each rank produces");
  auto path = std::make_shared<std::string>();
  auto rank = std::make_shared<std::optional<uint32_t>>();
  cmd->add_option("FILE", *path, "Layout YAML file")->required();
  cmd->add_option("--rank", *rank,
                  "List the shards this producer rank holds and the "
                  "canonical regions each one feeds");
  auto serving = std::make_shared<bool>(false);
  cmd->add_flag("--serving", *serving,
                "Read it as a serving layout: each rank also holds copies of "
                "replicated tensors (docs/PLACEMENT.md, receiver)");
  AddOutputOption(cmd, g);
  cmd->footer(
      "\nExit 0 if every canonical tensor is held exactly once; otherwise "
      "exit 2 with\nthe file, line, tensor and ranks in the error. Schema: "
      "docs/PLACEMENT.md.\n\nExamples:\n  dcr layout check "
      "layouts/llama3-8b-tp4-pp2.yaml\n  dcr layout check "
      "layouts/traingen-tp2-pp2.yaml --rank 3 -o json\n");
  cmd->callback([=] { *exit_code = RunCheck(*g, *path, *rank, *serving); });

  auto* verify = layout->add_subcommand(
      "verify",
      "Check that trainer shards hold a canonical checkpoint's bits where "
      "the layout says");
  auto vpath = std::make_shared<std::string>();
  auto shards = std::make_shared<std::string>();
  auto canonical = std::make_shared<std::string>();
  auto vrank = std::make_shared<std::optional<uint32_t>>();
  verify->add_option("FILE", *vpath, "Layout YAML file")->required();
  verify
      ->add_option("--shards", *shards,
                   "Directory of rank-RRRRR.safetensors shard files")
      ->required();
  verify
      ->add_option("--canonical", *canonical,
                   "The canonical checkpoint (.safetensors, index or "
                   "directory)")
      ->required();
  verify->add_option("--rank", *vrank, "Check this rank only");
  auto vserving = std::make_shared<bool>(false);
  verify->add_flag("--serving", *vserving,
                   "The shards are a server's: each rank holds copies of "
                   "replicated tensors too, and they are compared");
  AddOutputOption(verify, g);
  verify->footer(
      "\nEvery element a piece maps is compared, after the layout's "
      "conversion; padding\nis not. Exit 0 if all match, 1 with the first "
      "differing element of each shard\n(its shard and canonical "
      "coordinates and bits), 2 for a bad layout, a missing\nshard or a "
      "shard of another dtype or shape.\n\nExample:\n  dcr-traingen --out "
      "/tmp/ckpt --steps 1 --layout layouts/traingen-tp2-pp2.yaml\n  dcr "
      "layout verify layouts/traingen-tp2-pp2.yaml --shards "
      "/tmp/ckpt/v1.shards \\\n    --canonical /tmp/ckpt/v1.safetensors\n");
  verify->callback([=] {
    *exit_code = RunVerify(*g, *vpath, *shards, *canonical, *vrank, *vserving);
  });
}

}  // namespace dcr::cli
