// The transports of one node, one per backend kind, created on first use
// with the same options. A relay listens on the kind of the link into it
// (topology `transport`) and connects to each child with the kind of the
// link into that child, so a mixed tree (TCP across the WAN, UCX inside a
// cluster) needs up to one transport of each kind per node.
//
// Thread safety: Get, Find and Stop may be called from any thread, but not
// from the event thread of a transport of the set (Stop joins them).
#ifndef DCR_TRANSPORT_TRANSPORT_SET_H_
#define DCR_TRANSPORT_TRANSPORT_SET_H_

#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "common/mutex.h"
#include "dcr/status.h"
#include "dcr/transport.h"

namespace dcr {

class TransportSet {
 public:
  // `force_kind` non-empty: every Get answers a transport of that kind
  // whatever kind is asked for (tests run whole trees on "fake").
  explicit TransportSet(TransportOptions options, std::string force_kind = {});
  ~TransportSet();  // Stop()
  TransportSet(const TransportSet&) = delete;
  TransportSet& operator=(const TransportSet&) = delete;

  // The transport of `kind` ("tcp", "ucx", ...), created on first use by
  // CreateTransport with the set's options. Options that only TCP has (TLS,
  // max_send_bps) make a "ucx" transport fail with Unsupported, saying
  // which: a tree that asks for TLS gets no unencrypted UCX links. The
  // error is returned again on every call (nothing is cached).
  Result<Transport*> Get(std::string_view kind);
  // The transport of `kind` if it exists; null otherwise.
  Transport* Find(std::string_view kind) const;
  const TransportOptions& options() const { return options_; }

  // Stops every transport (idempotent); Get fails afterwards.
  void Stop();

 private:
  TransportOptions options_;
  std::string force_kind_;
  mutable Mutex mu_;
  std::map<std::string, std::unique_ptr<Transport>, std::less<>> transports_
      DCR_GUARDED_BY(mu_);
  bool stopped_ DCR_GUARDED_BY(mu_) = false;
};

}  // namespace dcr

#endif  // DCR_TRANSPORT_TRANSPORT_SET_H_
