// dcr refit's progress on stderr, from RefitOptions::on_progress: each
// phase with its own figures, counted where the bytes have arrived, not
// where they were queued (docs/PROTOCOL.md §"Progress").
//
//   stream  chunk bytes every receiver applied, of the payload (estimated
//           from the diff's progress until the last chunk is queued, "~"),
//           their rate and the time left; the diff's progress and the
//           slowest child's queue as detail
//   vote    receivers that answered, of all
//   repair  as stream, for the repair round's overwrites
//   commit, abort  receivers that answered, of all
//
// Styles: a redrawn bar on a terminal (each phase's last state kept on its
// own line), a plain line every 5 s and at each phase's end otherwise, or
// one JSON object per line at most every 250 ms and at each phase's end
// (--progress json: for a harness that parses it).
//
// Thread safety: not thread-safe; the coordinator thread calls it.
#ifndef DCR_CLI_REFIT_PROGRESS_H_
#define DCR_CLI_REFIT_PROGRESS_H_

#include <chrono>
#include <cstdio>
#include <string>

#include "dcr/refit.h"

namespace dcr::cli {

class RefitProgress {
 public:
  enum class Style { kBar, kLines, kJson };

  // `what`: "refit" or "refit --full". `out`: where to write (stderr).
  RefitProgress(std::string what, Style style, std::FILE* out = stderr);
  ~RefitProgress();  // Finish()

  // The figures of one report.
  void Update(const RefitOptions::Progress& p);
  // Prints the last state and ends the line. Idempotent.
  void Finish();

 private:
  using Clock = std::chrono::steady_clock;
  void Print(bool phase_end);
  std::string Line() const;
  std::string Json() const;

  const std::string what_;
  const Style style_;
  std::FILE* out_;
  RefitOptions::Progress last_;
  bool have_ = false;
  bool finished_ = false;
  bool drawn_ = false;  // a bar line is open (kBar)
  bool printed_in_phase_ = false;
  Clock::time_point start_ = Clock::now();
  Clock::time_point phase_start_ = start_;
  Clock::time_point last_print_;
};

}  // namespace dcr::cli

#endif  // DCR_CLI_REFIT_PROGRESS_H_
