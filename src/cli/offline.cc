// The offline subcommands: diff, apply, verify, inspect.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/cli_common.h"
#include "common/bytes.h"
#include "common/file.h"
#include "common/progress.h"
#include "dcr/checkpoint.h"
#include "dcr/delta.h"
#include "dcr/layout.h"
#include "dcr/shard_delta.h"

namespace dcr::cli {
namespace {

using nlohmann::ordered_json;

// --layout and --rank of verify and inspect: the file `what` names is a
// serving relay's store, rank --rank of the serving layout --layout.
struct ServingStoreOptions {
  std::string layout;
  std::optional<uint32_t> rank;
  // Whether the file is a serving store; InvalidArgument unless both or
  // neither are given.
  Result<bool> Given(const char* what) const {
    if (layout.empty() != !rank) {
      return Status::InvalidArgument(fmt::format(
          "give --layout and --rank together: the serving layout and the "
          "rank whose store {} is",
          what));
    }
    return !layout.empty();
  }
};
std::shared_ptr<ServingStoreOptions> AddServingStoreOptions(
    CLI::App* cmd, const char* what, const std::string& does) {
  auto o = std::make_shared<ServingStoreOptions>();
  cmd->add_option("--layout", o->layout,
                  fmt::format("{} is serving rank --rank of this serving "
                              "layout (a serving relay's store): {}",
                              what, does));
  cmd->add_option("--rank", o->rank,
                  fmt::format("With --layout: {}'s rank", what));
  return o;
}

void PrintJson(const ordered_json& j) {
  std::printf("%s\n", j.dump(2).c_str());
}

// Step number recorded by the trainer in the safetensors metadata.
std::optional<uint64_t> MetadataStep(const Checkpoint& c) {
  auto it = c.metadata().find("dcr.step");
  if (it == c.metadata().end()) return std::nullopt;
  try {
    size_t used = 0;
    uint64_t v = std::stoull(it->second, &used);
    if (used == it->second.size()) return v;
  } catch (const std::exception&) {
  }
  spdlog::warn("{}: ignoring metadata dcr.step='{}' (not a number)", c.path(),
               it->second);
  return std::nullopt;
}

double Ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

ordered_json SizesJson(const ChunkSizes& s) {
  return ordered_json{{"header_bytes", s.header},
                      {"position_bytes", s.positions},
                      {"value_bytes", s.values},
                      {"payload_bytes", s.total()}};
}

ordered_json VersionJson(const Version& v) {
  return ordered_json{{"step", v.step}, {"digest", v.digest.ToHex()}};
}

void PrintDeltaText(const DeltaStats& s, const std::string& path) {
  const DeltaHeader& h = s.header;
  std::printf("delta        %s\n", path.c_str());
  std::printf("base         step %llu  %s\n",
              static_cast<unsigned long long>(h.base.step),
              h.base.digest.ToHex().c_str());
  std::printf("target       step %llu  %s\n",
              static_cast<unsigned long long>(h.target.step),
              h.target.digest.ToHex().c_str());
  std::printf("manifest     %s (%llu tensors)\n", h.manifest.ToHex().c_str(),
              static_cast<unsigned long long>(h.tensor_count));
  std::printf("kind         %s\n", h.all_overwrite ? "overwrite" : "xor");
  std::printf("changed      %llu of %llu elements (%.3f%%)\n",
              static_cast<unsigned long long>(h.changed_elements),
              static_cast<unsigned long long>(h.total_elements),
              100.0 * Ratio(h.changed_elements, h.total_elements));
  std::printf(
      "chunks       %llu (%llu sparse, %llu dense), span %llu elements\n",
      static_cast<unsigned long long>(s.chunks),
      static_cast<unsigned long long>(s.sparse_chunks),
      static_cast<unsigned long long>(s.dense_chunks),
      static_cast<unsigned long long>(h.span_elems));
  std::printf("bytes        positions %s, values %s, headers %s\n",
              HumanBytes(s.sizes.positions).c_str(),
              HumanBytes(s.sizes.values).c_str(),
              HumanBytes(s.sizes.header).c_str());
  std::printf("file         %s for a %s checkpoint (%.1fx smaller)\n",
              HumanBytes(s.file_bytes).c_str(),
              HumanBytes(h.total_bytes).c_str(),
              Ratio(h.total_bytes, s.file_bytes));
}

ordered_json DeltaJson(const DeltaStats& s, const std::string& path) {
  const DeltaHeader& h = s.header;
  ordered_json j{{"type", "delta"},
                 {"path", path},
                 {"base", VersionJson(h.base)},
                 {"target", VersionJson(h.target)},
                 {"manifest_digest", h.manifest.ToHex()},
                 {"kind", h.all_overwrite ? "overwrite" : "xor"},
                 {"tensors", h.tensor_count},
                 {"span_elems", h.span_elems},
                 {"total_elements", h.total_elements},
                 {"checkpoint_bytes", h.total_bytes},
                 {"changed_elements", h.changed_elements},
                 {"change_rate", Ratio(h.changed_elements, h.total_elements)},
                 {"chunks", s.chunks},
                 {"sparse_chunks", s.sparse_chunks},
                 {"dense_chunks", s.dense_chunks},
                 {"file_bytes", s.file_bytes},
                 {"seconds", s.seconds}};
  j["sections"] = SizesJson(s.sizes);
  return j;
}

int RunDiff(const GlobalOptions& g, const std::string& base_path,
            const std::string& target_path, const std::string& out_path,
            bool overwrite, uint64_t span_elems, int level,
            std::optional<uint64_t> base_step,
            std::optional<uint64_t> target_step) {
  auto base = Checkpoint::Open(base_path, Checkpoint::Mode::kReadOnly);
  if (!base.ok()) return ReportError(base.status());
  auto target = Checkpoint::Open(target_path, Checkpoint::Mode::kReadOnly);
  if (!target.ok()) return ReportError(target.status());
  DiffOptions opt;
  opt.kind = overwrite ? ChunkKind::kOverwrite : ChunkKind::kXor;
  opt.span_elems = span_elems;
  opt.encode.zstd_level = level;
  opt.base_step = base_step.value_or(MetadataStep(**base).value_or(0));
  opt.target_step =
      target_step.value_or(MetadataStep(**target).value_or(opt.base_step + 1));
  auto pool = MakePool(g);
  Progress progress("diff", (*target)->manifest().TotalBytes(),
                    g.ShowProgress());
  opt.progress = [&](uint64_t n) { progress.Add(n); };
  auto stats = WriteDelta(**base, **target, out_path, opt, pool.get());
  progress.Finish();
  if (!stats.ok()) return ReportError(stats.status());
  spdlog::debug("diff took {:.2f}s", stats->seconds);
  if (g.format() == OutputFormat::kJson) {
    PrintJson(DeltaJson(*stats, out_path));
  } else {
    PrintDeltaText(*stats, out_path);
    std::printf("time         %.2fs (%s/s)\n", stats->seconds,
                HumanBytes(static_cast<uint64_t>(
                               Ratio(stats->checkpoint_bytes, stats->seconds)))
                    .c_str());
  }
  return kExitOk;
}

// dcr diff --layout: the delta from the ranks' shard files.
int RunDiffFromShards(const GlobalOptions& g, const std::string& layout_path,
                      const std::string& base_dir,
                      const std::string& target_dir,
                      const std::string& out_path, bool overwrite,
                      uint64_t span_elems, int level,
                      std::optional<uint64_t> base_step,
                      std::optional<uint64_t> target_step) {
  auto layout = LoadLayout(layout_path);
  if (!layout.ok()) return ReportError(layout.status());
  DiffOptions opt;
  opt.kind = overwrite ? ChunkKind::kOverwrite : ChunkKind::kXor;
  opt.span_elems = span_elems;
  opt.encode.zstd_level = level;
  // Steps as the canonical diff takes them: the dcr.step metadata of the
  // shard files (rank 0's), else 0 and base + 1.
  auto step_of = [](const std::string& dir) -> std::optional<uint64_t> {
    auto f =
        Checkpoint::Open(ShardFilePath(dir, 0), Checkpoint::Mode::kReadOnly);
    return f.ok() ? MetadataStep(**f) : std::nullopt;
  };
  opt.base_step = base_step.value_or(step_of(base_dir).value_or(0));
  opt.target_step =
      target_step.value_or(step_of(target_dir).value_or(opt.base_step + 1));
  auto pool = MakePool(g);
  // Progress in target shard bytes, a rank at a time.
  uint64_t total = 0;
  for (uint32_t r = 0; r < layout->ranks(); ++r) {
    for (const auto& [name, shard] : layout->ShardsOf(r)) {
      uint64_t n = DTypeSize(shard.dtype);
      for (uint64_t d : shard.shape) n *= d;
      total += n;
    }
  }
  Progress progress("diff", total, g.ShowProgress());
  opt.progress = [&](uint64_t n) { progress.Add(n); };
  auto stats = WriteDeltaFromShards(*layout, base_dir, target_dir, out_path,
                                    opt, pool.get());
  progress.Finish();
  if (!stats.ok()) return ReportError(stats.status());
  if (g.format() == OutputFormat::kJson) {
    ordered_json j = DeltaJson(*stats, out_path);
    j["layout"] = layout_path;
    j["producers"] = layout->ranks();
    PrintJson(j);
  } else {
    PrintDeltaText(*stats, out_path);
    std::printf("producers    %u (layout %s), %.2fs\n", layout->ranks(),
                layout_path.c_str(), stats->seconds);
  }
  return kExitOk;
}

int RunApply(const GlobalOptions& g, const std::string& delta_path,
             const std::string& target_path) {
  auto target = Checkpoint::Open(target_path, Checkpoint::Mode::kReadWrite);
  if (!target.ok()) return ReportError(target.status());
  auto pool = MakePool(g);
  Progress progress("apply", (*target)->manifest().TotalBytes(),
                    g.ShowProgress());
  auto stats = ApplyDelta(delta_path, target->get(), pool.get(),
                          [&](uint64_t n) { progress.Add(n); });
  progress.Finish();
  if (!stats.ok()) return ReportError(stats.status());
  const DeltaHeader& h = stats->header;
  if (g.format() == OutputFormat::kJson) {
    PrintJson(ordered_json{{"target", target_path},
                           {"delta", delta_path},
                           {"from", VersionJson(h.base)},
                           {"to", VersionJson(h.target)},
                           {"chunks", stats->chunks},
                           {"changed_elements", h.changed_elements},
                           {"seconds", stats->seconds}});
  } else {
    std::printf(
        "applied %s to %s: step %llu -> %llu, %llu chunks, %llu "
        "elements changed, digest %s verified (%.2fs)\n",
        delta_path.c_str(), target_path.c_str(),
        static_cast<unsigned long long>(h.base.step),
        static_cast<unsigned long long>(h.target.step),
        static_cast<unsigned long long>(stats->chunks),
        static_cast<unsigned long long>(h.changed_elements),
        h.target.digest.ShortHex().c_str(), stats->seconds);
  }
  return kExitOk;
}

int RunVerify(const GlobalOptions& g, const std::string& a_path,
              const std::string& b_path) {
  auto a = Checkpoint::Open(a_path, Checkpoint::Mode::kReadOnly);
  if (!a.ok()) return ReportError(a.status());
  auto b = Checkpoint::Open(b_path, Checkpoint::Mode::kReadOnly);
  if (!b.ok()) return ReportError(b.status());
  auto pool = MakePool(g);
  std::vector<Mismatch> diffs = CompareCheckpoints(**a, **b, pool.get());
  if (g.format() == OutputFormat::kJson) {
    ordered_json j{{"identical", diffs.empty()}, {"a", a_path}, {"b", b_path}};
    ordered_json list = ordered_json::array();
    for (const auto& d : diffs) {
      if (!d.manifest_difference.empty()) {
        j["manifest_difference"] = d.manifest_difference;
        continue;
      }
      list.push_back(
          ordered_json{{"tensor", d.tensor},
                       {"first_element", d.element},
                       {"a", d.a_hex},
                       {"b", d.b_hex},
                       {"differing_elements", d.differing_elements}});
    }
    j["differences"] = list;
    PrintJson(j);
  } else if (diffs.empty()) {
    std::printf(
        "identical: %s and %s hold the same %llu tensors, bit for bit\n",
        a_path.c_str(), b_path.c_str(),
        static_cast<unsigned long long>((*a)->manifest().size()));
  } else {
    for (const auto& d : diffs) {
      if (!d.manifest_difference.empty()) {
        std::printf("different tensors: %s\n", d.manifest_difference.c_str());
        continue;
      }
      std::printf(
          "differs: %s: %llu elements differ; first at element %llu "
          "(%s vs %s)\n",
          d.tensor.c_str(),
          static_cast<unsigned long long>(d.differing_elements),
          static_cast<unsigned long long>(d.element), d.a_hex.c_str(),
          d.b_hex.c_str());
    }
  }
  return diffs.empty() ? kExitOk : kExitFailed;
}

bool LooksLikeDelta(const std::string& path) {
  if (std::filesystem::is_directory(path)) return false;
  auto f = MappedFile::Open(path, MappedFile::Mode::kReadOnly);
  if (!f.ok() || (*f)->size() < 8) return false;
  return std::memcmp((*f)->data().data(), "DCRDELTA", 8) == 0;
}

int RunInspect(const GlobalOptions& g, const std::string& path,
               bool list_tensors) {
  auto pool = MakePool(g);
  if (LooksLikeDelta(path)) {
    auto stats = InspectDelta(path, pool.get());
    if (!stats.ok()) return ReportError(stats.status());
    if (g.format() == OutputFormat::kJson) {
      PrintJson(DeltaJson(*stats, path));
    } else {
      PrintDeltaText(*stats, path);
    }
    return kExitOk;
  }
  auto c = Checkpoint::Open(path, Checkpoint::Mode::kReadOnly);
  if (!c.ok()) return ReportError(c.status());
  const Manifest& m = (*c)->manifest();
  CheckpointDigests d = (*c)->ComputeDigests(pool.get());
  std::map<std::string, std::pair<uint64_t, uint64_t>> by_dtype;
  for (const auto& t : m.tensors()) {
    auto& e = by_dtype[std::string(DTypeName(t.dtype))];
    ++e.first;
    e.second += t.NumBytes();
  }
  auto step = MetadataStep(**c);
  if (g.format() == OutputFormat::kJson) {
    ordered_json j{{"type", "checkpoint"},
                   {"path", path},
                   {"tensors", m.size()},
                   {"elements", m.TotalElements()},
                   {"bytes", m.TotalBytes()},
                   {"version_digest", d.version.ToHex()},
                   {"manifest_digest", d.manifest.ToHex()}};
    if (step) j["step"] = *step;
    ordered_json dt = ordered_json::object();
    for (const auto& [name, e] : by_dtype) {
      dt[name] = ordered_json{{"tensors", e.first}, {"bytes", e.second}};
    }
    j["dtypes"] = dt;
    j["metadata"] = (*c)->metadata();
    if (list_tensors) {
      ordered_json list = ordered_json::array();
      for (size_t i = 0; i < m.size(); ++i) {
        list.push_back(ordered_json{{"name", m[i].name},
                                    {"dtype", DTypeName(m[i].dtype)},
                                    {"shape", m[i].shape},
                                    {"bytes", m[i].NumBytes()},
                                    {"digest", d.tensors[i].ToHex()},
                                    {"file", (*c)->FileOf(i)}});
      }
      j["tensor_list"] = list;
    }
    PrintJson(j);
    return kExitOk;
  }
  std::printf("checkpoint   %s\n", path.c_str());
  std::printf("tensors      %zu (%llu elements, %s)\n", m.size(),
              static_cast<unsigned long long>(m.TotalElements()),
              HumanBytes(m.TotalBytes()).c_str());
  for (const auto& [name, e] : by_dtype) {
    std::printf("  %-10s %llu tensors, %s\n", name.c_str(),
                static_cast<unsigned long long>(e.first),
                HumanBytes(e.second).c_str());
  }
  if (step) {
    std::printf("step         %llu\n", static_cast<unsigned long long>(*step));
  }
  std::printf("version      %s\n", d.version.ToHex().c_str());
  std::printf("manifest     %s\n", d.manifest.ToHex().c_str());
  if (list_tensors) {
    for (size_t i = 0; i < m.size(); ++i) {
      std::string shape;
      for (size_t k = 0; k < m[i].shape.size(); ++k) {
        shape += (k ? ", " : "") + std::to_string(m[i].shape[k]);
      }
      std::printf("  %-48s %-8s [%s] %s\n", m[i].name.c_str(),
                  std::string(DTypeName(m[i].dtype)).c_str(), shape.c_str(),
                  d.tensors[i].ShortHex().c_str());
    }
  }
  return kExitOk;
}

}  // namespace

void AddOfflineCommands(CLI::App* app, GlobalOptions* g, int* exit_code) {
  // diff
  {
    auto* cmd = app->add_subcommand(
        "diff", "Write the delta that turns BASE into TARGET");
    auto base = std::make_shared<std::string>();
    auto target = std::make_shared<std::string>();
    auto out = std::make_shared<std::string>();
    auto overwrite = std::make_shared<bool>(false);
    auto span = std::make_shared<uint64_t>(kDefaultSpanElems);
    auto level = std::make_shared<int>(kDefaultZstdLevel);
    auto base_step = std::make_shared<std::optional<uint64_t>>();
    auto target_step = std::make_shared<std::optional<uint64_t>>();
    auto layout = std::make_shared<std::string>();
    auto base_shards = std::make_shared<std::string>();
    auto target_shards = std::make_shared<std::string>();
    cmd->add_option("BASE", *base,
                    "Base checkpoint: a .safetensors file or a directory with "
                    "model.safetensors.index.json");
    cmd->add_option("TARGET", *target, "Target checkpoint (same tensors)");
    cmd->add_option("--layout", *layout,
                    "Build the delta from trainer shards placed by this "
                    "layout (docs/PLACEMENT.md) instead of two checkpoints");
    cmd->add_option("--base-shards", *base_shards,
                    "With --layout: directory of the base's "
                    "rank-RRRRR.safetensors shard files");
    cmd->add_option("--target-shards", *target_shards,
                    "With --layout: directory of the target's shard files");
    cmd->add_option("-o,--out", *out, "Delta file to write (.dcr)")->required();
    cmd->add_flag("--overwrite", *overwrite,
                  "Carry new values instead of XOR masks (idempotent; larger)");
    cmd->add_option("--span-elems", *span,
                    "Elements per span, the unit of a chunk")
        ->check(CLI::Range(uint64_t{1}, kMaxSpanElems));
    cmd->add_option("--level", *level, "zstd level for value planes (1-19)")
        ->check(CLI::Range(1, 19));
    cmd->add_option("--base-step", *base_step,
                    "Step number of BASE (default: its dcr.step metadata, "
                    "else 0)");
    cmd->add_option("--target-step", *target_step,
                    "Step number of TARGET (default: its dcr.step metadata, "
                    "else base step + 1)");
    cmd->add_option("--format", g->output, "Summary format: text or json")
        ->check(CLI::IsMember({"text", "json"}));
    AddWorkOptions(cmd, g);
    cmd->footer(
        "\nExample:\n  dcr diff ckpt/v0.safetensors ckpt/v1.safetensors -o "
        "v1.dcr\n  dcr diff old/ new/ -o new.dcr --format json   # sharded "
        "checkpoints\n  dcr diff --layout layouts/traingen-tp2-pp2.yaml "
        "--base-shards ckpt/v0.shards \\\n      --target-shards "
        "ckpt/v1.shards -o v1.dcr   # from trainer ranks' shards\n");
    cmd->callback([=] {
      const bool shards = !layout->empty();
      if (shards && (base_shards->empty() || target_shards->empty() ||
                     !base->empty() || !target->empty())) {
        *exit_code = ReportError(Status::InvalidArgument(
            "--layout takes --base-shards DIR and --target-shards DIR "
            "instead of BASE and TARGET (see dcr diff --help)"));
        return;
      }
      if (!shards && (base->empty() || target->empty() ||
                      !base_shards->empty() || !target_shards->empty())) {
        *exit_code = ReportError(Status::InvalidArgument(
            "give BASE and TARGET checkpoints, or --layout L with "
            "--base-shards DIR and --target-shards DIR (see dcr diff "
            "--help)"));
        return;
      }
      *exit_code =
          shards ? RunDiffFromShards(*g, *layout, *base_shards, *target_shards,
                                     *out, *overwrite, *span, *level,
                                     *base_step, *target_step)
                 : RunDiff(*g, *base, *target, *out, *overwrite, *span, *level,
                           *base_step, *target_step);
    });
  }
  // apply
  {
    auto* cmd = app->add_subcommand(
        "apply",
        "Apply DELTA to TARGET in place, checking digests before "
        "and after");
    auto delta = std::make_shared<std::string>();
    auto target = std::make_shared<std::string>();
    cmd->add_option("DELTA", *delta, "Delta file (.dcr)")->required();
    cmd->add_option("TARGET", *target,
                    "Checkpoint holding the delta's base version; rewritten "
                    "in place")
        ->required();
    AddOutputOption(cmd, g);
    AddWorkOptions(cmd, g);
    cmd->footer(
        "\nTARGET must hold exactly the delta's base version; otherwise "
        "nothing is\nwritten and the exit code is 5. A corrupt delta is "
        "refused (exit 4) before\nanything is written.\n\nExample:\n  dcr "
        "apply v1.dcr /models/policy.safetensors\n");
    cmd->callback([=] { *exit_code = RunApply(*g, *delta, *target); });
  }
  // verify
  {
    auto* cmd = app->add_subcommand(
        "verify", "Exit 0 iff A and B hold identical canonical bits");
    auto a = std::make_shared<std::string>();
    auto b = std::make_shared<std::string>();
    cmd->add_option("A", *a, "Checkpoint (with --layout: a serving store)")
        ->required();
    cmd->add_option("B", *b, "Checkpoint")->required();
    auto serving = AddServingStoreOptions(
        cmd, "A",
        "compare what it holds, FP8 codes and scales included, with the "
        "canonical B");
    AddOutputOption(cmd, g);
    AddWorkOptions(cmd, g);
    cmd->footer(
        "\nPrints each differing tensor with its first differing element; "
        "exit 1 if any.\n\nExamples:\n  dcr verify /models/policy.safetensors "
        "ckpt/v1.safetensors\n  dcr verify /dev/shm/dcr-s1 ckpt/v1.safetensors "
        "--layout layouts/traingen-serve-tp2.yaml --rank 1\n");
    cmd->callback([=] {
      auto given = serving->Given("A");
      if (!given.ok()) {
        *exit_code = ReportError(given.status());
      } else if (*given) {
        *exit_code =
            VerifyServingStore(*g, serving->layout, *serving->rank, *a, *b);
      } else {
        *exit_code = RunVerify(*g, *a, *b);
      }
    });
  }
  // inspect
  {
    auto* cmd =
        app->add_subcommand("inspect", "Describe a checkpoint or a delta file");
    auto path = std::make_shared<std::string>();
    auto tensors = std::make_shared<bool>(false);
    cmd->add_option("FILE", *path,
                    "A .safetensors file, checkpoint directory, index, or .dcr "
                    "delta")
        ->required();
    cmd->add_flag("--tensors", *tensors, "List every tensor (checkpoints)");
    auto serving = AddServingStoreOptions(
        cmd, "FILE",
        "show what it holds and its bits digest, which its vote compares "
        "with the root's");
    AddOutputOption(cmd, g);
    AddWorkOptions(cmd, g);
    cmd->footer(
        "\nExamples:\n  dcr inspect v1.dcr\n  dcr inspect ckpt/ --tensors -o "
        "json\n  dcr inspect /dev/shm/dcr-s1 --layout "
        "layouts/traingen-serve-tp2.yaml --rank 1\n");
    cmd->callback([=] {
      auto given = serving->Given("FILE");
      if (!given.ok()) {
        *exit_code = ReportError(given.status());
      } else if (*given) {
        *exit_code =
            InspectServingStore(*g, serving->layout, *serving->rank, *path);
      } else {
        *exit_code = RunInspect(*g, *path, *tensors);
      }
    });
  }
}

}  // namespace dcr::cli
