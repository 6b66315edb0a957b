#include "protocol/messages.h"

#include <algorithm>
#include <set>
#include <tuple>

#include "common/bytes.h"
#include "dcr/codec.h"
#include "dcr/dtype.h"
#include "protocol/message_io.h"

namespace dcr {
namespace {

using namespace message_io;  // NOLINT(google-build-using-namespace)

// END with the signed refit manifest (EndMsg).
constexpr uint8_t kEndSignedVersion = 2;
// END naming the target (EndMsg::target), signed or not.
constexpr uint8_t kEndTargetVersion = 3;
constexpr uint8_t kEndSigned = 1;  // its flags
constexpr uint8_t kEndServing = 2;
constexpr uint8_t kPlanServing = 16;  // PLAN's flags: serving bits follow
// PLAN's flags: the indices of the nodes that pull from the object store
// follow (after the serving bits).
constexpr uint8_t kPlanObjects = 32;
// PLAN whose target digest comes at END (PlanMsg::target_at_end).
constexpr uint8_t kPlanTargetAtEndVersion = 2;
constexpr uint8_t kResultsPositionVersion = 2;  // with received_through
constexpr uint8_t kResultsStoreVersion = 3;     // with StoreCondition
// HEARTBEAT progress with delivered_bytes (ProgressMsg).
constexpr uint8_t kProgressDeliveredVersion = 2;
constexpr uint8_t kStoreUnfinished = 1;
constexpr uint8_t kStorePrepared = 2;
constexpr uint8_t kStoreMissing = 4;
constexpr uint8_t kStoreRepairing = 8;

void PutServing(ByteWriter* w, const std::vector<ServingBits>& list) {
  w->PutVarint(list.size());
  for (const ServingBits& b : list) {
    PutDigest(w, b.layout);
    w->Put<uint32_t>(b.rank);
    PutDigest(w, b.bits);
    w->PutVarint(b.regions.size());
    for (const LinearDigest& d : b.regions) {
      w->Put<uint64_t>(d.high);
      w->Put<uint64_t>(d.low);
    }
  }
}

// A list of serving bits; `regions`: each entry must carry one region
// digest per tensor (a target's), else none (a base's).
std::vector<ServingBits> GetServing(Reader* r, const char* field,
                                    bool regions) {
  std::vector<ServingBits> out;
  uint64_t n = r->Varint(field, kMaxPlanNodes);
  std::set<std::tuple<uint64_t, uint64_t, uint32_t>> seen;
  for (uint64_t i = 0; r->ok() && i < n; ++i) {
    ServingBits b;
    b.layout = r->Digest(field);
    b.rank = r->Get<uint32_t>(field);
    b.bits = r->Digest(field);
    uint64_t k = r->Varint(field, kMaxPlanTensors);
    if (r->ok() && (k != 0) != regions) {
      r->Fail(field, regions ? "a target's entry without region digests"
                             : "a base's entry with region digests");
    }
    for (uint64_t t = 0; r->ok() && t < k; ++t) {
      LinearDigest d;
      d.high = r->Get<uint64_t>(field);
      d.low = r->Get<uint64_t>(field);
      b.regions.push_back(d);
    }
    if (r->ok() && !seen.emplace(b.layout.high, b.layout.low, b.rank).second) {
      r->Fail(field, "a layout's rank named twice");
    }
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace

const ServingBits* FindServing(const std::vector<ServingBits>& list,
                               const Digest128& layout, uint32_t rank) {
  for (const ServingBits& b : list) {
    if (b.layout == layout && b.rank == rank) return &b;
  }
  return nullptr;
}

std::string_view NodeCodeName(NodeCode code) {
  switch (code) {
    case NodeCode::kOk:
      return "ok";
    case NodeCode::kNeedsCatchUp:
      return "needs catch-up";
    case NodeCode::kManifestMismatch:
      return "manifest mismatch";
    case NodeCode::kBusy:
      return "busy";
    case NodeCode::kUnreachable:
      return "unreachable";
    case NodeCode::kStoreError:
      return "store error";
    case NodeCode::kDigestMismatch:
      return "digest mismatch";
    case NodeCode::kIncomplete:
      return "incomplete";
    case NodeCode::kTimeout:
      return "timeout";
    case NodeCode::kRejected:
      return "rejected";
  }
  return "unknown";
}

std::vector<std::byte> EncodeHello(const HelloMsg& m) {
  std::vector<std::byte> out;
  ByteWriter w(&out);
  w.Put<uint8_t>(kMessageVersion);
  PutString(&w, m.node);
  w.Put<uint8_t>(m.role);
  w.Put<uint64_t>(m.epoch);
  return out;
}

Result<HelloMsg> DecodeHello(std::span<const std::byte> b) {
  Reader r(b, "HELLO");
  HelloMsg m;
  m.node = r.String("node");
  m.role = r.Get<uint8_t>("role");
  m.epoch = r.Get<uint64_t>("epoch");
  if (r.ok() && (m.role < kRoleRoot || m.role > kRoleClient)) {
    r.Fail("role", "unknown role " + std::to_string(m.role));
  }
  DCR_RETURN_IF_ERROR(r.Finish());
  return m;
}

std::vector<std::byte> EncodePlan(const PlanMsg& m) {
  std::vector<std::byte> out;
  ByteWriter w(&out);
  w.Put<uint8_t>(m.target_at_end() ? kPlanTargetAtEndVersion : kMessageVersion);
  w.Put<uint8_t>(static_cast<uint8_t>(m.mode));
  PutVersion(&w, m.base);
  PutVersion(&w, m.target);
  PutDigest(&w, m.manifest);
  w.Put<uint64_t>(m.span_elems);
  w.Put<uint64_t>(m.chunk_window_bytes);
  w.Put<uint32_t>(m.phase_timeout_ms);
  w.PutVarint(m.nodes.size());
  for (const PlanNode& n : m.nodes) {
    PutString(&w, n.name);
    PutString(&w, n.host);
    w.Put<uint16_t>(n.port);
    PutString(&w, n.transport);
    w.Put<int32_t>(n.parent);
    w.Put<uint64_t>(n.link_bps);
  }
  w.PutVarint(m.tensors.size());
  for (const TensorInfo& t : m.tensors) {
    PutString(&w, t.name);
    w.Put<uint8_t>(static_cast<uint8_t>(t.dtype));
    w.PutVarint(t.shape.size());
    for (uint64_t d : t.shape) w.PutVarint(d);
  }
  w.PutVarint(m.target_tensor_digests.size());
  for (const Digest128& d : m.target_tensor_digests) PutDigest(&w, d);
  w.Put<uint32_t>(m.heartbeat_ms);
  const bool serving = !m.serving_base.empty() || !m.serving_target.empty();
  std::vector<uint64_t> pullers;
  for (size_t i = 0; i < m.nodes.size(); ++i) {
    if (m.nodes[i].pulls_objects) pullers.push_back(i);
  }
  w.Put<uint8_t>(static_cast<uint8_t>(
      (m.adopt ? 1 : 0) | (m.resume ? 2 : 0) | (m.resend ? 4 : 0) |
      (m.context_coded ? 8 : 0) | (serving ? kPlanServing : 0) |
      (pullers.empty() ? 0 : kPlanObjects)));
  w.Put<uint32_t>(m.sender_depth);
  if (serving) {
    PutServing(&w, m.serving_base);
    PutServing(&w, m.serving_target);
  }
  if (!pullers.empty()) {
    w.PutVarint(pullers.size());
    for (uint64_t i : pullers) w.PutVarint(i);
  }
  return out;
}

Result<PlanMsg> DecodePlan(std::span<const std::byte> b) {
  Reader r(b, "PLAN", kPlanTargetAtEndVersion);
  PlanMsg m;
  uint8_t mode = r.Get<uint8_t>("mode");
  m.base = r.Ver("base");
  m.target = r.Ver("target");
  m.manifest = r.Digest("manifest");
  m.span_elems = r.Get<uint64_t>("span_elems");
  m.chunk_window_bytes = r.Get<uint64_t>("chunk_window_bytes");
  m.phase_timeout_ms = r.Get<uint32_t>("phase_timeout_ms");
  uint64_t count = r.Varint("nodes", kMaxPlanNodes);
  if (r.ok() && mode != 1 && mode != 2) {
    r.Fail("mode", "unknown mode " + std::to_string(mode));
  }
  m.mode = static_cast<RefitMode>(mode);
  if (r.ok() && (m.span_elems == 0 || m.span_elems > kMaxSpanElems)) {
    r.Fail("span_elems", "out of range");
  }
  if (r.ok() && count == 0) r.Fail("nodes", "empty subtree");
  std::set<std::string> names;
  for (uint64_t i = 0; r.ok() && i < count; ++i) {
    PlanNode n;
    n.name = r.String("nodes.name");
    n.host = r.String("nodes.host");
    n.port = r.Get<uint16_t>("nodes.port");
    n.transport = r.String("nodes.transport");
    n.parent = r.Get<int32_t>("nodes.parent");
    n.link_bps = r.Get<uint64_t>("nodes.link_bps");
    if (!r.ok()) break;
    bool parent_ok = i == 0
                         ? n.parent == -1
                         : n.parent >= 0 && static_cast<uint64_t>(n.parent) < i;
    if (!parent_ok) {
      r.Fail("nodes[" + std::to_string(i) + "].parent",
             "must name an earlier node (" + std::to_string(n.parent) + ")");
    } else if (n.name.empty() || !names.insert(n.name).second) {
      r.Fail("nodes[" + std::to_string(i) + "].name",
             "empty or repeated '" + n.name + "'");
    }
    m.nodes.push_back(std::move(n));
  }
  uint64_t tensors = r.Varint("tensors", kMaxPlanTensors);
  if (r.ok() && tensors != 0 && m.mode != RefitMode::kFull) {
    r.Fail("tensors", "only a full refit carries the manifest");
  }
  for (uint64_t i = 0; r.ok() && i < tensors; ++i) {
    TensorInfo t;
    t.name = r.String("tensors.name");
    uint8_t dtype = r.Get<uint8_t>("tensors.dtype");
    if (r.ok() && !IsValidDType(dtype)) {
      r.Fail("tensors.dtype", "unknown dtype " + std::to_string(dtype));
    }
    t.dtype = static_cast<DType>(dtype);
    uint64_t rank = r.Varint("tensors.rank", kMaxTensorRank);
    for (uint64_t d = 0; r.ok() && d < rank; ++d) {
      t.shape.push_back(r.Varint("tensors.shape", uint64_t{1} << 48));
    }
    m.tensors.push_back(std::move(t));
  }
  uint64_t digests = r.Varint("target_tensor_digests", kMaxPlanTensors);
  if (r.ok() && m.mode == RefitMode::kFull && tensors != 0 && digests != 0 &&
      digests != tensors) {
    r.Fail("target_tensor_digests", "not one per tensor of the manifest");
  }
  for (uint64_t i = 0; r.ok() && i < digests; ++i) {
    m.target_tensor_digests.push_back(r.Digest("target_tensor_digests"));
  }
  if (r.ok() && (r.version() == kPlanTargetAtEndVersion) != m.target_at_end()) {
    r.Fail("target", r.version() == kPlanTargetAtEndVersion
                         ? "a version-2 PLAN names the target's digest"
                         : "a version-1 PLAN without the target's digest");
  }
  if (r.ok() && m.target_at_end() && digests != 0) {
    r.Fail("target_tensor_digests",
           "sent without the target's digest (they come at END)");
  }
  m.heartbeat_ms = r.Get<uint32_t>("heartbeat_ms");
  uint8_t flags = r.Get<uint8_t>("flags");
  if (r.ok() && flags > 63) r.Fail("flags", "unknown bits");
  m.adopt = (flags & 1) != 0;
  m.resume = (flags & 2) != 0;
  m.resend = (flags & 4) != 0;
  m.context_coded = (flags & 8) != 0;
  if (r.ok() && m.context_coded && m.mode != RefitMode::kDelta) {
    r.Fail("flags", "context-coded chunks in a full plan");
  }
  m.sender_depth = r.Get<uint32_t>("sender_depth");
  if (r.ok() && m.sender_depth > kMaxPlanNodes) {
    r.Fail("sender_depth", "deeper than any tree");
  }
  if (r.ok() && (flags & kPlanServing) != 0) {
    m.serving_base = GetServing(&r, "serving_base", false);
    m.serving_target = GetServing(&r, "serving_target", true);
    if (r.ok() && m.serving_base.empty() && m.serving_target.empty()) {
      r.Fail("flags", "serving bits announced, none sent");
    }
    if (r.ok() && m.target_at_end() && !m.serving_target.empty()) {
      r.Fail("serving_target", "sent without the target's digest");
    }
  }
  if (r.ok() && (flags & kPlanObjects) != 0) {
    uint64_t n = r.Varint("pulls_objects", m.nodes.size());
    if (r.ok() && n == 0) r.Fail("flags", "pullers announced, none sent");
    uint64_t last = 0;
    for (uint64_t k = 0; r.ok() && k < n; ++k) {
      uint64_t i = r.Varint("pulls_objects", m.nodes.size() - 1);
      if (r.ok() && k > 0 && i <= last) {
        r.Fail("pulls_objects", "indices not increasing");
      }
      if (r.ok()) m.nodes[i].pulls_objects = true;
      last = i;
    }
  }
  DCR_RETURN_IF_ERROR(r.Finish());
  return m;
}

std::vector<std::byte> EncodeResults(const ResultsMsg& m) {
  std::vector<std::byte> out;
  ByteWriter w(&out);
  const bool conditions =
      std::any_of(m.nodes.begin(), m.nodes.end(),
                  [](const NodeResult& n) { return !n.store.empty(); });
  w.Put<uint8_t>(conditions           ? kResultsStoreVersion
                 : m.received_through ? kResultsPositionVersion
                                      : kMessageVersion);
  w.PutVarint(m.nodes.size());
  for (const NodeResult& n : m.nodes) {
    PutString(&w, n.node);
    w.Put<uint8_t>(static_cast<uint8_t>(n.code));
    PutVersion(&w, n.version);
    w.Put<uint64_t>(n.chunks_applied);
    PutString(&w, n.detail);
    w.PutVarint(n.repair.size());
    for (uint32_t t : n.repair) w.PutVarint(t);
  }
  if (conditions) {
    for (const NodeResult& n : m.nodes) {
      const StoreCondition& c = n.store;
      w.Put<uint8_t>((c.unfinished ? kStoreUnfinished : 0) |
                     (c.unfinished && c.prepared ? kStorePrepared : 0) |
                     (c.unfinished && c.repairing ? kStoreRepairing : 0) |
                     (c.missing ? kStoreMissing : 0));
      if (c.unfinished) {
        w.PutBytes(std::as_bytes(std::span(c.unfinished->bytes)));
        PutVersion(&w, c.base);
        PutVersion(&w, c.target);
      }
    }
    w.Put<uint8_t>(m.received_through ? 1 : 0);
  }
  if (m.received_through) {
    w.Put<uint64_t>(m.received_through->epoch);
    w.Put<uint64_t>(m.received_through->sequence);
  }
  return out;
}

Result<ResultsMsg> DecodeResults(std::span<const std::byte> b) {
  Reader r(b, "RESULTS", kResultsStoreVersion);
  ResultsMsg m;
  uint64_t count = r.Varint("nodes", kMaxPlanNodes);
  for (uint64_t i = 0; r.ok() && i < count; ++i) {
    NodeResult n;
    n.node = r.String("nodes.node");
    uint8_t code = r.Get<uint8_t>("nodes.code");
    n.version = r.Ver("nodes.version");
    n.chunks_applied = r.Get<uint64_t>("nodes.chunks_applied");
    n.detail = r.String("nodes.detail");
    uint64_t repair = r.Varint("nodes.repair", kMaxPlanTensors);
    for (uint64_t k = 0; r.ok() && k < repair; ++k) {
      uint64_t t = r.Varint("nodes.repair", kMaxPlanTensors - 1);
      if (r.ok() && !n.repair.empty() && t <= n.repair.back()) {
        r.Fail("nodes.repair", "tensor indices must ascend");
      }
      n.repair.push_back(static_cast<uint32_t>(t));
    }
    if (r.ok() && code > static_cast<uint8_t>(NodeCode::kRejected)) {
      r.Fail("nodes.code", "unknown code " + std::to_string(code));
    }
    n.code = static_cast<NodeCode>(code);
    m.nodes.push_back(std::move(n));
  }
  bool position = r.version() == kResultsPositionVersion;
  if (r.ok() && r.version() == kResultsStoreVersion) {
    for (NodeResult& n : m.nodes) {
      uint8_t flags = r.Get<uint8_t>("nodes.store");
      if (r.ok() && (flags & ~(kStoreUnfinished | kStorePrepared |
                               kStoreMissing | kStoreRepairing)) != 0) {
        r.Fail("nodes.store", "unknown flags");
      }
      if (r.ok() && (flags & (kStorePrepared | kStoreRepairing)) &&
          !(flags & kStoreUnfinished)) {
        r.Fail("nodes.store",
               "prepared or repairing without an unfinished refit");
      }
      StoreCondition& c = n.store;
      c.missing = (flags & kStoreMissing) != 0;
      c.prepared = (flags & kStorePrepared) != 0;
      c.repairing = (flags & kStoreRepairing) != 0;
      if (r.ok() && (flags & kStoreUnfinished)) {
        RefitId id;
        for (uint8_t& byte : id.bytes) byte = r.Get<uint8_t>("nodes.store");
        c.unfinished = id;
        c.base = r.Ver("nodes.store.base");
        c.target = r.Ver("nodes.store.target");
      }
    }
    // Canonical: version 3 only when some node has a condition.
    if (r.ok() &&
        std::all_of(m.nodes.begin(), m.nodes.end(),
                    [](const NodeResult& n) { return n.store.empty(); })) {
      r.Fail("nodes.store", "version 3 without a store condition");
    }
    uint8_t has = r.Get<uint8_t>("received_through");
    if (r.ok() && has > 1) r.Fail("received_through", "flag not 0 or 1");
    position = has == 1;
  }
  if (r.ok() && position) {
    FramePosition p;
    p.epoch = r.Get<uint64_t>("received_through.epoch");
    p.sequence = r.Get<uint64_t>("received_through.sequence");
    m.received_through = p;
  }
  DCR_RETURN_IF_ERROR(r.Finish());
  return m;
}

std::vector<std::byte> EncodeEnd(const EndMsg& m) {
  std::vector<std::byte> out;
  ByteWriter w(&out);
  w.Put<uint8_t>(m.target        ? kEndTargetVersion
                 : m.is_signed() ? kEndSignedVersion
                                 : kMessageVersion);
  w.Put<uint64_t>(m.chunk_count);
  PutDigest(&w, m.chunk_ids_digest);
  if (m.target) {
    PutVersion(&w, *m.target);
    w.PutVarint(m.target_tensor_digests.size());
    for (const Digest128& d : m.target_tensor_digests) PutDigest(&w, d);
    w.Put<uint8_t>((m.is_signed() ? kEndSigned : 0) |
                   (m.serving_target.empty() ? 0 : kEndServing));
    if (!m.serving_target.empty()) PutServing(&w, m.serving_target);
  }
  if (m.is_signed()) {
    w.PutVarint(m.manifest.size());
    w.PutBytes(m.manifest);
    w.PutBytes(m.signature);
  }
  return out;
}

Result<EndMsg> DecodeEnd(std::span<const std::byte> b) {
  Reader r(b, "END", kEndTargetVersion);
  EndMsg m;
  m.chunk_count = r.Get<uint64_t>("chunk_count");
  m.chunk_ids_digest = r.Digest("chunk_ids_digest");
  bool is_signed = r.version() == kEndSignedVersion;
  if (r.ok() && r.version() == kEndTargetVersion) {
    m.target = r.Ver("target");
    if (r.ok() && m.target->digest == Digest128{}) {
      r.Fail("target", "no digest");
    }
    uint64_t n = r.Varint("target_tensor_digests", kMaxPlanTensors);
    for (uint64_t i = 0; r.ok() && i < n; ++i) {
      m.target_tensor_digests.push_back(r.Digest("target_tensor_digests"));
    }
    uint8_t flags = r.Get<uint8_t>("flags");
    if (r.ok() && (flags & ~(kEndSigned | kEndServing)) != 0) {
      r.Fail("flags", "unknown bits");
    }
    is_signed = (flags & kEndSigned) != 0;
    if (r.ok() && (flags & kEndServing) != 0) {
      m.serving_target = GetServing(&r, "serving_target", true);
      if (r.ok() && m.serving_target.empty()) {
        r.Fail("flags", "serving bits announced, none sent");
      }
    }
  }
  if (r.ok() && is_signed) {
    uint64_t n = r.Varint("manifest", kMaxEndManifestBytes);
    if (r.ok() && n == 0) r.Fail("manifest", "empty in a signed END");
    m.manifest = r.Bytes("manifest", n);
    m.signature = r.Bytes("signature", kEndSignatureBytes);
  }
  DCR_RETURN_IF_ERROR(r.Finish());
  return m;
}

std::vector<std::byte> EncodeCommit(const CommitMsg& m) {
  std::vector<std::byte> out;
  ByteWriter w(&out);
  w.Put<uint8_t>(kMessageVersion);
  PutVersion(&w, m.target);
  w.PutVarint(m.commit_set.size());
  for (const auto& n : m.commit_set) PutString(&w, n);
  return out;
}

Result<CommitMsg> DecodeCommit(std::span<const std::byte> b) {
  Reader r(b, "COMMIT");
  CommitMsg m;
  m.target = r.Ver("target");
  uint64_t count = r.Varint("commit_set", kMaxPlanNodes);
  for (uint64_t i = 0; r.ok() && i < count; ++i) {
    m.commit_set.push_back(r.String("commit_set"));
  }
  DCR_RETURN_IF_ERROR(r.Finish());
  return m;
}

std::vector<std::byte> EncodeAbort(const AbortMsg& m) {
  std::vector<std::byte> out;
  ByteWriter w(&out);
  w.Put<uint8_t>(kMessageVersion);
  PutString(&w, m.reason);
  return out;
}

Result<AbortMsg> DecodeAbort(std::span<const std::byte> b) {
  Reader r(b, "ABORT");
  AbortMsg m;
  m.reason = r.String("reason");
  DCR_RETURN_IF_ERROR(r.Finish());
  return m;
}

std::vector<std::byte> EncodeProgress(const ProgressMsg& m) {
  std::vector<std::byte> out;
  ByteWriter w(&out);
  w.Put<uint8_t>(m.delivered_bytes ? kProgressDeliveredVersion
                                   : kMessageVersion);
  w.Put<uint64_t>(m.received_bytes);
  w.Put<uint64_t>(m.backlog_bytes);
  w.Put<uint64_t>(m.self_held_ms);
  if (m.delivered_bytes) w.Put<uint64_t>(*m.delivered_bytes);
  return out;
}

Result<ProgressMsg> DecodeProgress(std::span<const std::byte> b) {
  Reader r(b, "HEARTBEAT", kProgressDeliveredVersion);
  ProgressMsg m;
  m.received_bytes = r.Get<uint64_t>("received_bytes");
  m.backlog_bytes = r.Get<uint64_t>("backlog_bytes");
  m.self_held_ms = r.Get<uint64_t>("self_held_ms");
  if (r.ok() && r.version() == kProgressDeliveredVersion) {
    m.delivered_bytes = r.Get<uint64_t>("delivered_bytes");
  }
  DCR_RETURN_IF_ERROR(r.Finish());
  return m;
}

std::vector<std::byte> EncodeStreamMark(const StreamMarkMsg& m) {
  std::vector<std::byte> out;
  ByteWriter w(&out);
  w.Put<uint8_t>(kMessageVersion);
  w.Put<uint32_t>(m.tensor);
  return out;
}

Result<StreamMarkMsg> DecodeStreamMark(std::span<const std::byte> b) {
  Reader r(b, "STREAM_MARK");
  StreamMarkMsg m;
  m.tensor = r.Get<uint32_t>("tensor");
  DCR_RETURN_IF_ERROR(r.Finish());
  return m;
}

Digest128 ChunkIdsDigest(std::vector<ChunkId> ids) {
  std::sort(ids.begin(), ids.end());
  Hasher128 h;
  for (const ChunkId& id : ids) {
    std::byte b[10];
    StoreLE<uint32_t>(b, id.tensor);
    StoreLE<uint32_t>(b + 4, id.span);
    StoreLE<uint16_t>(b + 8, id.part);
    h.Update(std::span<const std::byte>(b, sizeof b));
  }
  return h.Finish();
}

PlanMsg SubPlan(const PlanMsg& plan, size_t index) {
  PlanMsg sub = plan;
  sub.nodes.clear();
  // Nodes come after their parents, so one pass in order collects the
  // subtree of `index` and maps old indices to new ones.
  std::vector<int32_t> remap(plan.nodes.size(), -1);
  for (size_t i = index; i < plan.nodes.size(); ++i) {
    const PlanNode& n = plan.nodes[i];
    int32_t parent = -1;
    if (i != index) {
      if (n.parent < 0 || remap[static_cast<size_t>(n.parent)] < 0) continue;
      parent = remap[static_cast<size_t>(n.parent)];
    }
    remap[i] = static_cast<int32_t>(sub.nodes.size());
    PlanNode copy = n;
    copy.parent = parent;
    sub.nodes.push_back(std::move(copy));
  }
  return sub;
}

}  // namespace dcr
