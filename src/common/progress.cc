#include "common/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

#include "common/bytes.h"

namespace dcr {

Progress::Progress(std::string what, uint64_t total, bool enabled)
    : what_(std::move(what)),
      total_(total),
      enabled_(enabled),
      tty_(::isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()),
      last_print_(start_) {}

Progress::~Progress() { Finish(); }

void Progress::Add(uint64_t bytes) {
  done_.fetch_add(bytes, std::memory_order_relaxed);
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  // Whoever holds the lock is printing already: skip rather than queue.
  if (!mu_.TryLock()) return;
  auto interval =
      tty_ ? std::chrono::milliseconds(100) : std::chrono::milliseconds(5000);
  if (!finished_ && now - last_print_ >= interval) {
    last_print_ = now;
    Print(false);
  }
  mu_.Unlock();
}

void Progress::SetDetail(std::string detail) {
  MutexLock lock(&mu_);
  detail_ = std::move(detail);
}

void Progress::Finish() {
  MutexLock lock(&mu_);
  if (finished_) return;
  finished_ = true;
  // Short operations finish silently unless something was already drawn.
  if (enabled_ && last_print_ != start_) Print(true);
}

void Progress::Print(bool final_line) {
  uint64_t done = done_.load(std::memory_order_relaxed);
  double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_)
          .count();
  double rate = secs > 0 ? done / secs : 0;
  double pct = total_ ? 100.0 * done / total_ : 100.0;
  std::string eta = "--";
  if (rate > 0 && total_ > done) {
    eta = fmt::format("{:.0f}s", (total_ - done) / rate);
  }
  std::string line = fmt::format("{}: {:5.1f}% {} / {}  {}/s  ETA {}", what_,
                                 pct, HumanBytes(done), HumanBytes(total_),
                                 HumanBytes(static_cast<uint64_t>(rate)), eta);
  if (!detail_.empty()) line += "  " + detail_;
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s%s", line.c_str(), final_line ? "\n" : "");
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
}

}  // namespace dcr
