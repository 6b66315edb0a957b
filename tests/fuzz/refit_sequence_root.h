// The root's side of the refit_sequence fuzz target
// (refit_sequence_fuzz.cc, whose top says what an input holds): the input's
// reader, what every input shares, and the root, which turns input bytes
// into the refit messages it sends (PLAN, CHUNK, END, COMMIT) and keeps the
// bits it plans from and to. The relay's side, the model of its store and
// the invariants are in refit_sequence_fuzz.cc.
#ifndef DCR_TESTS_FUZZ_REFIT_SEQUENCE_ROOT_H_
#define DCR_TESTS_FUZZ_REFIT_SEQUENCE_ROOT_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

namespace dcr::refit_fuzz {

using Bytes = std::vector<std::byte>;
using Bits = std::vector<Bytes>;  // one buffer per tensor, manifest order

#define CHECK(...)                        \
  do {                                    \
    if (!(__VA_ARGS__)) __builtin_trap(); \
  } while (0)

inline constexpr char kNode[] = "n0";

// DCR_FUZZ_TRACE=1 prints what the relay did with each message (to read a
// reproducer or check that a seed reaches commit or abort).
inline void Trace(const char* what, const std::string& detail = "") {
  static const bool on = std::getenv("DCR_FUZZ_TRACE") != nullptr;
  if (on) std::fprintf(stderr, "refit_sequence: %s %s\n", what, detail.c_str());
}
inline constexpr uint64_t kSpanChoices[] = {4, 8, 16, 64};

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

inline uint64_t Mix(uint64_t x) {
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

inline Fixture& F() {
  static Fixture* f = new Fixture();
  return *f;
}

inline RefitId IdOf(uint8_t n) {
  RefitId id;
  id.bytes[0] = n;
  id.bytes[15] = 0xd;
  return id;
}

// A message the root sends, and how the transport treats its frame.
struct Message {
  FrameType type;
  Bytes payload;
  Tx tx;
};

class Root {
 public:
  Root() {
    root_bits_ = F().base;
    root_target_ = F().base;
    root_version_ = Version{0, F().DigestOf(root_bits_)};
    root_plan_.span_elems = 8;
  }

  // The refit the messages are for, its plan and its target's bits.
  const RefitId& id() const { return root_id_; }
  const PlanMsg& plan() const { return root_plan_; }
  const Bits& target() const { return root_target_; }

  // PLAN for a new target (the root's bits changed as the input says).
  Message Plan(Reader& in) {
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
    return {FrameType::kPlan, EncodePlan(p), tx};
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

  // A CHUNK of the planned target, or nothing (its span did not change,
  // or no chunk was sent yet to replay).
  std::optional<Message> Chunk(Reader& in) {
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
      if (root_chunks_.empty()) return std::nullopt;
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
          if (!r.ok() || !*r) return std::nullopt;  // nothing changed
          break;
        }
        case 2:
          if (!F().encoder->EncodeFull(id, w, target, &chunk).ok()) {
            return std::nullopt;
          }
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
            return std::nullopt;
          }
          break;
        }
      }
      if (kind != 5) root_sent_.insert({id.tensor, id.span});
      root_chunks_.push_back(chunk);
    }
    return Message{FrameType::kChunk, std::move(chunk), tx};
  }

  // END, naming the chunks sent (or every changed span), or wrong.
  Message End(Reader& in) {
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
    return {FrameType::kEnd, EncodeEnd(e), tx};
  }

  // COMMIT naming this node and the target (*names_target), another
  // node, or another target.
  Message Commit(Reader& in, bool* names_target) {
    uint8_t v = in.U8() % 3;
    Tx tx = in.ReadTx();
    CommitMsg c{root_plan_.target, {v == 1 ? "n1" : kNode}};
    if (v == 2) c.target.step += 1;
    *names_target = v == 0;
    return {FrameType::kCommit, EncodeCommit(c), tx};
  }

  // The node committed the target: the root's baseline advances to it.
  void Advance() {
    root_bits_ = root_target_;
    root_version_ = root_plan_.target;
  }

 private:
  Bits root_bits_, root_target_;
  Version root_version_;
  PlanMsg root_plan_;
  RefitId root_id_ = IdOf(1);
  std::set<std::pair<uint32_t, uint32_t>> root_sent_;
  std::vector<Bytes> root_chunks_;
};

}  // namespace dcr::refit_fuzz

#endif  // DCR_TESTS_FUZZ_REFIT_SEQUENCE_ROOT_H_
