// `dcr history`: the reports of the last refits (state_dir/reports/, kept by
// coord/state_dir.h) as a table, as JSON, or as a plot of time and payload
// per step, so that a regression shows at a glance.
#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/cli_common.h"
#include "common/bytes.h"
#include "common/file.h"
#include "coord/state_dir.h"
#include "dcr/topology.h"

namespace dcr::cli {

namespace {

using json = nlohmann::json;

struct HistoryArgs {
  std::string topology;
  size_t last = 20;
  std::string plot;
};

// The receivers a report left out, comma-separated ("-" when none).
std::string Excluded(const RefitReport& r) {
  std::string out;
  for (const NodeOutcome& n : r.nodes) {
    if (n.committed) continue;
    if (!out.empty()) out += ",";
    out += n.node;
  }
  return out.empty() ? "-" : out;
}

double ChangeRate(const RefitReport& r) {
  return r.total_elements ? double(r.changed_elements) / r.total_elements : 0;
}

void PrintTable(const std::vector<const RefitReport*>& reports) {
  std::printf("%-20s  %-13s  %-5s  %7s  %10s  %8s  %-17s  %-7s  %s\n", "ENDED",
              "STEP", "MODE", "CHANGED", "PAYLOAD", "TIME", "OUTCOME",
              "REPAIRS", "EXCLUDED");
  for (const RefitReport* r : reports) {
    std::string step = fmt::format("{} -> {}", r->base.step, r->target.step);
    std::string repairs = r->repair_rounds == 0
                              ? "-"
                              : fmt::format("{} ({})", r->repair_rounds,
                                            HumanBytes(r->repair_bytes));
    // A full refit sends every span whatever changed.
    std::string changed = r->mode == RefitMode::kFull
                              ? "-"
                              : fmt::format("{:.2f}%", 100 * ChangeRate(*r));
    std::printf("%-20s  %-13s  %-5s  %7s  %10s  %7.2fs  %-17s  %-7s  %s\n",
                r->ended_at.empty() ? "-" : r->ended_at.c_str(), step.c_str(),
                r->mode == RefitMode::kFull ? "full" : "delta", changed.c_str(),
                HumanBytes(r->payload_bytes).c_str(), r->total_seconds,
                std::string(RefitOutcomeName(r->outcome)).c_str(),
                repairs.c_str(), Excluded(*r).c_str());
  }
}

// `s` as a gnuplot single-quoted string (a quote doubled).
std::string GnuplotQuoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    out += c;
    if (c == '\'') out += '\'';
  }
  return out + "'";
}

// Runs `gnuplot script` with its output in `log`, without a shell: the
// exit status, or 127 when gnuplot is not installed.
Result<int> RunGnuplot(const std::string& script, const std::string& log) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::string prog = "gnuplot";
  std::vector<char*> argv = {prog.data(), const_cast<char*>(script.c_str()),
                             nullptr};
  pid_t pid = 0;
  const int err =
      posix_spawnp(&pid, "gnuplot", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (err == ENOENT) return 127;
  if (err != 0) return Status::FromErrno("--plot: cannot run gnuplot", err);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return Status::FromErrno("--plot: waitpid", errno);
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Draws time and payload per target step in two panels (gnuplot): a delta
// of a few MB and a full refit of many GB each stay readable, on log axes.
Status Plot(const std::vector<const RefitReport*>& reports,
            const std::string& png) {
  std::error_code ec;
  std::filesystem::path tmpdir = std::filesystem::temp_directory_path(ec);
  if (ec) tmpdir = "/tmp";
  std::string dir = (tmpdir / "dcr-history-XXXXXX").string();
  if (::mkdtemp(dir.data()) == nullptr) {
    return Status::FromErrno("--plot: cannot create " + dir, errno);
  }
  struct RemoveDir {
    std::string path;
    ~RemoveDir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  } tmp{dir};
  std::string data;
  for (const RefitReport* r : reports) {
    // step, seconds, payload MB, committed (1/0), full (1/0)
    const bool committed = r->outcome == RefitOutcome::kCommitted ||
                           r->outcome == RefitOutcome::kPartial;
    data += fmt::format("{} {:.6f} {:.6f} {} {}\n", r->target.step,
                        std::max(r->total_seconds, 1e-3),
                        std::max(r->payload_bytes / 1e6, 1e-3),
                        committed ? 1 : 0, r->mode == RefitMode::kFull ? 1 : 0);
  }
  const std::string dat = tmp.path + "/history.dat";
  // Whole steps on the x axis, about 10 ticks.
  const auto [lo, hi] = std::minmax_element(
      reports.begin(), reports.end(), [](const auto* a, const auto* b) {
        return a->target.step < b->target.step;
      });
  const uint64_t span = (*hi)->target.step - (*lo)->target.step;
  const uint64_t xstep = std::max<uint64_t>(1, (span + 9) / 10);
  DCR_RETURN_IF_ERROR(WriteFileAtomic(
      dat, std::as_bytes(std::span<const char>(data.data(), data.size()))));
  // Committed refits as points joined by a line, aborted ones as crosses.
  const std::string script = fmt::format(
      "set terminal pngcairo size 1000,640 font ',10'\n"
      "set output {png}\n"
      "set multiplot layout 2,1 title 'dcr refits: time and payload per "
      "step (log scales; x: aborted)'\n"
      "set grid\nset logscale y\nset key top left\n"
      "set xlabel 'target step'\nset xtics {xstep}\n"
      "set offsets graph 0.03, graph 0.03, 0, 0\n"
      "set ylabel 'seconds'\n"
      "plot {dat} using 1:($4==1&&$5==0?$2:1/0) with linespoints pt 7 "
      "title 'delta', '' using 1:($4==1&&$5==1?$2:1/0) with points pt 5 "
      "title 'full', '' using 1:($4==0?$2:1/0) with points pt 2 ps 2 "
      "title 'aborted'\n"
      "set ylabel 'payload (MB)'\n"
      "plot {dat} using 1:($4==1&&$5==0?$3:1/0) with linespoints pt 7 "
      "title 'delta', '' using 1:($4==1&&$5==1?$3:1/0) with points pt 5 "
      "title 'full', '' using 1:($4==0?$3:1/0) with points pt 2 ps 2 "
      "title 'aborted'\n"
      "unset multiplot\n",
      fmt::arg("png", GnuplotQuoted(png)), fmt::arg("dat", GnuplotQuoted(dat)),
      fmt::arg("xstep", xstep));
  const std::string gp = tmp.path + "/history.gp";
  DCR_RETURN_IF_ERROR(WriteFileAtomic(
      gp, std::as_bytes(std::span<const char>(script.data(), script.size()))));
  const std::string log = tmp.path + "/gnuplot.log";
  DCR_ASSIGN_OR_RETURN(int rc, RunGnuplot(gp, log));
  if (rc == 127) {
    return Status::IOError(
        "--plot needs gnuplot, which is not installed (Debian: apt install "
        "gnuplot-nox)");
  }
  if (rc != 0) {
    auto out = ReadFileToString(log);
    return Status::IOError("gnuplot failed drawing " + png + ": " +
                           (out.ok() ? *out : std::string("(no output)")));
  }
  return Status::OK();
}

int RunHistory(const HistoryArgs& a, const GlobalOptions& g) {
  Result<Topology> topo = LoadTopology(a.topology);
  if (!topo.ok()) return ReportError(topo.status());
  if (topo->root.state_dir.empty()) {
    return ReportError(Status::InvalidArgument(
        a.topology + ": root.state_dir is not set, so no refit kept a report"));
  }
  const StateDir state(topo->root.state_dir);
  Result<std::vector<ReportFile>> files = state.ReadReports(a.last);
  if (!files.ok()) return ReportError(files.status());
  std::vector<const RefitReport*> reports;
  int rc = kExitOk;
  for (const ReportFile& f : *files) {
    // Pruned by a refit ending meanwhile: no longer part of the history.
    std::error_code ec;
    if (!f.report.ok() && !std::filesystem::exists(f.path, ec)) continue;
    if (f.report.ok()) {
      reports.push_back(&*f.report);
    } else {
      std::fprintf(stderr, "dcr: skipped: %s\n",
                   f.report.status().ToString().c_str());
      rc = kExitFailed;
    }
  }
  if (g.format() == OutputFormat::kJson) {
    json out = {{"state_dir", state.dir()}, {"reports", json::array()}};
    for (const RefitReport* r : reports) {
      out["reports"].push_back(json::parse(r->ToJson()));
    }
    std::printf(
        "%s\n",
        out.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
  } else if (reports.empty()) {
    std::printf("no refit reports in %s yet\n", state.ReportsDir().c_str());
  } else {
    PrintTable(reports);
  }
  if (!a.plot.empty()) {
    if (reports.empty()) {
      return ReportError(Status::NotFound("--plot: no refit reports in " +
                                          state.ReportsDir() + " to draw"));
    }
    if (Status s = Plot(reports, a.plot); !s.ok()) return ReportError(s);
    std::fprintf(stderr, "dcr: drew %zu refits in %s\n", reports.size(),
                 a.plot.c_str());
  }
  return rc;
}

}  // namespace

void AddHistoryCommand(CLI::App* app, GlobalOptions* g, int* exit_code) {
  auto a = std::make_shared<HistoryArgs>();
  auto* cmd = app->add_subcommand(
      "history", "List the last refits' reports (root.state_dir/reports)");
  cmd->add_option("-t,--topology", a->topology, "Topology YAML file")
      ->required();
  cmd->add_option("-n,--last", a->last,
                  "How many of the newest refits (default 20; 0: all kept, up "
                  "to 1000)");
  cmd->add_option("--plot", a->plot,
                  "Also draw time and payload per step into this PNG "
                  "(gnuplot)");
  AddOutputOption(cmd, g);
  cmd->footer(
      "\nExamples:\n  dcr history --topology topology/local.yaml\n"
      "  dcr history --topology topology/local.yaml -n 0 -o json\n"
      "  dcr history --topology topology/local.yaml --plot refits.png\n\n"
      "Columns: when the report was written (UTC), base -> target step, "
      "mode, changed elements, chunk payload, total time, outcome, repair "
      "rounds (their bytes), receivers left out.\n\n"
      "Exit codes: 0 listed, 1 a report could not be read (named on stderr) "
      "or the plot failed, 2 usage.\n");
  cmd->callback([=] { *exit_code = RunHistory(*a, *g); });
}

}  // namespace dcr::cli
