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
//
// The root's side (the input's reader, the messages it builds) is in
// refit_sequence_root.h.
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
#include "refit_sequence_root.h"
#include "session/refit_session.h"

namespace dcr::refit_fuzz {
namespace {

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

class Harness {
 public:
  Harness() {
    store_ = *CreateStore(StoreSpec(), F().manifest);
    for (size_t i = 0; i < F().base.size(); ++i) {
      std::copy(F().base[i].begin(), F().base[i].end(),
                store_->MutableTensor(i).begin());
    }
    held_ = F().base;
  }

  void Run(Reader& in) {
    for (int ops = 0; ops < 64 && !in.done(); ++ops) {
      switch (in.U8() % 10) {
        case 0:
          Send(root_.Plan(in));
          break;
        case 1:
        case 2:
        case 3:
          if (auto chunk = root_.Chunk(in)) Send(*chunk);
          break;
        case 4:
          Send(root_.End(in));
          break;
        case 5: {
          bool names_target = false;
          Send(root_.Commit(in, &names_target));
          // The root's baseline advances once the node committed.
          if (names_target && committed_ == root_.plan().target) {
            root_.Advance();
          }
          break;
        }
        case 6:
          Send({FrameType::kAbort, EncodeAbort({"fuzz"}), in.ReadTx()});
          break;
        case 7:
          Restart(in.U8() & 1);
          break;
        case 8: {
          uint8_t type = 1 + in.U8() % kMaxFrameType;
          Bytes payload = in.Take(in.U8());
          Send({static_cast<FrameType>(type), std::move(payload), in.ReadTx()});
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
  // Frames `m` (for the root's refit) and feeds it to the relay's link
  // decoder, damaged and split as its transport byte says, then handles
  // what decodes.
  void Send(const Message& m) {
    std::span<const std::byte> payload(m.payload);
    const Tx& tx = m.tx;
    FrameHeader h;
    h.type = m.type;
    h.epoch = 1;
    h.sequence = sequence_++;
    h.refit_id = root_.id();
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
      case FrameType::kStreamMark:
        // Any tensor, beyond the manifest too: a hint, never a reason for
        // the vote to take a stale digest (OnEnd checks the vote).
        if (auto m = DecodeStreamMark(f.payload);
            m.ok() && session_ && f.header.refit_id == id_) {
          session_->StreamPassed(m->tensor);
        }
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
    // As a relay's apply workers do: counted queued until it applied.
    session_->Queued(chunk);
    auto r = session_->Apply(chunk, F().decoder.get());
    session_->Unqueued(chunk);
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
      if (plan_.target == root_.plan().target) {
        CHECK(Holds(*store_, root_.target()));
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
    if (plan_.target == root_.plan().target) {
      CHECK(Holds(*store_, root_.target()));
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

  // The root, and the sequence number of its next frame.
  Root root_;
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
}  // namespace dcr::refit_fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dcr::refit_fuzz::Reader in(data, size);
  dcr::refit_fuzz::Harness h;
  h.Run(in);
  return 0;
}
