// Payloads of the frames between a trainer rank's producer and the
// coordinator (docs/PROTOCOL.md §"Producers"; include/dcr/producer.h).
// Conventions as protocol/messages.h: a u8 message version (1) first,
// little-endian integers, varint counts checked against their bounds
// before allocating, no trailing bytes.
//
// Thread safety: values and pure functions.
#ifndef DCR_PROTOCOL_PRODUCER_MESSAGES_H_
#define DCR_PROTOCOL_PRODUCER_MESSAGES_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dcr/digest.h"
#include "dcr/status.h"
#include "dcr/version.h"

namespace dcr {

// The most canonical tensors a layout may have on the wire.
inline constexpr size_t kMaxProducerTensors = 1u << 20;

// Producer to coordinator, first: who it is and what its baseline holds.
// Version 1: u32 rank, u32 world, u64 step, layout fingerprint (digest),
// varint n then n linear digests (u64 low, u64 high): the parts of its
// baseline shards, one per canonical tensor of the layout (n = 0: no
// baseline).
struct ProducerHelloMsg {
  uint32_t rank = 0;
  uint32_t world = 0;
  uint64_t step = 0;  // the trainer's step
  Digest128 layout;
  std::vector<LinearDigest> base_parts;
  friend bool operator==(const ProducerHelloMsg&,
                         const ProducerHelloMsg&) = default;
};

// Coordinator to producer, once the relays took the PLAN: diff and send.
// Version 1: refit id (16 bytes), u64 span_elems, the base version, u64
// target step.
struct ProducerGoMsg {
  RefitId refit;
  uint64_t span_elems = 0;
  Version base;
  uint64_t target_step = 0;
  friend bool operator==(const ProducerGoMsg&, const ProducerGoMsg&) = default;
};

// Producer to coordinator, after its last CHUNK. Version 1: u64 chunks,
// u64 changed elements, varint n then n linear digests: the parts of its
// target shards (n = the layout's tensors).
struct ProducerDoneMsg {
  uint64_t chunks = 0;
  uint64_t changed = 0;
  std::vector<LinearDigest> target_parts;
  friend bool operator==(const ProducerDoneMsg&,
                         const ProducerDoneMsg&) = default;
};

// Coordinator to producer, last. Version 1: u8 outcome (ProducerOutcome:
// 0 committed, 1 partial, 2 aborted, 3 unfinished, 4 refused), refit id,
// the target version, string reason.
struct ProducerDecisionMsg {
  uint8_t outcome = 4;
  RefitId refit;
  Version target;
  std::string reason;
  friend bool operator==(const ProducerDecisionMsg&,
                         const ProducerDecisionMsg&) = default;
};
inline constexpr uint8_t kMaxProducerOutcome = 4;

// Coordinator to a producer that said hello without a baseline (a rank
// restarted without its shards), before PRODUCER_GO: a piece of one of its
// shards at the tree's version, from root.baseline. Every shard of the
// rank comes whole, in order of offset, before the GO. Version 1: string
// shard (its name in the layout), u64 total (the shard's bytes), u64
// offset, varint n (at most kMaxProducerBaselinePiece) then n bytes;
// offset + n <= total.
struct ProducerBaselineMsg {
  std::string shard;
  uint64_t total = 0;
  uint64_t offset = 0;
  std::span<const std::byte> bytes;  // views the payload it was decoded from
};
inline constexpr uint64_t kMaxProducerBaselinePiece = uint64_t{64} << 20;

std::vector<std::byte> EncodeProducerHello(const ProducerHelloMsg& m);
std::vector<std::byte> EncodeProducerGo(const ProducerGoMsg& m);
std::vector<std::byte> EncodeProducerDone(const ProducerDoneMsg& m);
std::vector<std::byte> EncodeProducerDecision(const ProducerDecisionMsg& m);
std::vector<std::byte> EncodeProducerBaseline(const ProducerBaselineMsg& m);

// Corruption naming the message and the field on malformed, truncated,
// oversized or trailing input, or an unknown version.
Result<ProducerHelloMsg> DecodeProducerHello(std::span<const std::byte> b);
Result<ProducerGoMsg> DecodeProducerGo(std::span<const std::byte> b);
Result<ProducerDoneMsg> DecodeProducerDone(std::span<const std::byte> b);
Result<ProducerDecisionMsg> DecodeProducerDecision(
    std::span<const std::byte> b);
Result<ProducerBaselineMsg> DecodeProducerBaseline(
    std::span<const std::byte> b);

}  // namespace dcr

#endif  // DCR_PROTOCOL_PRODUCER_MESSAGES_H_
