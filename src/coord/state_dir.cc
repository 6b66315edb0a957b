#include "coord/state_dir.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <ctime>
#include <filesystem>
#include <sstream>

#include "common/file.h"
#include "coord/refit_report.h"
#include "coord/state_json.h"
#include "protocol/epoch_file.h"

namespace dcr {
namespace {

namespace fs = std::filesystem;

std::string NowIso8601() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

Status WriteText(const std::string& path, const std::string& text) {
  return WriteFileAtomic(
      path, std::as_bytes(std::span<const char>(text.data(), text.size())));
}

Status WriteJson(const std::string& path, const nlohmann::json& j) {
  return WriteText(
      path,
      j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

// An exclusive lock on the whole file, or a probe for one (F_OFD_GETLK).
struct flock WholeFile(short type) {
  struct flock l {};
  l.l_type = type;
  l.l_whence = SEEK_SET;
  l.l_start = 0;
  l.l_len = 0;
  return l;
}

LockHolder ParseHolder(const std::string& text) {
  LockHolder h;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    auto space = line.find(' ');
    if (space == std::string::npos) continue;
    std::string_view key(line.data(), space);
    std::string value = line.substr(space + 1);
    if (key == "pid") {
      std::from_chars(value.data(), value.data() + value.size(), h.pid);
    } else if (key == "command") {
      h.command = value;
    } else if (key == "since") {
      h.since = value;
    }
  }
  return h;
}

Result<nlohmann::json> ReadJson(const std::string& path) {
  DCR_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return StateJson::Parse(text, path);
}

// decisions/<refit>.json, strictly; `expect` is the refit its name says.
Result<Decision> ParseDecision(const nlohmann::json& j, const std::string& path,
                               const RefitId& expect) {
  StateJson f(j, path);
  DCR_RETURN_IF_ERROR(
      f.OnlyFields({"format", "refit", "epoch", "decision", "base", "target",
                    "commit_set", "decided_at"}));
  DCR_RETURN_IF_ERROR(f.Format().status());
  Decision d;
  DCR_ASSIGN_OR_RETURN(d.refit, f.Refit("refit"));
  if (d.refit != expect) {
    return f.Bad("refit", "names refit " + d.refit.ToHex() +
                              ", the file name refit " + expect.ToHex());
  }
  DCR_ASSIGN_OR_RETURN(d.epoch, f.Uint("epoch"));
  DCR_ASSIGN_OR_RETURN(std::string decision, f.String("decision"));
  if (decision != "commit" && decision != "abort") {
    return f.Bad(
        "decision",
        fmt::format("unknown decision '{}' (commit or abort)", decision));
  }
  d.commit = decision == "commit";
  DCR_ASSIGN_OR_RETURN(d.base, f.VersionField("base"));
  DCR_ASSIGN_OR_RETURN(d.target, f.VersionField("target"));
  DCR_ASSIGN_OR_RETURN(d.commit_set, f.Strings("commit_set"));
  std::sort(d.commit_set.begin(), d.commit_set.end());
  DCR_RETURN_IF_ERROR(f.String("decided_at").status());
  return d;
}

}  // namespace

nlohmann::json VersionJson(const Version& v) {
  // A zero digest is written as null: no version (a store never seeded),
  // or a target whose digest is not known yet (hashed during the stream).
  return {
      {"step", v.step},
      {"digest", v.digest == Digest128{} ? nlohmann::json()
                                         : nlohmann::json(v.digest.ToHex())}};
}

std::string StateDir::DecisionPath(const RefitId& refit) const {
  return dir_ + "/decisions/" + refit.ToHex() + ".json";
}

Status StateDir::Create() const {
  std::error_code ec;
  fs::create_directories(dir_ + "/decisions", ec);
  if (ec) {
    return Status::IOError(
        fmt::format("cannot create state_dir {}: {}", dir_, ec.message()));
  }
  return Status::OK();
}

Result<uint64_t> StateDir::NextEpoch() const {
  return EpochFile(EpochPath()).Next();
}

bool StateDir::HasCurrent() const {
  std::error_code ec;
  return fs::exists(CurrentPath(), ec);
}

Status StateDir::WriteCurrent(const CurrentRefit& c) const {
  return WriteJson(CurrentPath(), {{"format", kStateFormat},
                                   {"refit", c.refit.ToHex()},
                                   {"epoch", c.epoch},
                                   {"mode", RefitModeName(c.mode)},
                                   {"base", VersionJson(c.base)},
                                   {"target", VersionJson(c.target)},
                                   {"target_path", c.target_path},
                                   {"started_at", NowIso8601()}});
}

Result<CurrentRefit> StateDir::ReadCurrent() const {
  const std::string path = CurrentPath();
  if (!HasCurrent()) {
    return Status::NotFound(
        fmt::format("{} does not exist: no interrupted refit to resume", path));
  }
  DCR_ASSIGN_OR_RETURN(nlohmann::json j, ReadJson(path));
  StateJson f(j, path);
  DCR_RETURN_IF_ERROR(f.OnlyFields({"format", "refit", "epoch", "mode", "base",
                                    "target", "target_path", "started_at"}));
  DCR_RETURN_IF_ERROR(f.Format().status());
  CurrentRefit c;
  DCR_ASSIGN_OR_RETURN(c.refit, f.Refit("refit"));
  DCR_ASSIGN_OR_RETURN(c.epoch, f.Uint("epoch"));
  DCR_ASSIGN_OR_RETURN(c.mode, f.Mode("mode"));
  DCR_ASSIGN_OR_RETURN(c.base, f.VersionField("base"));
  DCR_ASSIGN_OR_RETURN(c.target, f.VersionField("target"));
  DCR_ASSIGN_OR_RETURN(c.target_path, f.String("target_path"));
  DCR_RETURN_IF_ERROR(f.String("started_at").status());
  DCR_RETURN_IF_ERROR(f.FormatWithLinearDigests());
  return c;
}

void StateDir::RemoveCurrent() const {
  std::error_code ec;
  fs::remove(CurrentPath(), ec);
}

Status StateDir::WriteDecision(const Decision& d) const {
  return WriteJson(DecisionPath(d.refit),
                   {{"format", kStateFormat},
                    {"refit", d.refit.ToHex()},
                    {"epoch", d.epoch},
                    {"decision", d.commit ? "commit" : "abort"},
                    {"base", VersionJson(d.base)},
                    {"target", VersionJson(d.target)},
                    {"commit_set", d.commit_set},
                    {"decided_at", NowIso8601()}});
}

Result<std::optional<Decision>> StateDir::ReadDecision(
    const RefitId& refit) const {
  const std::string path = DecisionPath(refit);
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::optional<Decision>();
  DCR_ASSIGN_OR_RETURN(nlohmann::json j, ReadJson(path));
  DCR_ASSIGN_OR_RETURN(Decision d, ParseDecision(j, path, refit));
  // Pruning reads any decision; acting on one needs this build's digests.
  DCR_RETURN_IF_ERROR(StateJson(j, path).FormatWithLinearDigests());
  return std::optional<Decision>(std::move(d));
}

std::optional<RefitId> RefitOfJsonFile(const fs::directory_entry& entry) {
  std::error_code ec;
  const fs::path& p = entry.path();
  if (p.extension() != ".json" || !entry.is_regular_file(ec)) {
    return std::nullopt;
  }
  Result<RefitId> id = RefitId::FromHex(p.stem().string());
  return id.ok() ? std::optional<RefitId>(*id) : std::nullopt;
}

Status StateDir::PruneDecisions(size_t keep) const {
  const std::string dir = dir_ + "/decisions";
  std::error_code ec;
  if (!fs::exists(dir, ec)) return Status::OK();
  std::optional<RefitId> current;
  if (HasCurrent()) {
    auto c = ReadCurrent();
    if (!c.ok()) {
      // Without knowing which refit current.json names, remove nothing.
      spdlog::warn("not pruning {}: {}", dir, c.status().ToString());
      return Status::OK();
    }
    current = c->refit;
  }
  std::vector<std::pair<uint64_t, fs::path>> decisions;  // (epoch, path)
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const fs::path& p = e.path();
    const std::optional<RefitId> id = RefitOfJsonFile(e);
    if (!id) {
      spdlog::warn("{}: not a decision (decisions/<refit id>.json); left alone",
                   p.string());
      continue;
    }
    if (current && *id == *current) continue;
    auto j = ReadJson(p.string());
    auto d = j.ok() ? ParseDecision(*j, p.string(), *id)
                    : Result<Decision>(j.status());
    if (!d.ok()) {
      spdlog::warn("keeping a decision it cannot read: {}",
                   d.status().ToString());
      continue;
    }
    decisions.emplace_back(d->epoch, p);
  }
  if (ec) {
    return Status::IOError(
        fmt::format("cannot list {}: {}", dir, ec.message()));
  }
  std::sort(decisions.begin(), decisions.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = keep; i < decisions.size(); ++i) {
    fs::remove(decisions[i].second, ec);
    if (ec) {
      return Status::IOError(fmt::format(
          "cannot remove {}: {}", decisions[i].second.string(), ec.message()));
    }
  }
  return Status::OK();
}

std::optional<LockHolder> StateDir::Running() const {
  const std::string path = LockPath();
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return std::nullopt;  // no run ever locked it
  struct flock l = WholeFile(F_WRLCK);
  if (::fcntl(fd.get(), F_OFD_GETLK, &l) != 0 || l.l_type == F_UNLCK) {
    return std::nullopt;
  }
  auto text = ReadFileToString(path);
  return text.ok() ? ParseHolder(*text) : LockHolder{};
}

Result<StateDirLock> StateDirLock::Acquire(const StateDir& state,
                                           std::string_view command) {
  DCR_RETURN_IF_ERROR(state.Create());
  const std::string path = state.LockPath();
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!fd.valid()) {
    return Status::FromErrno("cannot open the state_dir lock " + path, errno);
  }
  struct flock l = WholeFile(F_WRLCK);
  if (::fcntl(fd.get(), F_OFD_SETLK, &l) != 0) {
    const int err = errno;
    if (err != EACCES && err != EAGAIN) {
      return Status::FromErrno("cannot lock " + path, err);
    }
    auto text = ReadFileToString(path);
    LockHolder h = text.ok() ? ParseHolder(*text) : LockHolder{};
    std::string who =
        h.pid > 0 ? fmt::format("pid {}", h.pid) : std::string("a process");
    return Status::InvalidArgument(fmt::format(
        "another coordinator ({}{}{}) is running on state_dir {}: two at "
        "once would fence each other off at the relays; wait for it to end "
        "(dcr status shows it), or stop it (kill {}) and then run dcr refit "
        "--resume",
        who, h.command.empty() ? "" : ", " + h.command,
        h.since.empty() ? "" : ", since " + h.since, state.dir(),
        h.pid > 0 ? std::to_string(h.pid) : "it"));
  }
  // Who holds it, for the refusal above and dcr status; not durable (a
  // crash leaves no lock, whatever the file says).
  const std::string text = fmt::format("pid {}\ncommand {}\nsince {}\n",
                                       ::getpid(), command, NowIso8601());
  if (::ftruncate(fd.get(), 0) != 0 ||
      ::pwrite(fd.get(), text.data(), text.size(), 0) !=
          static_cast<ssize_t>(text.size())) {
    return Status::FromErrno("cannot write " + path, errno);
  }
  return StateDirLock(std::move(fd));
}

void StateDir::WriteReport(RefitReport* report) const {
  report->ended_at = NowIso8601();
  nlohmann::json j = nlohmann::json::parse(report->ToJson());
  j["format"] = kStateFormat;
  const std::string text =
      j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  Status w = WriteText(LastRefitPath(), text);
  if (!w.ok()) spdlog::warn("cannot write last-refit.json: {}", w.ToString());
  std::error_code ec;
  fs::create_directories(ReportsDir(), ec);
  const std::string path = fmt::format("{}/{:012}-{}.json", ReportsDir(),
                                       report->epoch, report->refit.ToHex());
  w = ec ? Status::FromErrno("cannot create " + ReportsDir(), ec.value())
         : WriteText(path, text);
  if (!w.ok()) {
    spdlog::warn("refit history: cannot write the report: {}", w.ToString());
    return;
  }
  if (Status s = PruneReports(); !s.ok()) {
    spdlog::warn("refit history: {}", s.ToString());
  }
}

namespace {

// The report files of `dir` (<12 digits>-<32 hex>.json), sorted by name:
// epoch order.
Result<std::vector<std::string>> ReportNames(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return names;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const bool ok = name.size() == 12 + 1 + 32 + 5 && name[12] == '-' &&
                    name.ends_with(".json") &&
                    std::all_of(name.begin(), name.begin() + 12,
                                [](char c) { return c >= '0' && c <= '9'; }) &&
                    RefitId::FromHex(name.substr(13, 32)).ok() &&
                    it->is_regular_file(ec);
    if (ok) names.push_back(name);
  }
  if (ec) return Status::FromErrno("cannot list " + dir, ec.value());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

Result<std::vector<ReportFile>> StateDir::ReadReports(size_t limit) const {
  DCR_ASSIGN_OR_RETURN(std::vector<std::string> names,
                       ReportNames(ReportsDir()));
  const size_t first =
      limit == 0 || names.size() <= limit ? 0 : names.size() - limit;
  std::vector<ReportFile> out;
  for (size_t i = first; i < names.size(); ++i) {
    std::string path = ReportsDir() + "/" + names[i];
    Result<RefitReport> report = [&]() -> Result<RefitReport> {
      DCR_ASSIGN_OR_RETURN(nlohmann::json j, ReadJson(path));
      return RefitReportFromJson(j, path);
    }();
    out.push_back({std::move(path), std::move(report)});
  }
  return out;
}

Status StateDir::PruneReports(size_t keep) const {
  DCR_ASSIGN_OR_RETURN(std::vector<std::string> names,
                       ReportNames(ReportsDir()));
  for (size_t i = 0; i + keep < names.size(); ++i) {
    const std::string path = ReportsDir() + "/" + names[i];
    std::error_code ec;
    if (!fs::remove(path, ec) && ec) {
      return Status::FromErrno("cannot remove " + path, ec.value());
    }
  }
  return Status::OK();
}

Result<RefitReport> StateDir::ReadLastRefit() const {
  const std::string path = LastRefitPath();
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    return Status::NotFound(path + " does not exist: no refit ended here");
  }
  DCR_ASSIGN_OR_RETURN(nlohmann::json j, ReadJson(path));
  return RefitReportFromJson(j, path);
}

}  // namespace dcr
