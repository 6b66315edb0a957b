#include "transport/transport_set.h"

#include <fmt/format.h>

#include <vector>

namespace dcr {

TransportSet::TransportSet(TransportOptions options, std::string force_kind)
    : options_(std::move(options)), force_kind_(std::move(force_kind)) {}

TransportSet::~TransportSet() { Stop(); }

Result<Transport*> TransportSet::Get(std::string_view kind) {
  if (!force_kind_.empty()) kind = force_kind_;
  MutexLock lock(&mu_);
  if (stopped_) {
    return Status::Aborted(
        fmt::format("the {} transport is stopped (shutting down)", kind));
  }
  if (auto it = transports_.find(kind); it != transports_.end()) {
    return it->second.get();
  }
  if (kind == "ucx" && options_.tls.enabled()) {
    return Status::Unsupported(
        "this tree has TLS configured (defaults.tls_*_file) and a link with "
        "transport ucx, which has no TLS: make that link tcp, or drop TLS");
  }
  if (kind == "ucx" && options_.max_send_bps != 0) {
    return Status::Unsupported(
        "a link rate (--link-rate) paces TCP links only; a link with "
        "transport ucx cannot be paced");
  }
  auto t = CreateTransport(kind, options_);
  if (!t.ok()) return t.status();
  Transport* raw = t->get();
  transports_.emplace(std::string(kind), *std::move(t));
  return raw;
}

Transport* TransportSet::Find(std::string_view kind) const {
  if (!force_kind_.empty()) kind = force_kind_;
  MutexLock lock(&mu_);
  auto it = transports_.find(kind);
  return it == transports_.end() ? nullptr : it->second.get();
}

void TransportSet::Stop() {
  // Stopped outside the lock: a transport's last callbacks may ask for
  // another one (and get Aborted). They stay allocated (links may still
  // reference their transport) until the set goes.
  std::vector<Transport*> all;
  {
    MutexLock lock(&mu_);
    stopped_ = true;
    for (auto& [kind, t] : transports_) all.push_back(t.get());
  }
  for (Transport* t : all) t->Stop();
}

}  // namespace dcr
