// Prometheus metrics: the text exposition format 0.0.4 and a minimal HTTP
// endpoint that serves it.
//
// MetricsText builds one scrape's text; the caller owns the numbers and
// renders them on demand (there is no registry of live metrics here).
// MetricsServer answers GET /metrics on its own thread with whatever its
// render function returns at that moment.
//
// Thread safety: a MetricsText is a value used by one thread at a time.
// MetricsServer::port, Stop and the destructor may be called from any
// thread except the server's own (that is, not from `render`).
#ifndef DCR_COMMON_METRICS_H_
#define DCR_COMMON_METRICS_H_

#include <concepts>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <unordered_set>
#include <utility>

#include "common/file.h"
#include "common/mutex.h"
#include "dcr/status.h"

namespace dcr {

// Builds Prometheus text exposition format 0.0.4:
//
//   # HELP dcr_bytes_sent_total Bytes written to children.
//   # TYPE dcr_bytes_sent_total counter
//   dcr_bytes_sent_total{peer="10.0.0.2:7000"} 123456
//
// Names and label names are the caller's constants and are not checked
// (they must match [a-zA-Z_:][a-zA-Z0-9_:]*); label values and help texts
// may be anything and are escaped here.
class MetricsText {
 public:
  using Labels =
      std::initializer_list<std::pair<std::string_view, std::string_view>>;

  // Emits "# HELP name help" and "# TYPE name type" (type: "counter" or
  // "gauge"), once per family: a second call for the same name adds
  // nothing. Call it before the samples of that family.
  void Family(std::string_view name, std::string_view type,
              std::string_view help);

  // One sample line: name{k="v",...} value. Label values are escaped
  // (backslash, double quote, newline); without labels no braces are
  // written. Doubles are written in their shortest round-trip form, NaN,
  // +Inf and -Inf as Prometheus spells them; integers exactly.
  void Sample(std::string_view name, double value, Labels labels = {});
  void Sample(std::string_view name, uint64_t value, Labels labels = {});
  // Any other integer type (so Sample("x", 1) is not ambiguous).
  template <std::integral T>
  requires(!std::same_as<T, bool> && !std::same_as<T, uint64_t>) void Sample(
      std::string_view name, T value, Labels labels = {}) {
    if constexpr (std::is_signed_v<T>) {
      SampleSigned(name, static_cast<int64_t>(value), labels);
    } else {
      Sample(name, static_cast<uint64_t>(value), labels);
    }
  }

  const std::string& str() const { return text_; }

 private:
  void SampleSigned(std::string_view name, int64_t value, Labels labels);
  void AppendNameAndLabels(std::string_view name, Labels labels);

  std::string text_;
  std::unordered_set<std::string> families_;
};

// A minimal HTTP/1.1 server for GET /metrics, one connection at a time
// (Connection: close), on plain POSIX sockets.
//
// Each request is read with a size bound (8 KiB) and a per-connection
// deadline (2 s), so a slow or silent client delays the next scrape by at
// most that. Answers: 200 with Content-Type "text/plain; version=0.0.4;
// charset=utf-8" and the text `render` returns (called on the server
// thread for each scrape) for GET or HEAD /metrics (a query string is
// ignored); 404 for another path; 405 for another method; 400 for a
// request that does not parse or exceeds the bound. A silent client is
// closed without an answer when its deadline passes.
class MetricsServer {
 public:
  // Listens on host:port (port 0: an ephemeral one, see port()) and starts
  // the server thread. Errors name host:port, e.g. "metrics: cannot listen
  // on 127.0.0.1:9100: Address already in use".
  static Result<std::unique_ptr<MetricsServer>> Start(
      std::string_view host, uint16_t port,
      std::function<std::string()> render);

  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The bound port.
  uint16_t port() const { return port_; }

  // Wakes the server thread (also out of a connection in progress), joins
  // it and closes the listener. Idempotent; the destructor calls it.
  void Stop();

 private:
  MetricsServer(UniqueFd listen_fd, UniqueFd wake_fd, uint16_t port,
                std::function<std::string()> render);

  void Run();
  // Serves one accepted connection; returns false when woken by Stop.
  bool Serve(int fd);

  UniqueFd listen_fd_;
  UniqueFd wake_fd_;  // an eventfd; readable once Stop was called
  const uint16_t port_;
  std::function<std::string()> render_;
  Mutex stop_mu_;  // serializes Stop
  std::thread thread_ DCR_GUARDED_BY(stop_mu_);
};

}  // namespace dcr

#endif  // DCR_COMMON_METRICS_H_
