// `dcr layout check`: validates a placement layout (docs/PLACEMENT.md) and
// shows what each trainer rank holds and produces.
#include "dcr/layout.h"

#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/cli_common.h"
#include "common/bytes.h"

namespace dcr::cli {
namespace {

using json = nlohmann::ordered_json;

uint64_t Volume(const Shape& s) {
  uint64_t n = 1;
  for (uint64_t d : s) n *= d;
  return n;
}

std::string ShapeText(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    out += (i ? ", " : "") + std::to_string(s[i]);
  }
  return out + "]";
}

struct RankSummary {
  uint32_t rank = 0, tp = 0, ep = 0, pp = 0;
  size_t shards = 0;
  uint64_t shard_bytes = 0;
  uint64_t produced = 0;  // canonical elements this rank produces
};

std::vector<RankSummary> Summarize(const Layout& l) {
  std::vector<RankSummary> out(l.ranks());
  for (uint32_t r = 0; r < l.ranks(); ++r) {
    RankSummary& s = out[r];
    s.rank = r;
    s.tp = r % l.tp;
    s.ep = r / l.tp % l.ep;
    s.pp = r / (l.tp * l.ep);
    for (const auto& [name, shard] : l.ShardsOf(r)) {
      ++s.shards;
      s.shard_bytes += Volume(shard.shape) * DTypeSize(shard.dtype);
    }
  }
  for (const LayoutTensor& t : l.tensors) {
    for (const AffinePiece& p : t.pieces)
      out[p.rank].produced += Volume(p.extent);
  }
  return out;
}

int RunCheck(const GlobalOptions& g, const std::string& path,
             std::optional<uint32_t> rank) {
  auto l = LoadLayout(path);
  if (!l.ok()) {
    if (g.format() == OutputFormat::kJson) {
      std::printf("%s\n", json{{"file", path},
                               {"valid", false},
                               {"error", l.status().message()}}
                              .dump(2)
                              .c_str());
    }
    return ReportError(l.status());
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
  const Digest128 fp = l->Fingerprint();

  if (g.format() == OutputFormat::kJson) {
    json j{{"file", path},
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
    json per = json::array();
    for (const RankSummary& s : ranks) {
      per.push_back({{"rank", s.rank},
                     {"tp_rank", s.tp},
                     {"ep_rank", s.ep},
                     {"pp_rank", s.pp},
                     {"shards", s.shards},
                     {"shard_bytes", s.shard_bytes},
                     {"produced_elements", s.produced}});
    }
    j["per_rank"] = per;
    if (rank) {
      json shards = json::array();
      for (const auto& [name, shard] : l->ShardsOf(*rank)) {
        json feeds = json::array();
        for (const LayoutTensor& t : l->tensors) {
          for (const AffinePiece& p : t.pieces) {
            if (p.rank == *rank && p.shard == name) {
              feeds.push_back({{"tensor", t.name},
                               {"from", p.from},
                               {"extent", p.extent},
                               {"to", p.to},
                               {"axis", p.axis},
                               {"step", p.step}});
            }
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
    for (const auto& [name, shard] : l->ShardsOf(*rank)) {
      std::printf("  %s %s %s\n", name.c_str(),
                  std::string(DTypeName(shard.dtype)).c_str(),
                  ShapeText(shard.shape).c_str());
      for (const LayoutTensor& t : l->tensors) {
        for (const AffinePiece& p : t.pieces) {
          if (p.rank != *rank || p.shard != name) continue;
          std::printf("    -> %s: box %s + %s at %s\n", t.name.c_str(),
                      ShapeText(p.from).c_str(), ShapeText(p.extent).c_str(),
                      ShapeText(p.to).c_str());
        }
      }
    }
    return kExitOk;
  }
  std::printf("\n%-6s %-4s %-4s %-4s %7s %12s %16s\n", "rank", "tp", "ep", "pp",
              "shards", "shard bytes", "produces (elem)");
  for (const RankSummary& s : ranks) {
    std::printf("%-6u %-4u %-4u %-4u %7zu %12s %16s\n", s.rank, s.tp, s.ep,
                s.pp, s.shards, HumanBytes(s.shard_bytes).c_str(),
                fmt::format("{}", s.produced).c_str());
  }
  return kExitOk;
}

}  // namespace

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
  AddOutputOption(cmd, g);
  cmd->footer(
      "\nExit 0 if every canonical tensor is held exactly once; otherwise "
      "exit 2 with\nthe file, line, tensor and ranks in the error. Schema: "
      "docs/PLACEMENT.md.\n\nExamples:\n  dcr layout check "
      "layouts/llama3-8b-tp4-pp2.yaml\n  dcr layout check "
      "layouts/traingen-tp2-pp2.yaml --rank 3 -o json\n");
  cmd->callback([=] { *exit_code = RunCheck(*g, *path, *rank); });
}

}  // namespace dcr::cli
