// Fuzzes one relay's part in a refit: sequences of refit messages (PLAN,
// CHUNK, END, COMMIT, ABORT) sent as real frames through the frame decoder
// and the message decoders into a RefitSession over a small memory store,
// with the invariants of DESIGN.md §4 checked after every step.
//
// The input is a list of operations, each an op byte then its parameters
// (bytes past the end read as 0):
//   PLAN     delta or full; base right, wrong digest, wrong step or wrong
//            manifest; refit id from a pool of 3; span length; with or
//            without the target's tensor digests; the target (which
//            elements change, from a seed and a density)
//   CHUNK    a chunk of the planned target made by the real encoder (XOR or
//            overwrite diff, dense full span, an overwrite of chosen
//            positions with target or garbage values, a span cut at a length
//            the plan does not use, a tensor or span past the manifest), raw
//            fuzz bytes (checksum re-sealed), or a replay of an earlier one
//   END      the ids the root sent, every changed span, or a wrong count or
//            digest; chunks after a vote are a repair round, and the next
//            END asks for a new vote
//   COMMIT   naming this node and the target, another node, or another
//            target (the node then aborts, as the relay does)
//   ABORT
//   RESTART  the relay dies mid-refit (the session is dropped without Commit
//            or Abort) and restarts on the same store, or on none (the next
//            full plan creates a fresh store)
//   RAWFRAME fuzz bytes as the payload of a frame of a chosen type
// Every frame-sending op ends with a transport byte (read before anything
// else of the op is used, so an op that sends nothing consumes it too): low
// 2 bits 1 flip one payload bit and re-seal the frame checksum (the message
// decoders see the damage), 2 flip without re-sealing (the frame decoder
// refuses it, the link drops and the session aborts), each followed by two
// bytes (payload offset, bit); the other 6 bits are the feed piece size (0:
// the whole frame at once). Kind-4 chunks then read their garbage values.
//
// What breaks an invariant calls __builtin_trap():
//   - the store changes only through an applied chunk: after every step it
//     holds exactly the bits a model predicts (the bits at Begin plus every
//     chunk the session said it applied), so an XOR chunk applied twice
//     (span back to base ^ x ^ x) or applied over an overwrite, a write
//     outside the chunk's span, or any write while no refit is bound (after
//     a refused plan) is caught;
//   - an XOR chunk is reported applied only to a span nothing was applied to,
//     and an overwrite is never dropped as a duplicate;
//   - a delta plan is bound only when the store's bits are the plan's base;
//     a refused plan changes neither bits nor record;
//   - the vote is yes iff the store's digest is the target's (and then the
//     bits are exactly the planned target), otherwise incomplete or digest
//     mismatch as END's applied set says, naming exactly the tensors that
//     differ when the plan carries the target's tensor digests;
//   - Commit after a yes vote leaves the target bits and a record naming the
//     target and the refit, with no refit in progress;
//   - Abort restores exactly the bits the store held at Begin (a store
//     created for a full refit has none to restore) and clears the refit in
//     progress, or records again the unfinished refit a full refit took
//     over; the committed record never changes but by Commit.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/codec.h"
#include "dcr/digest.h"
#include "dcr/store.h"
#include "dcr/wire.h"
#include "protocol/messages.h"
#include "session/refit_session.h"

namespace dcr {
namespace {

using Bytes = std::vector<std::byte>;
using Bits = std::vector<Bytes>;  // one buffer per tensor, manifest order

#define CHECK(...)                        \
  do {                                    \
    if (!(__VA_ARGS__)) __builtin_trap(); \
  } while (0)

constexpr char kNode[] = "n0";

// DCR_FUZZ_TRACE=1 prints what the relay did with each message (to read a
// reproducer or check that a seed reaches commit or abort).
void Trace(const char* what, const std::string& detail = "") {
  static const bool on = std::getenv("DCR_FUZZ_TRACE") != nullptr;
  if (on) std::fprintf(stderr, "refit_sequence: %s %s\n", what, detail.c_str());
}
constexpr uint64_t kSpanChoices[] = {4, 8, 16, 64};

// How the transport treats one frame.
struct Tx {
  uint8_t damage = 0;  // 1: flip a payload bit, re-seal; 2: flip only
  size_t piece = 0;    // feed size; 0: the whole frame
  uint8_t at = 0;      // the payload byte (modulo its size)
  uint8_t bit = 0;
};

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return pos_ >= size_; }
  uint8_t U8() { return pos_ < size_ ? data_[pos_++] : 0; }
  // The transport byte, then the damage's two bytes if it damages.
  Tx ReadTx() {
    Tx tx;
    uint8_t b = U8();
    tx.damage = b & 3;
    tx.piece = b >> 2;
    if (tx.damage == 1 || tx.damage == 2) {
      tx.at = U8();
      tx.bit = U8() & 7;
    }
    return tx;
  }
  Bytes Take(size_t n) {
    n = std::min(n, size_ - pos_);
    Bytes b(reinterpret_cast<const std::byte*>(data_ + pos_),
            reinterpret_cast<const std::byte*>(data_ + pos_ + n));
    pos_ += n;
    return b;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

// What every input shares: the manifest (three tiny tensors: spans of 4 to
// 64 elements give one to ten spans each), the base bits, and a scratch
// store to digest bits with.
struct Fixture {
  Manifest manifest;
  Bits base;
  std::unique_ptr<WeightStore> scratch;
  std::unique_ptr<ChunkEncoder> encoder;
  std::unique_ptr<ChunkDecoder> decoder;  // the relay's
  std::unique_ptr<ChunkDecoder> checker;  // the model's

  Fixture() {
    manifest = *Manifest::Create({{"a", DType::kBF16, {37}},
                                  {"b", DType::kF32, {10}},
                                  {"c", DType::kU8, {}}});
    for (const auto& t : manifest.tensors()) {
      Bytes b(t.NumBytes());
      for (size_t i = 0; i < b.size(); ++i) {
        b[i] = static_cast<std::byte>(Mix(i + 977 * base.size()));
      }
      base.push_back(std::move(b));
    }
    scratch = *CreateStore(StoreSpec(), manifest);
    encoder = *ChunkEncoder::Create(EncodeOptions());
    decoder = *ChunkDecoder::Create();
    checker = *ChunkDecoder::Create();
  }

  Digest128 DigestOf(const Bits& bits) {
    for (size_t i = 0; i < bits.size(); ++i) {
      std::copy(bits[i].begin(), bits[i].end(),
                scratch->MutableTensor(i).begin());
    }
    return scratch->Digests().version;
  }
};

Fixture& F() {
  static Fixture* f = new Fixture();
  return *f;
}

Bits BitsOf(const WeightStore& store) {
  Bits bits;
  for (size_t i = 0; i < store.manifest().size(); ++i) {
    auto t = store.Tensor(i);
    bits.emplace_back(t.begin(), t.end());
  }
  return bits;
}

// Whether `store` holds exactly `bits` (without copying them).
bool Holds(const WeightStore& store, const Bits& bits) {
  for (size_t i = 0; i < bits.size(); ++i) {
    auto t = store.Tensor(i);
    if (!std::equal(t.begin(), t.end(), bits[i].begin(), bits[i].end())) {
      return false;
    }
  }
  return true;
}

RefitId IdOf(uint8_t n) {
  RefitId id;
  id.bytes[0] = n;
  id.bytes[15] = 0xd;
  return id;
}

class Harness {
 public:
  Harness() {
    store_ = *CreateStore(StoreSpec(), F().manifest);
    for (size_t i = 0; i < F().base.size(); ++i) {
      std::copy(F().base[i].begin(), F().base[i].end(),
                store_->MutableTensor(i).begin());
    }
    held_ = F().base;
    root_bits_ = F().base;
    root_target_ = F().base;
    root_version_ = Version{0, F().DigestOf(root_bits_)};
    root_plan_.span_elems = 8;
  }

  void Run(Reader& in) {
    for (int ops = 0; ops < 64 && !in.done(); ++ops) {
      switch (in.U8() % 10) {
        case 0:
          SendPlan(in);
          break;
        case 1:
        case 2:
        case 3:
          SendChunk(in);
          break;
        case 4:
          SendEnd(in);
          break;
        case 5:
          SendCommit(in);
          break;
        case 6:
          Send(FrameType::kAbort, EncodeAbort({"fuzz"}), root_id_, in.ReadTx());
          break;
        case 7:
          Restart(in.U8() & 1);
          break;
        case 8: {
          uint8_t type = 1 + in.U8() % kMaxFrameType;
          Bytes payload = in.Take(in.U8());
          Send(static_cast<FrameType>(type), payload, root_id_, in.ReadTx());
          break;
        }
        default:
          break;
      }
      CheckIdle();
    }
    // The relay stops: a refit in progress is rolled back.
    if (session_) AbortSession();
    CheckIdle();
  }

 private:
  // ------------------------------------------------------------- the root

  void SendPlan(Reader& in) {
    uint8_t flags = in.U8(), seed = in.U8(), density = in.U8() % 8;
    Tx tx = in.ReadTx();
    PlanMsg p;
    p.mode = (flags & 1) ? RefitMode::kFull : RefitMode::kDelta;
    root_target_ = root_bits_;
    for (size_t t = 0; t < root_target_.size(); ++t) {
      size_t w = DTypeSize(F().manifest[t].dtype);
      for (size_t e = 0; e * w < root_target_[t].size(); ++e) {
        uint64_t h = Mix(seed * 1000003ull + t * 7919 + e);
        if ((h & 7) < density) {
          root_target_[t][e * w] ^= static_cast<std::byte>((h >> 8) | 1);
          if (w > 1) root_target_[t][e * w + 1] ^= std::byte(h >> 16);
        }
      }
    }
    p.base = root_version_;
    p.target = Version{root_version_.step + 1, F().DigestOf(root_target_)};
    p.manifest = F().manifest.digest();
    switch ((flags >> 1) & 3) {
      case 1:
        p.base.digest.low ^= 1;
        break;
      case 2:
        p.base.step += 1;
        break;
      case 3:
        p.manifest.high ^= 1;
        break;
    }
    p.span_elems = kSpanChoices[(flags >> 5) & 3];
    p.chunk_window_bytes = 1 << 20;
    p.phase_timeout_ms = 1000;
    p.nodes = {{kNode, "127.0.0.1", 1, "tcp", -1}};
    if (p.mode == RefitMode::kFull) p.tensors = F().manifest.tensors();
    if (flags & 0x80) {
      for (const Bytes& t : root_target_) {
        p.target_tensor_digests.push_back(TensorDigest(t));
      }
    }
    root_id_ = IdOf(1 + ((flags >> 3) & 3) % 3);
    root_plan_ = p;
    root_sent_.clear();
    root_chunks_.clear();
    Send(FrameType::kPlan, EncodePlan(p), root_id_, tx);
  }

  // The bytes of span `s` of tensor `t` cut at `span_elems`.
  static std::span<const std::byte> SpanBytes(const Bits& bits, size_t t,
                                              uint64_t s, uint64_t span_elems) {
    size_t w = DTypeSize(F().manifest[t].dtype);
    uint64_t n = F().manifest[t].NumElements();
    uint64_t first = std::min(n, s * span_elems);
    uint64_t count = std::min(span_elems, n - first);
    return std::span(bits[t]).subspan(first * w, count * w);
  }

  void SendChunk(Reader& in) {
    uint8_t kind = in.U8() % 8, tb = in.U8(), sb = in.U8(), x = in.U8();
    Tx tx = in.ReadTx();  // before the garbage values of kind 4
    Bytes chunk;
    if (kind == 6) {  // raw bytes; re-seal the chunk checksum
      chunk = in.Take(x);
      if (chunk.size() >= 8) {
        uint64_t sum = Hash64(std::span(chunk).first(chunk.size() - 8));
        std::memcpy(chunk.data() + chunk.size() - 8, &sum, 8);
      }
    } else if (kind == 7) {  // a replay of an earlier chunk
      if (root_chunks_.empty()) return;
      chunk = root_chunks_[x % root_chunks_.size()];
    } else {
      const size_t nt = F().manifest.size();
      size_t t = tb % (nt + 1);
      uint32_t tensor_id = static_cast<uint32_t>(t);
      if (t == nt) {  // a tensor past the manifest, with tensor 0's bits
        t = 0;
        tensor_id = static_cast<uint32_t>(nt + tb % 3);
      }
      size_t w = DTypeSize(F().manifest[t].dtype);
      uint64_t span_elems = root_plan_.span_elems;
      if (kind == 5) {  // cut at a span length the plan does not use
        span_elems = kSpanChoices[x & 3];
        if (span_elems == root_plan_.span_elems) {
          span_elems = kSpanChoices[(x + 1) & 3];
        }
      }
      uint64_t spans = SpanCount(F().manifest[t].NumElements(), span_elems);
      uint64_t s = sb % (spans + 1);  // spans: one past the last
      auto base = SpanBytes(root_bits_, t, std::min(s, spans - 1), span_elems);
      auto target =
          SpanBytes(root_target_, t, std::min(s, spans - 1), span_elems);
      ChunkId id{tensor_id, static_cast<uint32_t>(s)};
      uint32_t n = static_cast<uint32_t>(base.size() / w);
      switch (kind) {
        case 0:
        case 1:
        case 5: {
          auto r = F().encoder->EncodeDiff(
              kind == 1 ? ChunkKind::kOverwrite : ChunkKind::kXor, id, w, base,
              target, &chunk);
          if (!r.ok() || !*r) return;  // nothing changed in this span
          break;
        }
        case 2:
          if (!F().encoder->EncodeFull(id, w, target, &chunk).ok()) return;
          break;
        default: {  // 3, 4: an overwrite of some positions
          std::vector<uint32_t> positions;
          Bytes values;
          for (uint32_t i = 0; i < n; ++i) {
            if (!((Mix(x * 131 + i) >> 5) & 1)) continue;
            positions.push_back(i);
            for (size_t b = 0; b < w; ++b) {
              values.push_back(kind == 3 ? target[i * w + b]
                                         : std::byte(in.U8()));
            }
          }
          if (!F().encoder
                   ->EncodeChanges(ChunkKind::kOverwrite, id, w, n, positions,
                                   values, &chunk)
                   .ok()) {
            return;
          }
          break;
        }
      }
      if (kind != 5) root_sent_.insert({id.tensor, id.span});
      root_chunks_.push_back(chunk);
    }
    Send(FrameType::kChunk, chunk, root_id_, tx);
  }

  void SendEnd(Reader& in) {
    uint8_t v = in.U8();
    Tx tx = in.ReadTx();
    std::set<std::pair<uint32_t, uint32_t>> ids = root_sent_;
    if ((v & 3) == 1) {  // every span the target changes (all: full refit)
      ids.clear();
      for (uint32_t t = 0; t < root_target_.size(); ++t) {
        uint64_t spans =
            SpanCount(F().manifest[t].NumElements(), root_plan_.span_elems);
        for (uint32_t s = 0; s < spans; ++s) {
          auto a = SpanBytes(root_bits_, t, s, root_plan_.span_elems);
          auto b = SpanBytes(root_target_, t, s, root_plan_.span_elems);
          if (root_plan_.mode == RefitMode::kFull ||
              !std::equal(a.begin(), a.end(), b.begin(), b.end())) {
            ids.insert({t, s});
          }
        }
      }
    }
    std::vector<ChunkId> sent;
    for (const auto& [t, s] : ids) sent.push_back(ChunkId{t, s});
    EndMsg e{ids.size(), ChunkIdsDigest(std::move(sent))};
    if ((v & 3) == 2) e.chunk_count += 1 + (v >> 2);
    if ((v & 3) == 3) e.chunk_ids_digest.low ^= v;
    Send(FrameType::kEnd, EncodeEnd(e), root_id_, tx);
  }

  void SendCommit(Reader& in) {
    uint8_t v = in.U8() % 3;
    Tx tx = in.ReadTx();
    CommitMsg c{root_plan_.target, {v == 1 ? "n1" : kNode}};
    if (v == 2) c.target.step += 1;
    Send(FrameType::kCommit, EncodeCommit(c), root_id_, tx);
    // The root's baseline advances to the target once the node committed.
    if (v == 0 && committed_ == root_plan_.target) {
      root_bits_ = root_target_;
      root_version_ = root_plan_.target;
    }
  }

  // Frames `payload` and feeds it to the relay's link decoder, damaged and
  // split as the transport byte says, then handles what decodes.
  void Send(FrameType type, std::span<const std::byte> payload,
            const RefitId& id, const Tx& tx) {
    FrameHeader h;
    h.type = type;
    h.epoch = 1;
    h.sequence = sequence_++;
    h.refit_id = id;
    auto frame = EncodeFrame(h, payload);
    CHECK(frame.ok());
    Bytes bytes(**frame);
    const uint8_t damage = payload.empty() ? 0 : tx.damage;
    if (damage == 1 || damage == 2) {
      size_t at = kFrameHeaderSize + tx.at % payload.size();
      bytes[at] ^= static_cast<std::byte>(1u << tx.bit);
      if (damage == 1) {  // re-seal: the frame decoder lets it through
        std::span<const std::byte> all(bytes);
        Bytes covered(all.begin(), all.begin() + 48);
        covered.insert(covered.end(), all.begin() + kFrameHeaderSize,
                       all.end());
        uint64_t sum = Hash64(covered);
        std::memcpy(bytes.data() + 48, &sum, 8);
      }
    }
    size_t piece = tx.piece;
    if (piece == 0) piece = bytes.size();
    std::span<const std::byte> rest(bytes);
    while (!rest.empty()) {
      size_t n = std::min(piece, rest.size());
      link_.Feed(rest.first(n));
      rest = rest.subspan(n);
      for (;;) {
        auto next = link_.Next();
        if (!next.ok()) {
          // The parent link drops: the relay rolls its refit back and the
          // parent reconnects with a new link.
          Trace("link dropped:", next.status().ToString());
          CHECK(damage == 2);
          if (session_) AbortSession();
          link_ = FrameDecoder();
          return;
        }
        if (!next->has_value()) break;
        Receive((*next)->frame);
      }
    }
    CHECK(!link_.mid_frame());
  }

  // ------------------------------------------------------------ the relay

  void Receive(const Frame& f) {
    switch (f.type()) {
      case FrameType::kPlan:
        if (auto p = DecodePlan(f.payload); p.ok()) {
          OnPlan(*p, f.header.refit_id);
        }
        return;
      case FrameType::kChunk:
        if (session_ && f.header.refit_id == id_) {
          // After a vote a chunk starts a repair round; the vote no longer
          // describes the bits.
          voted_yes_ = false;
          OnChunk(f.payload);
        }
        return;
      case FrameType::kEnd:
        if (auto e = DecodeEnd(f.payload);
            e.ok() && session_ && f.header.refit_id == id_) {
          OnEnd(*e);
        }
        return;
      case FrameType::kCommit:
        if (auto c = DecodeCommit(f.payload);
            c.ok() && session_ && f.header.refit_id == id_) {
          OnCommit(*c);
        }
        return;
      case FrameType::kAbort:
        if (DecodeAbort(f.payload).ok() && session_ &&
            f.header.refit_id == id_) {
          AbortSession();
        }
        return;
      case FrameType::kHello:
        (void)DecodeHello(f.payload);
        return;
      default:
        (void)DecodeResults(f.payload);
        return;
    }
  }

  void OnPlan(const PlanMsg& p, const RefitId& id) {
    if (session_) return;  // busy: refused without touching the store
    bool fresh = false;
    if (!store_) {
      // No store: a full plan whose manifest matches its digest creates one.
      auto m = Manifest::Create(p.tensors);
      if (p.mode != RefitMode::kFull || p.tensors.empty() || !m.ok() ||
          m->digest() != p.manifest) {
        return;
      }
      store_ = *CreateStore(StoreSpec(), *m);
      held_ = BitsOf(*store_);
      committed_.reset();
      fresh = true;
    }
    const Bits before = BitsOf(*store_);
    const VersionRecord record = store_->record();
    const Digest128 digest = store_->Digests().version;
    NodeResult refusal;
    RefitSession::Options options;
    options.fresh_store = fresh;
    session_ =
        RefitSession::Begin(store_.get(), kNode, id, p, &refusal, options);
    if (!session_) {
      Trace("plan refused:",
            std::string(NodeCodeName(refusal.code)) + ": " + refusal.detail);
      // Refused: nothing written, and a reason a parent can act on.
      CHECK(Holds(*store_, before) && store_->record() == record);
      CHECK(refusal.code != NodeCode::kOk && refusal.node == kNode);
      // A plan that binds must not be refused.
      bool manifest_ok = p.manifest == store_->manifest().digest();
      bool idle = !record.in_progress;
      bool base_ok =
          committed_ ? *committed_ == p.base : digest == p.base.digest;
      if (manifest_ok && (p.mode == RefitMode::kFull || (idle && base_ok))) {
        __builtin_trap();
      }
      return;
    }
    Trace(
        p.mode == RefitMode::kFull ? "plan bound (full)" : "plan bound (delta)",
        fresh ? "on a fresh store" : "");
    // Bound: a delta applies only to the plan's base bits.
    CHECK(p.manifest == store_->manifest().digest());
    if (p.mode == RefitMode::kDelta) CHECK(digest == p.base.digest);
    auto busy = store_->InProgress();
    // Over a refit left unfinished (a full refit taking it over: a
    // repair), the record keeps naming that one until this one commits.
    if (record.in_progress) {
      CHECK(busy && *busy == *record.in_progress);
    } else {
      CHECK(busy && busy->refit == id && busy->target == p.target);
    }
    CHECK(Holds(*store_, before));
    id_ = id;
    plan_ = p;
    fresh_ = fresh;
    voted_yes_ = false;
    begin_bits_ = before;
    begin_unfinished_ = record.in_progress;
    model_ = before;
    applied_.clear();
  }

  void OnChunk(std::span<const std::byte> chunk) {
    auto r = session_->Apply(chunk, F().decoder.get());
    if (!r.ok()) {
      Trace("chunk refused:", r.status().ToString());
      CHECK(Holds(*store_, model_));  // refused: nothing written
      return;
    }
    DecodedChunk c;
    CHECK(F().checker->Decode(chunk, &c).ok());
    const ChunkHeader& h = c.header;
    auto it = applied_.find(h.id);
    bool is_xor = h.kind == ChunkKind::kXor;
    Trace(*r == RefitSession::ApplyOutcome::kDuplicate ? "chunk duplicate"
                                                       : "chunk applied",
          std::to_string(h.id.tensor) + "/" + std::to_string(h.id.span) +
              (is_xor ? " xor" : " overwrite"));
    if (*r == RefitSession::ApplyOutcome::kDuplicate) {
      // Only an XOR chunk for a span that already got one is dropped.
      CHECK(is_xor && it != applied_.end());
    } else {
      // An XOR chunk applies only to a span nothing was applied to yet.
      CHECK(!is_xor || it == applied_.end());
      CHECK(h.id.tensor < model_.size());
      CHECK(plan_.mode == RefitMode::kDelta || !is_xor);
      uint64_t off = uint64_t{h.id.span} * plan_.span_elems * h.elem_size;
      uint64_t len = uint64_t{h.span_elems} * h.elem_size;
      CHECK(off + len <= model_[h.id.tensor].size());
      CHECK(
          ApplyChunk(c, std::span(model_[h.id.tensor]).subspan(off, len)).ok());
      applied_.insert(h.id);
    }
    CHECK(Holds(*store_, model_));
  }

  void OnEnd(const EndMsg& e) {
    NodeResult v = session_->Vote(e, nullptr);
    Trace("vote", std::string(NodeCodeName(v.code)) + " " + v.detail);
    std::vector<ChunkId> ids(applied_.begin(), applied_.end());
    bool complete = ids.size() == e.chunk_count &&
                    ChunkIdsDigest(ids) == e.chunk_ids_digest;
    const Digest128 digest = F().DigestOf(model_);
    const bool at_target = digest == plan_.target.digest;
    CHECK(v.chunks_applied == ids.size());
    // The bits decide: yes iff the store's digest is the target's (after a
    // repair round too, whose vote hashes only the tensors changed since).
    CHECK((v.code == NodeCode::kOk) == at_target);
    CHECK(v.version == Version{plan_.target.step, digest});
    if (v.code == NodeCode::kOk) {
      // The bits are the target the root planned, when this is its plan.
      if (plan_.target == root_plan_.target) {
        CHECK(Holds(*store_, root_target_));
      }
      CHECK(v.repair.empty());
    } else {
      CHECK(v.code ==
            (complete ? NodeCode::kDigestMismatch : NodeCode::kIncomplete));
      // With the target's tensor digests, the tensors to repair are
      // exactly those whose bits differ.
      std::vector<uint32_t> differ;
      if (plan_.target_tensor_digests.size() == model_.size()) {
        for (uint32_t t = 0; t < model_.size(); ++t) {
          if (TensorDigest(model_[t]) != plan_.target_tensor_digests[t]) {
            differ.push_back(t);
          }
        }
      }
      CHECK(v.repair == differ);
    }
    voted_yes_ = v.code == NodeCode::kOk;
    CHECK(Holds(*store_, model_));  // voting writes nothing
  }

  void OnCommit(const CommitMsg& c) {
    bool in_set = std::find(c.commit_set.begin(), c.commit_set.end(), kNode) !=
                  c.commit_set.end();
    if (!voted_yes_ || !in_set || c.target != plan_.target) {
      AbortSession();  // not in the commit set: restore the base
      return;
    }
    Trace("commit");
    CHECK(session_->Commit().ok());
    session_.reset();
    CHECK(Holds(*store_, model_));
    CHECK(store_->Digests().version == plan_.target.digest);
    if (plan_.target == root_plan_.target) {
      CHECK(Holds(*store_, root_target_));
    }
    VersionRecord rec = store_->record();
    CHECK(!rec.in_progress && rec.committed &&
          rec.committed->version == plan_.target &&
          rec.committed->refit == id_);
    CHECK(store_->committed() == plan_.target);
    committed_ = plan_.target;
    held_ = model_;
  }

  void AbortSession() {
    Trace("abort");
    CHECK(session_->Abort(F().decoder.get()).ok());
    session_.reset();
    // The refit is no longer in progress; a refit the store had left
    // unfinished when this one began (a full refit taking over) is recorded
    // again, since the restored bits are its mix.
    auto busy = store_->InProgress();
    CHECK(busy.has_value() == begin_unfinished_.has_value());
    if (busy) {
      CHECK(busy->refit == begin_unfinished_->refit &&
            busy->base == begin_unfinished_->base &&
            busy->target == begin_unfinished_->target);
    }
    // Abort restores the bits the store held when the plan was bound; a
    // store created for the refit has no base to go back to.
    if (!fresh_) CHECK(Holds(*store_, begin_bits_));
    held_ = BitsOf(*store_);
  }

  // The relay dies (no Commit, no Abort) and restarts on its store, or on
  // none (the store was lost).
  void Restart(bool lose_store) {
    Trace("restart", lose_store ? "without its store" : "");
    session_.reset();
    link_ = FrameDecoder();
    if (lose_store) {
      store_.reset();
    } else if (store_) {
      held_ = BitsOf(*store_);
    }
  }

  // Outside a refit the store holds what the last Commit, Abort or restart
  // left, and its committed record only ever changes by Commit.
  void CheckIdle() {
    if (!store_) return;
    CHECK(store_->committed() == committed_);
    if (session_) {
      CHECK(Holds(*store_, model_));
    } else {
      CHECK(Holds(*store_, held_));
    }
  }

  // The root.
  Bits root_bits_, root_target_;
  Version root_version_;
  PlanMsg root_plan_;
  RefitId root_id_ = IdOf(1);
  std::set<std::pair<uint32_t, uint32_t>> root_sent_;
  std::vector<Bytes> root_chunks_;
  uint64_t sequence_ = 0;

  // The relay.
  FrameDecoder link_;
  std::unique_ptr<WeightStore> store_;
  std::unique_ptr<RefitSession> session_;
  RefitId id_;
  PlanMsg plan_;
  bool fresh_ = false, voted_yes_ = false;

  // The model of the relay's store.
  Bits held_;                         // its bits outside a refit
  std::optional<Version> committed_;  // its committed record
  Bits begin_bits_;                   // its bits when the plan was bound
  std::optional<RefitInProgress> begin_unfinished_;  // and its record's
  Bits model_;                 // begin_bits_ + every applied chunk
  std::set<ChunkId> applied_;  // spans a chunk was applied to
};

}  // namespace
}  // namespace dcr

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dcr::Reader in(data, size);
  dcr::Harness h;
  h.Run(in);
  return 0;
}
