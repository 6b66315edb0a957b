// dcr-traingen: writes consecutive BF16 checkpoints of a transformer-shaped
// model, each one real Adam step after the previous one, and reports how
// much of each step's delta is new information (the entropy floor of
// DESIGN.md §1). It is the source of realistic checkpoint pairs for tests
// and benchmarks.
//
// The model and its Adam steps are traingen_model.{h,cc}; this file is the
// command: options, the step loop, the files and the report.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/dtype.h"
#include "dcr/entropy.h"
#include "dcr/layout.h"
#include "dcr/receiver_map.h"
#include "dcr/shard_diff.h"
#include "dcr/status.h"
#include "dcr/thread_pool.h"
#include "traingen_model.h"

namespace dcr {
namespace {

using traingen::BuildModel;
using traingen::CheckLayoutMatches;
using traingen::DefaultIntermediate;
using traingen::kProgram;
using traingen::Options;
using traingen::TensorSpec;
using traingen::Trainer;
using traingen::Validate;

// Per-step figures, for the table and the JSON report.
struct StepReport {
  uint64_t step = 0;
  double change_rate = 0;
  uint64_t changed = 0;
  double floor_bytes = 0;
  double position_bytes = 0;
  double value_bytes = 0;
  uint64_t checkpoint_bytes = 0;
};

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since)
      .count();
}

Result<uint64_t> FileSize(const std::string& path) {
  std::error_code ec;
  uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) {
    return Status::IOError(fmt::format("{}: {}", path, ec.message()));
  }
  return size;
}

std::string CheckpointPath(const std::string& dir, uint64_t k) {
  return (std::filesystem::path(dir) / fmt::format("v{}.safetensors", k))
      .string();
}

// Where --layout puts version k's shards, and rank r's file in there.
std::string ShardDir(const std::string& dir, uint64_t k) {
  return (std::filesystem::path(dir) / fmt::format("v{}.shards", k)).string();
}

Status PrepareOutDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return Status::IOError(
        fmt::format("cannot create --out directory {}: {}", dir, ec.message()));
  }
  if (!std::filesystem::is_directory(dir, ec)) {
    return Status::IOError(fmt::format("--out {} is not a directory", dir));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return Status::FromErrno(fmt::format("--out directory {}", dir), errno);
  }
  return Status::OK();
}

void PrintRow(const StepReport& r) {
  fmt::print(
      "{:>5} {:>9.4f}% {:>12} {:>12.0f} {:>12.0f} {:>12.0f} {:>14} "
      "{:>10.2f}\n",
      r.step, 100 * r.change_rate, r.changed, r.floor_bytes, r.position_bytes,
      r.value_bytes, r.checkpoint_bytes,
      r.floor_bytes > 0 ? r.checkpoint_bytes / r.floor_bytes : 0.0);
  std::fflush(stdout);
}

Status Run(const Options& options) {
  DCR_RETURN_IF_ERROR(Validate(options));
  DCR_ASSIGN_OR_RETURN(std::vector<TensorSpec> tensors, BuildModel(options));
  std::optional<Layout> layout;
  if (!options.layout.empty()) {
    DCR_ASSIGN_OR_RETURN(layout, LoadLayout(options.layout));
    DCR_RETURN_IF_ERROR(CheckLayoutMatches(*layout, tensors));
  }
  DCR_RETURN_IF_ERROR(PrepareOutDir(options.out));
  ThreadPool pool(options.threads);
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                       Trainer::Create(std::move(tensors), options, &pool));
  const bool json = options.output == "json";
  fmt::print(stderr,
             "{}: {} parameters in {} BF16 tensors ({:.1f} MB per "
             "checkpoint, {:.2f} GiB of optimizer state), {} threads\n",
             kProgram, trainer->params(), trainer->tensors().size(),
             trainer->params() * 2 / 1e6,
             trainer->params() * 18.0 / (1ull << 30), pool.size());

  auto start = std::chrono::steady_clock::now();
  trainer->Init();
  uint64_t t = 0;
  for (; t < options.warmup; ++t) trainer->Step(t + 1, -1, -1, nullptr);
  trainer->Snapshot(0);
  fmt::print(stderr, "{}: init and {} warmup steps in {:.2f} s\n", kProgram,
             options.warmup, Seconds(start));

  start = std::chrono::steady_clock::now();
  std::string path = CheckpointPath(options.out, 0);
  DCR_RETURN_IF_ERROR(trainer->Write(0, path, 0));
  if (layout) {
    DCR_RETURN_IF_ERROR(
        trainer->WriteShards(0, *layout, ShardDir(options.out, 0), 0));
  }
  DCR_ASSIGN_OR_RETURN(uint64_t checkpoint_bytes, FileSize(path));
  fmt::print(stderr, "{}: wrote {} in {:.2f} s\n", kProgram, path,
             Seconds(start));

  if (!json) {
    fmt::print("{:>5} {:>10} {:>12} {:>12} {:>12} {:>12} {:>14} {:>10}\n",
               "step", "change", "changed", "floor_B", "positions_B",
               "values_B", "checkpoint_B", "ckpt/floor");
    std::fflush(stdout);
  }
  std::vector<StepReport> reports;
  reports.reserve(options.steps);
  for (uint64_t k = 1; k <= options.steps; ++k) {
    const int prev = static_cast<int>((k - 1) % 2);
    const int out = static_cast<int>(k % 2);
    std::vector<EntropyFloor> floors(pool.size());
    start = std::chrono::steady_clock::now();
    trainer->Step(++t, prev, out, &floors);
    for (size_t w = 1; w < floors.size(); ++w) floors[0].Merge(floors[w]);
    const double step_s = Seconds(start);

    start = std::chrono::steady_clock::now();
    path = CheckpointPath(options.out, k);
    DCR_RETURN_IF_ERROR(trainer->Write(out, path, k));
    if (layout) {
      DCR_RETURN_IF_ERROR(
          trainer->WriteShards(out, *layout, ShardDir(options.out, k), k));
    }
    StepReport r;
    DCR_ASSIGN_OR_RETURN(r.checkpoint_bytes, FileSize(path));
    const EntropyFloor& f = floors[0];
    r.step = k;
    r.change_rate = f.change_rate();
    r.changed = f.changed();
    r.floor_bytes = f.floor_bytes();
    r.position_bytes = f.position_bytes();
    r.value_bytes = f.value_bytes();
    fmt::print(stderr,
               "{}: step {}/{}: {:.3f}% changed; optimizer {:.2f} s, write "
               "{:.2f} s\n",
               kProgram, k, options.steps, 100 * r.change_rate, step_s,
               Seconds(start));
    if (!json) PrintRow(r);
    reports.push_back(r);
  }

  if (json) {
    nlohmann::json steps = nlohmann::json::array();
    for (const StepReport& r : reports) {
      steps.push_back(
          {{"step", r.step},
           {"change_rate", r.change_rate},
           {"changed", r.changed},
           {"floor_bytes", r.floor_bytes},
           {"position_bytes", r.position_bytes},
           {"value_bytes", r.value_bytes},
           {"checkpoint_bytes", r.checkpoint_bytes},
           {"checkpoint_over_floor",
            r.floor_bytes > 0 ? r.checkpoint_bytes / r.floor_bytes : 0.0}});
    }
    nlohmann::json report = {{"params", trainer->params()},
                             {"checkpoint_bytes", checkpoint_bytes},
                             {"lr", options.lr},
                             {"seed", options.seed},
                             {"warmup", options.warmup},
                             {"steps", std::move(steps)}};
    fmt::print("{}\n", report.dump(2));
  }
  return Status::OK();
}

constexpr char kFooter[] = R"(
Writes OUT/v0.safetensors (the model after --warmup Adam steps) and
OUT/v1..vN.safetensors, each one Adam step after the previous, and reports
for each step the fraction of BF16 elements whose bits changed and the
order-0 entropy floor of the XOR delta (DESIGN.md section 1).

Change rate per step on the default model (154M parameters, --warmup 10,
--seed 1; it drifts down by ~1% relative per step):
  --lr 6e-7  about 1.0%     --lr 1e-6  about 1.5%     --lr 2e-6  about 2.7%
  --lr 2.2e-6 about 3.0%    --lr 3e-6  about 3.8%     --lr 4.2e-6 about 5.1%

Examples:
  dcr-traingen --out /tmp/ckpt --steps 3 --lr 2.2e-6   # ~3% per step
  dcr-traingen --hidden 64 --layers 2 --vocab 256 --out /tmp/tiny -o json
  dcr-traingen --out /tmp/ckpt --layout layouts/traingen-tp2-pp2.yaml

With --layout, each version is also written as a trainer's shards:
OUT/vK.shards/rank-RRRRR.safetensors holds what producer rank R holds under
the layout (docs/PLACEMENT.md), named as the trainer names them. The layout
must place exactly the model's tensors, as bit copies.

Exit status: 0 on success, 2 for bad options, 1 for runtime errors.)";

// CLI11 2.1's numeric validators print their range as a 300-digit double;
// these say what they want in words.
CLI::Validator IntegerValidator(bool positive) {
  return CLI::Validator(
      [positive](std::string& s) -> std::string {
        bool digits = !s.empty() && s.size() <= 19 &&
                      std::all_of(s.begin(), s.end(),
                                  [](char c) { return c >= '0' && c <= '9'; });
        if (!digits) return "'" + s + "' is not a non-negative integer";
        if (positive && s.find_first_not_of('0') == std::string::npos) {
          return "must be at least 1";
        }
        return "";
      },
      "", positive ? "POSITIVE" : "NON_NEGATIVE");
}

CLI::Validator RealValidator(bool positive) {
  return CLI::Validator(
      [positive](std::string& s) -> std::string {
        char* end = nullptr;
        double x = std::strtod(s.c_str(), &end);
        if (s.empty() || *end != '\0' || !std::isfinite(x) ||
            (positive ? !(x > 0) : !(x >= 0))) {
          return "'" + s + "' is not a " +
                 (positive ? "positive" : "non-negative") + " number";
        }
        return "";
      },
      "", positive ? "POSITIVE" : "NON_NEGATIVE");
}

int Main(int argc, char** argv) {
  Options o;
  const CLI::Validator kPositive = IntegerValidator(true);
  const CLI::Validator kNonNegative = IntegerValidator(false);
  CLI::App app(
      "Generates consecutive BF16 checkpoints of a transformer-shaped "
      "model by real Adam steps.",
      kProgram);
  app.footer(kFooter);
  app.add_option("--hidden", o.hidden, "Hidden size")
      ->capture_default_str()
      ->check(kPositive);
  app.add_option("--layers", o.layers, "Number of transformer layers")
      ->capture_default_str()
      ->check(kNonNegative);
  app.add_option("--heads", o.heads, "Attention heads")
      ->capture_default_str()
      ->check(kPositive);
  app.add_option("--kv-heads", o.kv_heads,
                 "Key/value heads (grouped-query attention)")
      ->capture_default_str()
      ->check(kPositive);
  app.add_option("--intermediate", o.intermediate,
                 "MLP size (default: 2.6875 x hidden rounded to 64)")
      ->check(kNonNegative);
  app.add_option("--vocab", o.vocab, "Vocabulary size")
      ->capture_default_str()
      ->check(kPositive);
  app.add_option("--lr", o.lr, "Adam learning rate")
      ->capture_default_str()
      ->check(RealValidator(true));
  app.add_option("--weight-decay", o.weight_decay,
                 "Decoupled (AdamW) weight decay")
      ->capture_default_str()
      ->check(RealValidator(false));
  app.add_option("--steps", o.steps, "Checkpoints to write after v0")
      ->capture_default_str()
      ->check(kNonNegative);
  app.add_option("--seed", o.seed, "Random seed")
      ->capture_default_str()
      ->check(kNonNegative);
  app.add_option("--warmup", o.warmup, "Adam steps taken before v0 is written")
      ->capture_default_str()
      ->check(kNonNegative);
  app.add_option("--layout", o.layout,
                 "Also write each version as the shards of this placement "
                 "layout's ranks");
  app.add_flag("--serving", o.serving,
               "With --layout: the layout's ranks are a server's, and each "
               "also holds copies of replicated tensors");
  app.add_option("--out", o.out, "Output directory (created if missing)")
      ->required();
  app.add_option("--threads", o.threads,
                 "Worker threads (0: one per hardware thread)")
      ->check(kNonNegative)
      ->capture_default_str();
  app.add_option("-o,--output", o.output, "Report format on stdout")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    fmt::print(stderr, "{}: {} (see --help)\n", kProgram, e.what());
    return 2;
  }
  if (o.intermediate == 0) o.intermediate = DefaultIntermediate(o.hidden);

  Status s = Run(o);
  if (!s.ok()) {
    fmt::print(stderr, "{}: {}\n", kProgram, s.ToString());
    return s.IsInvalidArgument() ? 2 : 1;
  }
  return 0;
}

}  // namespace
}  // namespace dcr

int main(int argc, char** argv) { return dcr::Main(argc, argv); }
