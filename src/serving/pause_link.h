// The serving process's end of the pause protocol's socket
// (serving/pause_messages.h): connects to the relay, sends lines and
// collects the complete ones received, never blocking on the relay except
// in Wait().
//
// Thread safety: one thread at a time (the serving loop).
#ifndef DCR_SERVING_PAUSE_LINK_H_
#define DCR_SERVING_PAUSE_LINK_H_

#include <chrono>
#include <string>
#include <vector>

#include "common/file.h"
#include "serving/pause_messages.h"

namespace dcr {

class PauseLink {
 public:
  explicit PauseLink(std::string path) : path_(std::move(path)) {}

  bool connected() const { return fd_.valid(); }

  // Connects unless connected or tried within the last 200 ms; true iff a
  // new connection was made.
  bool MaybeConnect();
  // Sends one message (a send that fails closes the link).
  void Send(const PauseMsg& msg);
  // The complete lines received so far; closes on EOF, an error or a line
  // that is too long. Lines that are not messages are skipped.
  std::vector<PauseMsg> Receive();
  // Closes the link, and makes MaybeConnect wait `wait` before the next
  // try.
  void Close(std::chrono::milliseconds wait);
  // Waits up to `wait` for something to read (or the link closing); false
  // at the timeout or when not connected.
  bool Wait(std::chrono::milliseconds wait) const;

 private:
  std::string path_;
  UniqueFd fd_;
  std::string in_;
  std::chrono::steady_clock::time_point next_try_{};
};

}  // namespace dcr

#endif  // DCR_SERVING_PAUSE_LINK_H_
