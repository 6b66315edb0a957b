#include "coord/state_dir.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <ctime>
#include <filesystem>

#include "common/file.h"
#include "protocol/epoch_file.h"

namespace dcr {
namespace {

std::string NowIso8601() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

Status WriteJson(const std::string& path, const nlohmann::json& j) {
  std::string text =
      j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  return WriteFileAtomic(
      path, std::as_bytes(std::span<const char>(text.data(), text.size())));
}

std::string_view ModeName(RefitMode mode) {
  return mode == RefitMode::kFull ? "full" : "delta";
}

}  // namespace

nlohmann::json VersionJson(const Version& v) {
  return {{"step", v.step}, {"digest", v.digest.ToHex()}};
}

std::string StateDir::DecisionPath(const RefitId& refit) const {
  return dir_ + "/decisions/" + refit.ToHex() + ".json";
}

Status StateDir::Create() const {
  std::error_code ec;
  std::filesystem::create_directories(dir_ + "/decisions", ec);
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
  return std::filesystem::exists(CurrentPath(), ec);
}

Status StateDir::WriteCurrent(const CurrentRefit& c) const {
  return WriteJson(CurrentPath(), {{"refit", c.refit.ToHex()},
                                   {"epoch", c.epoch},
                                   {"mode", ModeName(c.mode)},
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
  DCR_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  auto bad = [&](const std::string& why) {
    return Status::Corruption(path + ": " + why);
  };
  nlohmann::json cur = nlohmann::json::parse(text, nullptr, false);
  if (cur.is_discarded() || !cur.is_object()) return bad("not JSON");
  auto version = [&](const char* key) -> Result<Version> {
    if (!cur.contains(key) || !cur[key].is_object()) {
      return bad(std::string("no ") + key);
    }
    const auto& v = cur[key];
    if (!v.contains("step") || !v["step"].is_number_unsigned() ||
        !v.contains("digest") || !v["digest"].is_string()) {
      return bad(std::string("bad ") + key);
    }
    auto d = Digest128::FromHex(v["digest"].get<std::string>());
    if (!d.ok()) return bad(std::string("bad ") + key + " digest");
    return Version{v["step"].get<uint64_t>(), *d};
  };
  if (!cur.contains("refit") || !cur["refit"].is_string() ||
      !cur.contains("mode") || !cur["mode"].is_string() ||
      !cur.contains("target_path") || !cur["target_path"].is_string()) {
    return bad("refit, mode or target_path missing");
  }
  auto id = RefitId::FromHex(cur["refit"].get<std::string>());
  if (!id.ok()) return bad("bad refit id");
  CurrentRefit c;
  c.refit = *id;
  if (cur.contains("epoch") && cur["epoch"].is_number_unsigned()) {
    c.epoch = cur["epoch"].get<uint64_t>();
  }
  c.mode = cur["mode"] == "full" ? RefitMode::kFull : RefitMode::kDelta;
  DCR_ASSIGN_OR_RETURN(c.base, version("base"));
  DCR_ASSIGN_OR_RETURN(c.target, version("target"));
  c.target_path = cur["target_path"].get<std::string>();
  return c;
}

void StateDir::RemoveCurrent() const {
  std::error_code ec;
  std::filesystem::remove(CurrentPath(), ec);
}

Status StateDir::WriteDecision(const Decision& d) const {
  return WriteJson(DecisionPath(d.refit),
                   {{"refit", d.refit.ToHex()},
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
  if (!std::filesystem::exists(path, ec)) return std::optional<Decision>();
  DCR_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("decision") ||
      !j.contains("commit_set") || !j["commit_set"].is_array()) {
    return Status::Corruption(path + ": not a decision");
  }
  Decision d;
  d.refit = refit;
  d.commit = j["decision"] == "commit";
  for (const auto& n : j["commit_set"]) {
    if (n.is_string()) d.commit_set.push_back(n.get<std::string>());
  }
  std::sort(d.commit_set.begin(), d.commit_set.end());
  return std::optional<Decision>(std::move(d));
}

void StateDir::WriteLastRefit(const RefitReport& report) const {
  std::string text = report.ToJson() + "\n";
  Status w = WriteFileAtomic(
      LastRefitPath(),
      std::as_bytes(std::span<const char>(text.data(), text.size())));
  if (!w.ok()) spdlog::warn("cannot write last-refit.json: {}", w.ToString());
}

}  // namespace dcr
