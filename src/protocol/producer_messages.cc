#include "protocol/producer_messages.h"

#include "common/bytes.h"
#include "dcr/codec.h"
#include "protocol/message_io.h"

namespace dcr {
namespace {

using namespace message_io;  // NOLINT(google-build-using-namespace)

void PutParts(ByteWriter* w, const std::vector<LinearDigest>& parts) {
  w->PutVarint(parts.size());
  for (const LinearDigest& d : parts) {
    w->Put<uint64_t>(d.low);
    w->Put<uint64_t>(d.high);
  }
}

std::vector<LinearDigest> GetParts(Reader* r, const char* field) {
  std::vector<LinearDigest> parts;
  uint64_t n = r->Varint(field, kMaxProducerTensors);
  for (uint64_t i = 0; r->ok() && i < n; ++i) {
    LinearDigest d;
    d.low = r->Get<uint64_t>(field);
    d.high = r->Get<uint64_t>(field);
    parts.push_back(d);
  }
  return parts;
}

void PutRefit(ByteWriter* w, const RefitId& id) {
  for (uint8_t b : id.bytes) w->Put<uint8_t>(b);
}

RefitId GetRefit(Reader* r, const char* field) {
  RefitId id;
  for (uint8_t& b : id.bytes) b = r->Get<uint8_t>(field);
  return id;
}

}  // namespace

std::vector<std::byte> EncodeProducerHello(const ProducerHelloMsg& m) {
  std::vector<std::byte> out;
  ByteWriter w(&out);
  w.Put<uint8_t>(kMessageVersion);
  w.Put<uint32_t>(m.rank);
  w.Put<uint32_t>(m.world);
  w.Put<uint64_t>(m.step);
  PutDigest(&w, m.layout);
  PutParts(&w, m.base_parts);
  return out;
}

Result<ProducerHelloMsg> DecodeProducerHello(std::span<const std::byte> b) {
  Reader r(b, "PRODUCER_HELLO");
  ProducerHelloMsg m;
  m.rank = r.Get<uint32_t>("rank");
  m.world = r.Get<uint32_t>("world");
  m.step = r.Get<uint64_t>("step");
  m.layout = r.Digest("layout");
  m.base_parts = GetParts(&r, "base_parts");
  if (r.ok() && m.world == 0) r.Fail("world", "0");
  if (r.ok() && m.rank >= m.world) r.Fail("rank", "not below world");
  DCR_RETURN_IF_ERROR(r.Finish());
  return m;
}

std::vector<std::byte> EncodeProducerGo(const ProducerGoMsg& m) {
  std::vector<std::byte> out;
  ByteWriter w(&out);
  w.Put<uint8_t>(kMessageVersion);
  PutRefit(&w, m.refit);
  w.Put<uint64_t>(m.span_elems);
  PutVersion(&w, m.base);
  w.Put<uint64_t>(m.target_step);
  return out;
}

Result<ProducerGoMsg> DecodeProducerGo(std::span<const std::byte> b) {
  Reader r(b, "PRODUCER_GO");
  ProducerGoMsg m;
  m.refit = GetRefit(&r, "refit");
  m.span_elems = r.Get<uint64_t>("span_elems");
  m.base = r.Ver("base");
  m.target_step = r.Get<uint64_t>("target_step");
  if (r.ok() && (m.span_elems == 0 || m.span_elems > kMaxSpanElems)) {
    r.Fail("span_elems", "out of range");
  }
  DCR_RETURN_IF_ERROR(r.Finish());
  return m;
}

std::vector<std::byte> EncodeProducerDone(const ProducerDoneMsg& m) {
  std::vector<std::byte> out;
  ByteWriter w(&out);
  w.Put<uint8_t>(kMessageVersion);
  w.Put<uint64_t>(m.chunks);
  w.Put<uint64_t>(m.changed);
  PutParts(&w, m.target_parts);
  return out;
}

Result<ProducerDoneMsg> DecodeProducerDone(std::span<const std::byte> b) {
  Reader r(b, "PRODUCER_DONE");
  ProducerDoneMsg m;
  m.chunks = r.Get<uint64_t>("chunks");
  m.changed = r.Get<uint64_t>("changed");
  m.target_parts = GetParts(&r, "target_parts");
  DCR_RETURN_IF_ERROR(r.Finish());
  return m;
}

std::vector<std::byte> EncodeProducerDecision(const ProducerDecisionMsg& m) {
  std::vector<std::byte> out;
  ByteWriter w(&out);
  w.Put<uint8_t>(kMessageVersion);
  w.Put<uint8_t>(m.outcome);
  PutRefit(&w, m.refit);
  PutVersion(&w, m.target);
  PutString(&w, m.reason);
  return out;
}

Result<ProducerDecisionMsg> DecodeProducerDecision(
    std::span<const std::byte> b) {
  Reader r(b, "PRODUCER_DECISION");
  ProducerDecisionMsg m;
  m.outcome = r.Get<uint8_t>("outcome");
  if (r.ok() && m.outcome > kMaxProducerOutcome) {
    r.Fail("outcome", "unknown value " + std::to_string(m.outcome));
  }
  m.refit = GetRefit(&r, "refit");
  m.target = r.Ver("target");
  m.reason = r.String("reason");
  DCR_RETURN_IF_ERROR(r.Finish());
  return m;
}

std::vector<std::byte> EncodeProducerBaseline(const ProducerBaselineMsg& m) {
  std::vector<std::byte> out;
  ByteWriter w(&out);
  w.Put<uint8_t>(kMessageVersion);
  PutString(&w, m.shard);
  w.Put<uint64_t>(m.total);
  w.Put<uint64_t>(m.offset);
  w.PutVarint(m.bytes.size());
  out.insert(out.end(), m.bytes.begin(), m.bytes.end());
  return out;
}

Result<ProducerBaselineMsg> DecodeProducerBaseline(
    std::span<const std::byte> b) {
  Reader r(b, "PRODUCER_BASELINE");
  ProducerBaselineMsg m;
  m.shard = r.String("shard");
  m.total = r.Get<uint64_t>("total");
  m.offset = r.Get<uint64_t>("offset");
  const uint64_t n = r.Varint("bytes", kMaxProducerBaselinePiece);
  if (r.ok() && (m.offset > m.total || n > m.total - m.offset)) {
    r.Fail("bytes", "offset " + std::to_string(m.offset) + " + " +
                        std::to_string(n) + " bytes pass the shard's " +
                        std::to_string(m.total));
  }
  m.bytes = r.View("bytes", n);
  DCR_RETURN_IF_ERROR(r.Finish());
  return m;
}

}  // namespace dcr
