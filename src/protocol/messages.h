// Payloads of the refit frames (docs/PROTOCOL.md §"Refit messages"). The
// wire layer frames bytes; these functions give the bytes meaning.
//
// Every payload starts with a u8 message version (1). Integers are
// little-endian fixed width unless marked varint (LEB128); a string is a
// varint length then UTF-8 bytes; a version is u64 step then the digest as
// u64 high, u64 low. Decoders check every length against the bytes left
// and against the limits below before allocating, and refuse trailing
// bytes: a payload decodes completely or not at all.
//
// Thread safety: values and pure functions.
#ifndef DCR_PROTOCOL_MESSAGES_H_
#define DCR_PROTOCOL_MESSAGES_H_

#include <compare>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/codec.h"
#include "dcr/digest.h"
#include "dcr/refit_codes.h"  // RefitMode, NodeCode
#include "dcr/status.h"
#include "dcr/version.h"
#include "dcr/wire.h"

namespace dcr {

inline constexpr size_t kMaxMessageString = 4096;
inline constexpr size_t kMaxPlanNodes = 1u << 16;
inline constexpr size_t kMaxPlanTensors = 1u << 20;

// Sent first on every link, by both ends.
struct HelloMsg {
  std::string node;  // the sender's name in the topology ("" for a CLI)
  uint8_t role = 0;  // kRoleRoot, kRoleRelay, kRoleClient
  uint64_t epoch = 0;
  friend bool operator==(const HelloMsg&, const HelloMsg&) = default;
};
inline constexpr uint8_t kRoleRoot = 1;
inline constexpr uint8_t kRoleRelay = 2;
inline constexpr uint8_t kRoleClient = 3;

// A node of the subtree a PLAN hands to its receiver.
struct PlanNode {
  std::string name;
  std::string host;
  uint16_t port = 0;
  std::string transport;  // "tcp", "ucx"
  int32_t parent = -1;    // index in PlanMsg::nodes; -1 only for nodes[0]
  uint64_t link_bps = 0;  // the topology's bandwidth into it (0: unknown)
  // It takes the refit's CHUNK and END frames from the object store, not
  // from its parent's link (docs/PROTOCOL.md §"Chunks through an object
  // store").
  bool pulls_objects = false;
  friend bool operator==(const PlanNode&, const PlanNode&) = default;
};

// Starts a refit. nodes[0] is the receiver itself; the rest is its subtree,
// each node after its parent.
//
// A root that hashes the target in its encoding pass does not know the
// target's digest when PLAN goes out: it sends `target` with a zero digest
// and no `target_tensor_digests`, and END names them (EndMsg::target).
// Such a PLAN is message version 2, byte for byte version 1 otherwise, so
// that a relay too old to take the digests from END refuses it at once
// (docs/PROTOCOL.md §"Target digests at END").
// A serving rank's bits at a version (docs/PLACEMENT.md §"Serving
// relays"), as the root names them for the relays whose store holds that
// rank of that serving layout.
struct ServingBits {
  Digest128 layout;  // the serving layout's Fingerprint
  uint32_t rank = 0;
  Digest128 bits;  // ReceiverMap::BitsDigest of the rank's regions
  // A target's: every canonical tensor's region digest, in manifest order
  // (what a no vote compares to name the tensors to repair). A base's:
  // empty.
  std::vector<LinearDigest> regions;
  friend bool operator==(const ServingBits&, const ServingBits&) = default;
};
// The entry of `layout`'s rank `rank` in `list`, or null.
const ServingBits* FindServing(const std::vector<ServingBits>& list,
                               const Digest128& layout, uint32_t rank);

struct PlanMsg {
  RefitMode mode = RefitMode::kDelta;
  Version base;
  Version target;
  Digest128 manifest;
  uint64_t span_elems = 0;
  uint64_t chunk_window_bytes = 0;  // forward queue bound per child
  uint32_t phase_timeout_ms = 0;    // deadline for a subtree to answer
  std::vector<PlanNode> nodes;
  // Full refits only (empty otherwise): the target's manifest, so that a
  // node without a store (a new node being seeded) can create one. Its
  // digest must equal `manifest`.
  std::vector<TensorInfo> tensors;
  // The target's per-tensor digests in manifest order (empty: not sent). A
  // receiver whose vote fails names the tensors that differ, and the root
  // repairs them with overwrite chunks.
  std::vector<Digest128> target_tensor_digests;
  // Every tree link carries a HEARTBEAT at least this often while a refit
  // runs; a link silent for 4 intervals is dropped (0: no heartbeats).
  uint32_t heartbeat_ms = 0;
  // An adoption: the receiver already holds this refit (same id) and lost
  // its parent; the sender takes over as its parent from the current
  // phase on (docs/PROTOCOL.md §"Re-parenting").
  bool adopt = false;
  // Sent by `dcr refit --resume` (with adopt): the coordinator restarted
  // and takes the refit over at a new epoch. A receiver that does not hold
  // the refit (or its final replies) refuses it; one that does moves to
  // the new epoch, which fences the old coordinator off.
  bool resume = false;
  // An adoption whose sender keeps a resend buffer (relay/fanout.h): the
  // receiver answers PLAN_REPLY with ResultsMsg::received_through, and the
  // sender resends the buffered chunks after that point.
  bool resend = false;
  // The sender's depth in the tree (root 0). An adoption is accepted from
  // a node above the receiver's current parent, or by an orphan. A node
  // that adopts on behalf of another (an orphan placed under it, see
  // docs/PROTOCOL.md §"Heartbeats and re-parenting") sends that node's depth.
  uint32_t sender_depth = 0;
  // Delta plans only: chunks may be context-coded (codec.h kContext),
  // decodable only against the base; every node of the plan holds the base
  // whole. A chunk coded so in a plan without the flag is refused. The
  // root's own plan: some child's gets it (Fanout::Options::plain_nodes).
  bool context_coded = false;
  // The serving ranks of the plan's serving relays: their bits at the base
  // (no regions), and at the target when the PLAN names it (with regions;
  // otherwise END carries them). One entry per (layout, rank).
  std::vector<ServingBits> serving_base;
  std::vector<ServingBits> serving_target;
  // The target's digest comes at END (a zero digest here).
  bool target_at_end() const { return target.digest == Digest128{}; }
  friend bool operator==(const PlanMsg&, const PlanMsg&) = default;
};

// What a relay's store holds besides its committed version, as its
// PLAN_REPLY and STATUS_REPLY say (docs/PROTOCOL.md §"Repair of a mixed
// store"): a refit left unfinished (the relay died mid-refit; the bits are
// a mix of `base` and `target`, per element), or no store at all (a shared
// memory store gone with a reboot, a store never seeded).
struct StoreCondition {
  // The store's record names this refit unfinished.
  std::optional<RefitId> unfinished;
  Version base;    // with `unfinished`
  Version target;  // with `unfinished`
  // With `unfinished`: the relay's journal shows it voted yes, and the
  // bits were verified to be `target` since; it waits for the decision.
  bool prepared = false;
  // With `unfinished` (STATUS_REPLY): a refit running here is repairing
  // it (coord/repair.h).
  bool repairing = false;
  // The store does not exist (a full refit seeds it).
  bool missing = false;
  bool empty() const { return !unfinished && !missing; }
  friend bool operator==(const StoreCondition&,
                         const StoreCondition&) = default;
};

struct NodeResult {
  std::string node;
  NodeCode code = NodeCode::kOk;
  Version version;  // committed (PLAN, COMMIT) or computed (VOTE)
  uint64_t chunks_applied = 0;
  std::string detail;
  // VOTE only: the tensors (manifest indices, ascending) whose bits differ
  // from the target; the root may resend them as overwrites.
  std::vector<uint32_t> repair;
  // PLAN_REPLY and STATUS_REPLY: the store's own condition, when it is not
  // simply a committed version.
  StoreCondition store;
  friend bool operator==(const NodeResult&, const NodeResult&) = default;
};

// Names a downward frame of a refit (the root numbers them in sending
// order; an epoch names a coordinator run). Ordered by epoch, then sequence.
struct FramePosition {
  uint64_t epoch = 0;
  uint64_t sequence = 0;
  friend auto operator<=>(const FramePosition&, const FramePosition&) = default;
};

// PLAN_REPLY, VOTE, COMMIT_REPLY, ABORT_REPLY and STATUS_REPLY carry this.
//
// A PLAN_REPLY answering an adoption PLAN with `resend` set adds the
// position of the last CHUNK its sender accepted from its parent
// ({0, 0}: none). The message is then version 2: the version-1 fields,
// then u64 epoch, u64 sequence. Without it, version 1 byte for byte.
// A node whose StoreCondition is not empty makes it version 3: the
// version-1 fields, then per node u8 flags (1: unfinished, 2: prepared,
// 4: missing, 8: repairing) and, with flag 1, the refit id, base and
// target; then u8 1 and the position, or u8 0.
struct ResultsMsg {
  std::vector<NodeResult> nodes;
  std::optional<FramePosition> received_through = std::nullopt;
  friend bool operator==(const ResultsMsg&, const ResultsMsg&) = default;
};

// After the last CHUNK: how many distinct chunk ids the root sent and a
// digest over them in ascending (tensor, span, part) order (XXH3-128 of
// u32 tensor, u32 span, u16 part per id), so a relay can tell a complete
// stream from one with losses. ChunkIdsDigest computes it.
//
// A root with a signing key adds the signed refit manifest
// (relay/refit_manifest.h): its encoded bytes and the root's Ed25519
// signature over them. END is then message version 2: the version-1 fields,
// a varint manifest length (at most kMaxEndManifestBytes) and the manifest
// bytes, then the 64-byte signature. Without them END is version 1, byte
// for byte as before. The decoder accepts both; manifest and signature are
// both present (version 2, non-empty manifest) or both empty (version 1).
//
// After a PLAN that left the target's digest to END (PlanMsg::
// target_at_end), END names the target: it is then version 3, the
// version-1 fields, the target version, a varint count and that many
// per-tensor digests (none, or one per tensor of the manifest, in order),
// u8 flags (1: signed), and with flag 1 the manifest and signature as in
// version 2.
struct EndMsg {
  EndMsg() = default;
  // Unsigned; the signed fields are set after.
  EndMsg(uint64_t count, const Digest128& ids)
      : chunk_count(count), chunk_ids_digest(ids) {}
  uint64_t chunk_count = 0;
  Digest128 chunk_ids_digest;
  std::vector<std::byte> manifest;   // empty: unsigned
  std::vector<std::byte> signature;  // kEndSignatureBytes when signed
  // Version 3: the target version and its per-tensor digests.
  std::optional<Version> target;
  std::vector<Digest128> target_tensor_digests;
  // With `target`: the serving ranks' bits at it (PlanMsg::serving_target).
  std::vector<ServingBits> serving_target;
  bool is_signed() const { return !manifest.empty(); }
  friend bool operator==(const EndMsg&, const EndMsg&) = default;
};
inline constexpr size_t kEndSignatureBytes = 64;
// The largest manifest an END carries: what fits, with the rest of END,
// in the default frame payload bound (256 MiB).
inline constexpr size_t kMaxEndManifestBytes = kDefaultMaxFramePayload - 256;

// COMMIT names the nodes that commit; the others in the receiver's
// subtree abort (restore the base) and are stale.
struct CommitMsg {
  Version target;
  std::vector<std::string> commit_set;
  friend bool operator==(const CommitMsg&, const CommitMsg&) = default;
};

struct AbortMsg {
  std::string reason;
  friend bool operator==(const AbortMsg&, const AbortMsg&) = default;
};

// HEARTBEAT from a child to its parent may carry the child's progress (a
// parent's HEARTBEAT, and a child of an older release, send none: empty
// payload). The parent's slow-child verdict (protocol/liveness.h) reads it
// to tell a slow node from a slow link. Version 1: u64 received_bytes,
// u64 backlog_bytes, u64 self_held_ms. Version 2 adds u64 delivered_bytes:
// the progress bar's figure (docs/PROTOCOL.md §"Progress").
struct ProgressMsg {
  // Bytes this relay took from its parent links in this refit: CHUNK
  // frames it handled and frames waiting for its event thread.
  uint64_t received_bytes = 0;
  // Bytes it received and has not consumed yet: frames waiting for its
  // event thread and chunks waiting for its apply workers.
  uint64_t backlog_bytes = 0;
  // In this refit, milliseconds it kept its parent link unread for reasons
  // of its own (its event thread behind, its apply window full), not for
  // its children's windows.
  uint64_t self_held_ms = 0;
  // Chunk bytes (CHUNK payloads) applied in this refit by every node of
  // the sender's subtree: the least of its own and its live children's
  // reports. nullopt from a relay of an older release (version 1).
  std::optional<uint64_t> delivered_bytes;
  friend bool operator==(const ProgressMsg&, const ProgressMsg&) = default;
};

// STREAM_MARK (root to the tree, between CHUNK frames): every CHUNK of a
// tensor below `tensor` (a manifest index) went before this frame; none
// follows in this stream. A producers' coordinator sends it as the
// ranks' merged streams move past tensors (their order is not the
// manifest's): a relay hashes a tensor ahead of the vote only below the
// last mark, where no chunk will write it again. Version 1: u32 tensor.
// Marks never decrease within a stream; a stream without them (a
// canonical root's, in manifest order) leaves the rule to the chunks'
// ids. A hint only: a relay that hashed too early hashes again at the
// vote.
struct StreamMarkMsg {
  uint32_t tensor = 0;
  friend bool operator==(const StreamMarkMsg&, const StreamMarkMsg&) = default;
};

std::vector<std::byte> EncodeHello(const HelloMsg& m);
std::vector<std::byte> EncodePlan(const PlanMsg& m);
std::vector<std::byte> EncodeResults(const ResultsMsg& m);
std::vector<std::byte> EncodeEnd(const EndMsg& m);
std::vector<std::byte> EncodeCommit(const CommitMsg& m);
std::vector<std::byte> EncodeAbort(const AbortMsg& m);
std::vector<std::byte> EncodeProgress(const ProgressMsg& m);
std::vector<std::byte> EncodeStreamMark(const StreamMarkMsg& m);

// Each returns Corruption naming the message and the field on any
// malformed, truncated, oversized or trailing input, or an unknown message
// version (1 for all; PLAN also 2; END also 2 and 3; RESULTS also 2 and
// 3; HEARTBEAT progress also 2).
Result<HelloMsg> DecodeHello(std::span<const std::byte> b);
Result<PlanMsg> DecodePlan(std::span<const std::byte> b);
Result<ResultsMsg> DecodeResults(std::span<const std::byte> b);
Result<EndMsg> DecodeEnd(std::span<const std::byte> b);
Result<CommitMsg> DecodeCommit(std::span<const std::byte> b);
Result<AbortMsg> DecodeAbort(std::span<const std::byte> b);
Result<ProgressMsg> DecodeProgress(std::span<const std::byte> b);
Result<StreamMarkMsg> DecodeStreamMark(std::span<const std::byte> b);

// The END digest of a set of chunk ids (any order; sorted here).
Digest128 ChunkIdsDigest(std::vector<ChunkId> ids);

// The subtree of plan node `index` as a plan for that node: the same
// fields, nodes re-indexed with `index` first. Requires a valid plan.
PlanMsg SubPlan(const PlanMsg& plan, size_t index);

}  // namespace dcr

#endif  // DCR_PROTOCOL_MESSAGES_H_
