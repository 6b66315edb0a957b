// The relay's end of the pause protocol's socket (docs/PROTOCOL.md §"The
// pause protocol"): a Unix stream socket that one serving process at a
// time attaches to, speaking serving/pause_messages.h's lines.
//
// Thread safety: Send and Detach may be called from any thread; the
// handler runs on the port's own thread (the relay posts it on to its
// actor). Destruction stops the thread and removes the socket file.
#ifndef DCR_RELAY_SERVING_PORT_H_
#define DCR_RELAY_SERVING_PORT_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/file.h"
#include "common/mutex.h"
#include "dcr/status.h"
#include "serving/pause_messages.h"

namespace dcr {

class ServingPort {
 public:
  struct Event {
    enum class Kind { kAttached, kMessage, kDetached };
    Kind kind = Kind::kAttached;
    uint64_t connection = 0;  // numbers the attachments, from 1
    PauseMsg msg;             // kMessage
    std::string detail;       // kDetached: why
    // When the port's thread read it: the actor may handle it later.
    std::chrono::steady_clock::time_point at = std::chrono::steady_clock::now();
  };
  using Handler = std::function<void(Event)>;

  // Listens on `path`, replacing a socket file a dead relay left there
  // (anything else at the path is refused). "<path>.lock", flocked for
  // the port's life, says whether a live relay owns the path: a second
  // relay given it fails without touching the socket.
  static Result<std::unique_ptr<ServingPort>> Listen(const std::string& path,
                                                     Handler handler);
  ~ServingPort();
  ServingPort(const ServingPort&) = delete;
  ServingPort& operator=(const ServingPort&) = delete;

  const std::string& path() const { return path_; }
  // To the attached server, if `connection` is still the attached one;
  // a send that fails detaches it.
  void Send(uint64_t connection, const PauseMsg& msg) DCR_EXCLUDES(mu_);
  // Closes the attachment `connection` (a kDetached event follows).
  void Detach(uint64_t connection, const std::string& why) DCR_EXCLUDES(mu_);

 private:
  ServingPort(std::string path, UniqueFd lock, UniqueFd listener, UniqueFd wake,
              Handler handler);
  void Run();
  void Accept();
  void Read();
  void CloseClient(std::string why) DCR_REQUIRES(mu_);

  const std::string path_;
  UniqueFd lock_;
  UniqueFd listener_;
  UniqueFd wake_;  // an eventfd: Stop and Detach wake the thread
  Handler handler_;
  std::atomic<bool> stopping_{false};
  Mutex mu_;
  UniqueFd client_ DCR_GUARDED_BY(mu_);
  uint64_t connection_ DCR_GUARDED_BY(mu_) = 0;
  std::string detach_why_ DCR_GUARDED_BY(mu_);  // set by Detach
  std::string in_;  // the port thread's: a partial line
  std::thread thread_;
};

}  // namespace dcr

#endif  // DCR_RELAY_SERVING_PORT_H_
