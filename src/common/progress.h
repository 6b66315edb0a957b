// Progress of a long operation on stderr: a redrawn line on a terminal,
// a plain line every few seconds otherwise, nothing when disabled.
//
// Thread safety: Add() may be called from any thread; the other methods
// from the owning thread.
#ifndef DCR_COMMON_PROGRESS_H_
#define DCR_COMMON_PROGRESS_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "common/mutex.h"

namespace dcr {

class Progress {
 public:
  // `total` bytes of work labelled `what` ("diff", "apply"). When
  // `enabled` is false nothing is ever printed.
  Progress(std::string what, uint64_t total, bool enabled);
  ~Progress();

  // Records `bytes` more of work done; redraws at most every 100 ms on a
  // terminal, prints a line at most every 5 s otherwise.
  void Add(uint64_t bytes);
  // Text shown after the figures ("payload 12 MiB, slowest a3"); replaces
  // the previous detail.
  void SetDetail(std::string detail);
  // Prints the final state and ends the line.
  void Finish();

 private:
  void Print(bool final_line) DCR_REQUIRES(mu_);

  std::string what_;
  uint64_t total_;
  bool enabled_;
  bool tty_;
  std::atomic<uint64_t> done_{0};
  std::chrono::steady_clock::time_point start_;
  Mutex mu_;
  std::chrono::steady_clock::time_point last_print_ DCR_GUARDED_BY(mu_);
  bool finished_ DCR_GUARDED_BY(mu_) = false;
  std::string detail_ DCR_GUARDED_BY(mu_);
};

}  // namespace dcr

#endif  // DCR_COMMON_PROGRESS_H_
