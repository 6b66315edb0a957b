#include "cli/refit_progress.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "common/bytes.h"

namespace dcr::cli {
namespace {

bool Transfers(const std::string& phase) {
  return phase == "stream" || phase == "repair";
}

// Bytes done and the total (estimated while the stream is still being
// produced: its payload so far scaled by the diff's progress), and whether
// the total is an estimate. `done` counts delivered bytes where the relays
// report them, else bytes sent.
struct Figures {
  uint64_t done = 0;
  uint64_t total = 0;
  bool estimate = false;
  bool extrapolated = false;  // the estimate follows the diff's progress
  bool delivered = false;
};

Figures FiguresOf(const RefitOptions::Progress& p) {
  Figures f;
  f.delivered = p.delivered_bytes.has_value();
  f.done = p.delivered_bytes.value_or(p.payload_bytes);
  f.total = p.payload_bytes;
  if (!p.payload_final) {
    f.estimate = true;
    if (p.scanned_bytes > 0 && p.total_bytes > p.scanned_bytes) {
      f.total = static_cast<uint64_t>(static_cast<double>(p.payload_bytes) *
                                      p.total_bytes / p.scanned_bytes);
      f.extrapolated = true;
    }
  }
  if (f.total < f.done) f.total = f.done;
  return f;
}

}  // namespace

RefitProgress::RefitProgress(std::string what, Style style, std::FILE* out)
    : what_(std::move(what)),
      style_(style),
      out_(out),
      // A bar or a line only once the refit has run for an interval: a
      // short refit prints nothing. JSON from the first report.
      last_print_(style == Style::kJson ? Clock::time_point() : start_) {}

RefitProgress::~RefitProgress() { Finish(); }

void RefitProgress::Update(const RefitOptions::Progress& p) {
  if (finished_) return;
  const auto now = Clock::now();
  if (have_ && p.phase != last_.phase) {
    // The phase that ended, as it ended, where it was shown at all. A
    // stream ends with the report that says everything arrived (the first
    // of the next phase: a relay's last figure comes with its vote).
    if (Transfers(last_.phase) && !Transfers(p.phase)) {
      last_.payload_bytes = p.payload_bytes;
      last_.payload_final = p.payload_final;
      last_.delivered_bytes = p.delivered_bytes;
      last_.chunks = p.chunks;
      last_.slowest_queue_bytes = p.slowest_queue_bytes;
    }
    if (printed_in_phase_ || style_ == Style::kJson) Print(/*phase_end=*/true);
    phase_start_ = now;
    printed_in_phase_ = false;
  }
  last_ = p;
  have_ = true;
  const auto interval = style_ == Style::kBar ? std::chrono::milliseconds(100)
                        : style_ == Style::kJson
                            ? std::chrono::milliseconds(250)
                            : std::chrono::milliseconds(5000);
  if (now - last_print_ >= interval) Print(false);
}

void RefitProgress::Finish() {
  if (finished_) return;
  finished_ = true;
  if (have_ && (printed_in_phase_ || style_ == Style::kJson)) Print(true);
}

std::string RefitProgress::Line() const {
  const RefitOptions::Progress& p = last_;
  const double secs =
      std::chrono::duration<double>(Clock::now() - phase_start_).count();
  std::string line = fmt::format("{} {:<6}", what_, p.phase);
  if (!Transfers(p.phase)) {
    return line + fmt::format(" {}/{} receivers answered  {:.1f}s", p.answered,
                              p.receivers, secs);
  }
  const Figures f = FiguresOf(p);
  const double rate = secs > 0 ? f.done / secs : 0;
  const double pct = f.total ? 100.0 * f.done / f.total : 0;
  std::string eta = "--";
  // No ETA from a total that is only what was sent so far (a repair
  // round's, whose size the diff's progress does not tell).
  if (rate > 0 && f.total > f.done && (!f.estimate || f.extrapolated)) {
    eta = fmt::format("{:.0f}s", (f.total - f.done) / rate);
  } else if (f.total == f.done && p.payload_final) {
    eta = "0s";
  }
  line += fmt::format(" {:5.1f}%  {} / {}{} {}  {}/s  ETA {}  {:.1f}s", pct,
                      HumanBytes(f.done), f.estimate ? "~" : "",
                      HumanBytes(f.total), f.delivered ? "applied" : "sent",
                      HumanBytes(static_cast<uint64_t>(rate)), eta, secs);
  std::string detail;
  if (!p.payload_final && p.total_bytes > 0) {
    detail +=
        fmt::format("  diff {:.0f}%", 100.0 * p.scanned_bytes /
                                          std::max<uint64_t>(p.total_bytes, 1));
  }
  detail += fmt::format("  {} chunks", p.chunks);
  if (!p.slowest.empty() && p.slowest_queue_bytes > 0) {
    detail += fmt::format("  slowest {} ({} queued)", p.slowest,
                          HumanBytes(p.slowest_queue_bytes));
  }
  return line + detail;
}

std::string RefitProgress::Json() const {
  const RefitOptions::Progress& p = last_;
  const auto now = Clock::now();
  nlohmann::json j = {
      {"time", std::chrono::duration<double>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count()},
      {"elapsed", std::chrono::duration<double>(now - start_).count()},
      {"phase", p.phase},
      {"phase_elapsed",
       std::chrono::duration<double>(now - phase_start_).count()},
      {"scanned_bytes", p.scanned_bytes},
      {"total_bytes", p.total_bytes},
      {"payload_bytes", p.payload_bytes},
      {"payload_final", p.payload_final},
      {"chunks", p.chunks},
      {"delivered_bytes", p.delivered_bytes ? nlohmann::json(*p.delivered_bytes)
                                            : nlohmann::json(nullptr)},
      {"answered", p.answered},
      {"receivers", p.receivers},
      {"slowest", p.slowest},
      {"slowest_queue_bytes", p.slowest_queue_bytes}};
  return j.dump();
}

void RefitProgress::Print(bool phase_end) {
  last_print_ = Clock::now();
  printed_in_phase_ = true;
  switch (style_) {
    case Style::kJson:
      std::fprintf(out_, "%s\n", Json().c_str());
      break;
    case Style::kLines:
      std::fprintf(out_, "%s\n", Line().c_str());
      break;
    case Style::kBar:
      std::fprintf(out_, "\r\033[K%s%s", Line().c_str(), phase_end ? "\n" : "");
      drawn_ = !phase_end;
      break;
  }
  std::fflush(out_);
}

}  // namespace dcr::cli
