// The relay daemon's engine (what `dcr-relay` runs): listens for its
// parent, takes part in one refit at a time, and forwards every frame of the
// refit to its children while applying chunks to its store in place.
//
// One refit, as seen by a relay (docs/PROTOCOL.md §"Relay states"):
//   PLAN     bind the plan to the store (RefitSession::Begin), or refuse for
//            itself (needs catch-up, manifest mismatch, busy) while still
//            serving its subtree; connect to its children and pass each its
//            sub-plan; answer PLAN_REPLY for its subtree.
//   CHUNK    forward the same buffer to every child first (cut-through),
//            then hand it to the apply workers. When a child's send queue
//            passes the plan's window, or the local apply backlog passes
//            apply_window_bytes, the relay stops reading from its parent
//            until both fall below half, so backpressure travels up the
//            tree and memory stays bounded by the windows.
//   END      forward; when every apply finished, vote (digests of the
//            store); answer VOTE for its subtree once the children voted or
//            their deadline passed.
//   COMMIT   forward; commit if named in the commit set, else restore the
//            base; answer COMMIT_REPLY.
//   ABORT    forward; restore the base; answer ABORT_REPLY.
// If its parent's link closes before COMMIT, the relay restores the base and
// closes its children's links (they do the same). A node without a store
// (its file does not exist yet) joins full refits, whose plan carries the
// manifest, by creating the store; it refuses delta refits.
//
// Clients (dcr status) may connect at any time: HELLO then STATUS_REQUEST
// gets a STATUS_REPLY with the node's committed version and last result.
//
// Thread safety: Stats() and Stop() may be called from any thread.
#ifndef DCR_RELAY_RELAY_H_
#define DCR_RELAY_RELAY_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dcr/objstore.h"
#include "dcr/status.h"
#include "dcr/store.h"
#include "dcr/transport.h"
#include "dcr/version.h"
#include "relay/relay_stats.h"
#include "wire/signature.h"

namespace dcr {

struct RelayOptions {
  std::string name;  // the node's name in the topology
  // The object store this relay pulls a refit's chunks from when its PLAN
  // says so (the head of a source: objstore cluster); null: none, and such
  // a PLAN is refused.
  std::shared_ptr<ObjectStore> objects;
  StoreSpec store;
  std::string listen_host = "0.0.0.0";
  uint16_t listen_port = 0;  // 0: ephemeral (see Relay::port)
  // The kind of link it listens on (topology `transport` of the link into
  // it); children are reached with their own kind. With
  // transport_options.fake_network every link is "fake".
  std::string transport = "tcp";
  // Frame bounds, watermarks, fake network, send rate limit.
  TransportOptions transport_options;
  // Threads applying chunks (and hashing for the vote).
  size_t apply_threads = 2;  // dcr-relay: kDefaultApplyThreads (dcr/topology.h)
  // Chunk bytes received and not yet applied before the relay stops reading
  // from its parent.
  uint64_t apply_window_bytes = 64ull << 20;
  std::chrono::milliseconds connect_timeout{5000};
  // After voting, how long a relay whose parent left waits for the
  // decision (a new parent, or `dcr refit --resume`) before it restores
  // its base. Before voting it waits the plan's phase timeout to be
  // adopted.
  std::chrono::milliseconds prepared_wait{600000};
  // Set from the topology (dcr-relay --topology). plan_senders: the nodes
  // that may send this relay a PLAN, its ancestors in the tree (the root
  // and the relays on its path; adoptions come from them too); a PLAN from
  // any other node is refused. peer_addresses: the IP addresses (as
  // Link::peer() prints them, without the port) connections may come from,
  // the topology's hosts; any other connection is closed at its first
  // frame. Empty: no limit.
  std::vector<std::string> plan_senders;
  std::vector<std::string> peer_addresses;
  // The topology's node names (root included): a HELLO naming another
  // node is refused (relay/inbound_links.h). Empty: any name.
  std::vector<std::string> known_nodes;
  // An inbound link that has not sent a valid HELLO within hello_timeout,
  // or that greeted and then sent no frame for idle_timeout (unless it is
  // the refit's parent, or the relay stopped reading it), is cut off
  // (0: never).
  std::chrono::milliseconds hello_timeout{10000};
  std::chrono::milliseconds idle_timeout{60000};
  // The root's Ed25519 public key (defaults.signing_public_key_file,
  // --signing-public-key-file). With it the apply workers hash every chunk
  // they apply, and the relay votes yes only if END carries a manifest the
  // root signed for this refit that lists each of them (docs/PROTOCOL.md
  // §"Signed refits"); else it votes no (rejected). Null: END's manifest,
  // if any, is ignored.
  std::shared_ptr<const Ed25519PublicKey> signing_public_key;
  // The resend buffer of recent CHUNK frames kept for adopted children
  // (Fanout::Options::resend_buffer_bytes): unset, 4 times the plan's
  // window; 0 turns it off.
  std::optional<uint64_t> resend_buffer_bytes;
  // Per-peer limits on inbound links (0: none). At most max_inbound_links
  // accepted links are open at once; more are closed as they open. A link
  // whose frames wait for the relay's thread with more than
  // inbound_quota_bytes is not read until they fall to half.
  size_t max_inbound_links = 0;
  uint64_t inbound_quota_bytes = 0;
  // The most bytes queued to a child before the relay stops reading from
  // its parent, whatever window the plan names (0: the plan's).
  uint64_t forward_window_cap = 0;
  // A cap on the relay's memory outside its store (dcr-relay
  // --memory-limit; 0: none). Start sizes the bounds above, the apply
  // window, the resend buffer and the frame bound from it
  // (relay/memory_budget.h), each lowered, never raised, and refuses a cap
  // too small to work.
  uint64_t memory_limit_bytes = 0;
  // Where a refit's journal lives (session/journal.h, kept across a crash of
  // the process); empty: beside the store's version record. A full
  // refit's journal holds every value it replaced, up to the store's
  // size: a store in shared memory keeps it on a disk this way. Start
  // fails if the directory is not writable.
  std::string undo_dir;
  // A serving relay (topology `serving`; docs/PLACEMENT.md §"Serving
  // relays"): the store holds rank `serving_rank` of the serving layout
  // file `serving_layout` (its shards, FP8 codes, scales and shadows) and
  // applies the canonical chunks it forwards through the rank's map.
  // Empty: the store holds the canonical checkpoint. Start fails if the
  // layout cannot be read, the rank is not one of it, or an existing
  // store does not hold the rank's shards.
  std::string serving_layout;
  uint32_t serving_rank = 0;
  // A serving process computes on the store (topology `serving.socket`;
  // include/dcr/serving.h, docs/PROTOCOL.md §"The pause protocol"): the
  // relay keeps the shm store as two images, stages refits on the standby
  // one, flips at COMMIT and speaks the pause protocol on this Unix
  // socket. A yes vote waits up to `serving_deadline` for the attached
  // server's ready, else it is a no. Empty: one image, no server.
  std::string serving_socket;
  std::chrono::milliseconds serving_deadline{5000};
  // A command run after each refit this relay commits (relay/commit_hook.h:
  // /bin/sh -c, DCR_STEP and the rest in its environment, on a thread of
  // its own, killed after `on_commit_timeout`). Empty: none.
  std::string on_commit;
  std::chrono::milliseconds on_commit_timeout{60000};
};

class Relay {
 public:
  // Opens the store (a missing file or shm object leaves the relay without
  // one until a full refit creates it), starts the transport and listens.
  // Errors name what failed: the store, the address.
  static Result<std::unique_ptr<Relay>> Start(RelayOptions options);
  ~Relay();  // Stop()
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  uint16_t port() const;
  RelayStats Stats() const;
  // How long ago the relay's event loop last turned. It turns at least every
  // 200 ms while the relay is healthy (idle included); a watchdog
  // (dcr-relay under systemd's WatchdogSec=) reads a longer time as hung.
  std::chrono::steady_clock::duration SinceLoopTurn() const;

  // Restores the base bits of a refit in progress, closes every link and
  // joins the threads. Idempotent.
  void Stop();

 private:
  class Impl;
  explicit Relay(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dcr

#endif  // DCR_RELAY_RELAY_H_
