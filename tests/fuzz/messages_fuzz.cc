// Fuzzes the refit message decoders (src/protocol/messages.h, the signed
// manifest a version-2 END carries, src/protocol/refit_manifest.h, and the
// producers' messages, src/protocol/producer_messages.h). The first byte
// picks the message (modulo 10); whatever decodes must encode back to the
// same bytes (the encodings are canonical).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "protocol/messages.h"
#include "protocol/producer_messages.h"
#include "protocol/refit_manifest.h"

namespace {

template <typename Decode, typename Encode>
void RoundTrip(std::span<const std::byte> b, Decode decode, Encode encode) {
  auto m = decode(b);
  if (!m.ok()) return;
  auto again = encode(*m);
  if (again.size() != b.size() ||
      !std::equal(again.begin(), again.end(), b.begin())) {
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::span<const std::byte> b(reinterpret_cast<const std::byte*>(data) + 1,
                               size - 1);
  switch (data[0] % 13) {
    case 0:
      RoundTrip(b, dcr::DecodeHello, dcr::EncodeHello);
      break;
    case 1: {
      auto plan = dcr::DecodePlan(b);
      if (plan.ok()) {
        auto again = dcr::EncodePlan(*plan);
        if (!std::equal(again.begin(), again.end(), b.begin(), b.end())) {
          std::abort();
        }
        // Every decoded plan is valid input for SubPlan.
        for (size_t i = 0; i < plan->nodes.size(); ++i) {
          dcr::PlanMsg sub = dcr::SubPlan(*plan, i);
          if (sub.nodes.empty() || sub.nodes[0].name != plan->nodes[i].name) {
            std::abort();
          }
        }
      }
      break;
    }
    case 2:
      RoundTrip(b, dcr::DecodeResults, dcr::EncodeResults);
      break;
    case 3: {
      RoundTrip(b, dcr::DecodeEnd, dcr::EncodeEnd);
      // A signed END's manifest decodes canonically too, or not at all.
      auto end = dcr::DecodeEnd(b);
      if (end.ok() && end->is_signed()) {
        RoundTrip(end->manifest, dcr::DecodeManifest, dcr::EncodeManifest);
      }
      break;
    }
    case 4:
      RoundTrip(b, dcr::DecodeCommit, dcr::EncodeCommit);
      break;
    case 5:
      RoundTrip(b, dcr::DecodeAbort, dcr::EncodeAbort);
      break;
    case 6:
      RoundTrip(b, dcr::DecodeProducerHello, dcr::EncodeProducerHello);
      break;
    case 7:
      RoundTrip(b, dcr::DecodeProducerGo, dcr::EncodeProducerGo);
      break;
    case 8:
      RoundTrip(b, dcr::DecodeProducerDone, dcr::EncodeProducerDone);
      break;
    case 9:
      RoundTrip(b, dcr::DecodeProducerDecision, dcr::EncodeProducerDecision);
      break;
    case 10:
      RoundTrip(b, dcr::DecodeProducerBaseline, dcr::EncodeProducerBaseline);
      break;
    case 11:
      RoundTrip(b, dcr::DecodeProgress, dcr::EncodeProgress);
      break;
    case 12:
      RoundTrip(b, dcr::DecodeStreamMark, dcr::EncodeStreamMark);
      break;
  }
  return 0;
}
