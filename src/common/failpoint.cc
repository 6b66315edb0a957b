#include "common/failpoint.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace dcr {
namespace {

constexpr std::string_view kActionList =
    "exit, hang, drop, delay(MS), wait(PATH), corrupt, cut(BYTES), forge";
// A delay is a pause, not a hang: longer ones are refused. A wait gives up
// after as long.
constexpr uint64_t kMaxDelayMs = 3600 * 1000;
// How often a wait looks for its file.
constexpr auto kWaitPoll = std::chrono::milliseconds(10);

struct Rule {
  FailAction action = FailAction::kNone;
  uint64_t arg = 0;
  std::string path;    // kWait: the file it waits for
  uint64_t nth = 0;    // 0: every hit
  uint64_t fired = 0;  // times this rule fired
};

using Rules = std::array<std::vector<Rule>, kFailpoints.size()>;

// The armed rules and hit counts of the process.
class Registry {
 public:
  static Registry& Get() {
    static Registry registry;
    return registry;
  }

  void Replace(Rules rules) {
    MutexLock lock(&mu_);
    rules_ = std::move(rules);
    hits_.fill(0);
    bool any = false;
    for (const auto& r : rules_) any |= !r.empty();
    failpoint_internal::armed.store(any, std::memory_order_relaxed);
  }

  // Counts a hit of point `i`; returns the rule that fires (its `fired`
  // after this hit) and the hit number.
  std::optional<std::pair<Rule, uint64_t>> Count(size_t i) {
    MutexLock lock(&mu_);
    uint64_t n = ++hits_[i];
    for (Rule& r : rules_[i]) {
      if (r.nth != 0 && r.nth != n) continue;
      r.fired += 1;
      return std::make_pair(r, n);
    }
    return std::nullopt;
  }

  uint64_t Hits(size_t i) {
    MutexLock lock(&mu_);
    return hits_[i];
  }

 private:
  Mutex mu_;
  Rules rules_ DCR_GUARDED_BY(mu_);
  std::array<uint64_t, kFailpoints.size()> hits_ DCR_GUARDED_BY(mu_) = {};
};

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) {
    s.remove_suffix(1);
  }
  return s;
}

// A decimal number without sign or spaces that fits 64 bits.
std::optional<uint64_t> ParseNumber(std::string_view s) {
  if (s.empty() || s.size() > 20) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (~uint64_t{0} - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

std::string ActionsOf(uint16_t mask) {
  std::string out;
  for (FailAction a :
       {FailAction::kExit, FailAction::kHang, FailAction::kDrop,
        FailAction::kDelay, FailAction::kWait, FailAction::kCorrupt,
        FailAction::kCut, FailAction::kForge}) {
    if (!(mask & FailActionBit(a))) continue;
    if (!out.empty()) out += ", ";
    out += FailActionName(a);
  }
  return out;
}

std::string KnownPoints() {
  std::string out;
  for (const FailpointInfo& p : kFailpoints) {
    if (!out.empty()) out += ", ";
    out += p.name;
  }
  return out;
}

// Parses one non-empty, trimmed rule into `rules`; the error says what is
// wrong (the caller prefixes the spec).
Status ParseRule(std::string_view part, Rules* rules) {
  // "<what> in '<part>'<hint>"
  auto bad = [&](const std::string& what, const std::string& hint = "") {
    return Status::InvalidArgument(
        fmt::format("{} in '{}'{}", what, part, hint));
  };
  size_t eq = part.find('=');
  if (eq == std::string_view::npos) {
    return Status::InvalidArgument(fmt::format(
        "'{}' is not POINT=ACTION[@N] (e.g. relay.vote=exit@2)", part));
  }
  std::string_view name = Trim(part.substr(0, eq));
  std::string_view rest = Trim(part.substr(eq + 1));
  size_t index = kFailpoints.size();
  for (size_t i = 0; i < kFailpoints.size(); ++i) {
    if (kFailpoints[i].name == name) index = i;
  }
  if (index == kFailpoints.size()) {
    return bad(fmt::format("unknown failpoint '{}'", name),
               fmt::format(" (known: {})", KnownPoints()));
  }
  Rule rule;
  size_t at = rest.find('@');
  if (at != std::string_view::npos) {
    std::string_view count = rest.substr(at + 1);
    auto n = ParseNumber(count);
    if (!n || *n == 0) {
      return bad(fmt::format("bad hit count '@{}'", count),
                 " (a whole number from 1: @1 is the first hit)");
    }
    rule.nth = *n;
    rest = rest.substr(0, at);
  }
  std::string_view action = rest;
  std::optional<std::string_view> arg;
  size_t open = rest.find('(');
  if (open != std::string_view::npos) {
    action = rest.substr(0, open);
    size_t close = rest.find(')', open);
    if (close == std::string_view::npos) return bad("unclosed '('");
    if (close + 1 != rest.size()) {
      return bad(
          fmt::format("unexpected '{}' after ')'", rest.substr(close + 1)));
    }
    arg = rest.substr(open + 1, close - open - 1);
  }
  static constexpr std::pair<std::string_view, FailAction> kNames[] = {
      {"exit", FailAction::kExit},       {"hang", FailAction::kHang},
      {"drop", FailAction::kDrop},       {"delay", FailAction::kDelay},
      {"corrupt", FailAction::kCorrupt}, {"cut", FailAction::kCut},
      {"forge", FailAction::kForge},     {"wait", FailAction::kWait}};
  for (const auto& [n, a] : kNames) {
    if (n == action) rule.action = a;
  }
  if (rule.action == FailAction::kNone) {
    return bad(action.empty() ? std::string("no action")
                              : fmt::format("unknown action '{}'", action),
               fmt::format(" (actions: {})", kActionList));
  }
  const FailpointInfo& info = kFailpoints[index];
  if (!(info.actions & FailActionBit(rule.action))) {
    return bad(fmt::format("{} does not take {}", info.name, action),
               fmt::format(" (it takes {})", ActionsOf(info.actions)));
  }
  switch (rule.action) {
    case FailAction::kDelay:
    case FailAction::kCut: {
      const char* unit =
          rule.action == FailAction::kDelay ? "milliseconds" : "bytes";
      const char* example =
          rule.action == FailAction::kDelay ? "delay(100)" : "cut(4096)";
      if (!arg) {
        return bad(fmt::format("{} needs a number of {}", action, unit),
                   fmt::format(", e.g. {}", example));
      }
      auto v = ParseNumber(*arg);
      if (!v) {
        return bad(fmt::format("bad argument '{}' of {}", *arg, action),
                   fmt::format(" (a whole number of {})", unit));
      }
      if (rule.action == FailAction::kDelay && *v > kMaxDelayMs) {
        return bad(fmt::format("delay({}) is over an hour", *v), " (use hang)");
      }
      rule.arg = *v;
      break;
    }
    case FailAction::kWait:
      // '@' and ';' were split off above, so a path holding them never
      // gets here whole: it fails the absolute-path check or names
      // another file, and is documented as not allowed.
      if (!arg || arg->empty() || arg->front() != '/') {
        return bad("wait needs the absolute path of a file",
                   ", e.g. wait(/tmp/go): it blocks until the file exists");
      }
      rule.path = std::string(*arg);
      break;
    case FailAction::kCorrupt:
      rule.arg = FailpointHit::kCorruptMiddle;
      if (arg) {
        auto v = ParseNumber(*arg);
        if (!v) {
          return bad(fmt::format("bad argument '{}' of corrupt", *arg),
                     " (a byte offset, a whole number)");
        }
        rule.arg = *v;
      }
      break;
    default:
      if (arg) return bad(fmt::format("{} takes no argument", action));
      break;
  }
  (*rules)[index].push_back(rule);
  return Status::OK();
}

Result<Rules> ParseSpec(std::string_view spec) {
  Rules rules;
  while (true) {
    size_t semi = spec.find(';');
    std::string_view part = Trim(spec.substr(0, semi));
    if (!part.empty()) DCR_RETURN_IF_ERROR(ParseRule(part, &rules));
    if (semi == std::string_view::npos) break;
    spec.remove_prefix(semi + 1);
  }
  return rules;
}

Status Arm(std::string_view spec, std::string_view label) {
  auto rules = ParseSpec(spec);
  if (!rules.ok()) {
    return Status::InvalidArgument(
        fmt::format("{}\"{}\": {}", label, spec, rules.status().message()));
  }
  Registry::Get().Replace(*std::move(rules));
  return Status::OK();
}

void FlushLogs() {
  if (auto logger = spdlog::default_logger()) logger->flush();
  std::fflush(nullptr);
}

}  // namespace

std::string_view FailActionName(FailAction action) {
  switch (action) {
    case FailAction::kNone:
      return "none";
    case FailAction::kExit:
      return "exit";
    case FailAction::kHang:
      return "hang";
    case FailAction::kDrop:
      return "drop";
    case FailAction::kDelay:
      return "delay";
    case FailAction::kCorrupt:
      return "corrupt";
    case FailAction::kCut:
      return "cut";
    case FailAction::kForge:
      return "forge";
    case FailAction::kWait:
      return "wait";
  }
  return "?";
}

void FailpointHit::Corrupt(std::span<std::byte> bytes) const {
  if (action != FailAction::kCorrupt || bytes.empty()) return;
  size_t at = arg == kCorruptMiddle ? bytes.size() / 2
                                    : std::min<uint64_t>(arg, bytes.size() - 1);
  bytes[at] ^= std::byte{0xff};
}

namespace failpoint_internal {

FailpointHit Hit(FailpointId id) {
  size_t i = static_cast<size_t>(id);
  auto fired = Registry::Get().Count(i);
  if (!fired) return {};
  const auto& [rule, n] = *fired;
  std::string_view name = kFailpoints[i].name;
  switch (rule.action) {
    case FailAction::kExit:
      spdlog::error("failpoint {} (hit {}): exiting with code {}", name, n,
                    kFailpointExitCode);
      FlushLogs();
      ::_exit(kFailpointExitCode);
    case FailAction::kHang:
      spdlog::error("failpoint {} (hit {}): hanging until killed", name, n);
      FlushLogs();
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    default:
      break;
  }
  // Rules that fire at every hit would flood the log: the first firing is a
  // warning, the rest debug detail.
  spdlog::log(
      rule.fired == 1 ? spdlog::level::warn : spdlog::level::debug,
      "failpoint {} (hit {}): {}{}", name, n, FailActionName(rule.action),
      rule.action == FailAction::kDelay || rule.action == FailAction::kCut
          ? fmt::format("({})", rule.arg)
      : rule.action == FailAction::kWait ? fmt::format("({})", rule.path)
                                         : std::string());
  if (rule.action == FailAction::kDelay) {
    std::this_thread::sleep_for(std::chrono::milliseconds(rule.arg));
    return {};
  }
  if (rule.action == FailAction::kWait) {
    const auto give_up = std::chrono::steady_clock::now() +
                         std::chrono::milliseconds(kMaxDelayMs);
    while (::access(rule.path.c_str(), F_OK) != 0) {
      if (std::chrono::steady_clock::now() >= give_up) {
        spdlog::error(
            "failpoint {} (hit {}): {} did not appear within an "
            "hour; carrying on",
            name, n, rule.path);
        break;
      }
      std::this_thread::sleep_for(kWaitPoll);
    }
    return {};
  }
  return FailpointHit{rule.action, rule.arg};
}

}  // namespace failpoint_internal

Status InitFailpointsFromEnv() {
  const char* spec = std::getenv("DCR_FAILPOINTS");
  if (spec == nullptr || *spec == '\0') return Status::OK();
  return Arm(spec, "DCR_FAILPOINTS=");
}

Status ArmFailpoints(std::string_view spec) { return Arm(spec, "failpoints "); }

void DisarmFailpoints() { Registry::Get().Replace(Rules()); }

uint64_t TEST_FailpointHits(FailpointId id) {
  return Registry::Get().Hits(static_cast<size_t>(id));
}

}  // namespace dcr
