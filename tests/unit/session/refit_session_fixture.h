// The fixture of the RefitSession tests: a real file store holding a
// base, the chunks that take it to a target, and helpers to drive and
// check a session (refit_session_test.cc, refit_session_crash_test.cc).
#ifndef DCR_TESTS_UNIT_RELAY_REFIT_SESSION_FIXTURE_H_
#define DCR_TESTS_UNIT_RELAY_REFIT_SESSION_FIXTURE_H_

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "dcr/checkpoint.h"
#include "session/journal.h"
#include "session/refit_session.h"
#include "testing/store_pair.h"
#include "testing/temp_dir.h"

namespace dcr::testing_relay {

constexpr uint64_t kSpan = 1024;
using Bytes = std::vector<std::byte>;

class RefitSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (infos_.empty()) {
      infos_ = {{"a", DType::kBF16, {3000}}, {"b", DType::kF32, {500}}};
    }
    testing::StorePair pair = testing::MakeStorePair(infos_);
    base_ = std::move(pair.base);
    target_ = std::move(pair.target);
    path_ = dir_.Path("node.safetensors");
    Write(path_, base_);
    Reopen();
    base_v_ = Version{1, store_->Digests().version};
    std::string tpath = dir_.Path("target.safetensors");
    Write(tpath, target_);
    auto t = Checkpoint::Open(tpath, Checkpoint::Mode::kReadOnly);
    ASSERT_TRUE(t.ok());
    target_v_ = Version{2, (*t)->ComputeDigests().version};
    plan_.mode = RefitMode::kDelta;
    plan_.base = base_v_;
    plan_.target = target_v_;
    plan_.manifest = store_->manifest().digest();
    plan_.span_elems = kSpan;
    plan_.nodes = {{"n0", "127.0.0.1", 1, "tcp", -1}};
    refit_.bytes[0] = 7;
    decoder_ = std::move(*ChunkDecoder::Create());
    MakeChunks(ChunkKind::kXor, &xor_chunks_);
    MakeChunks(ChunkKind::kOverwrite, &overwrite_chunks_);
  }

  void Write(const std::string& path, const std::vector<Bytes>& data) {
    std::vector<TensorToWrite> tw;
    for (size_t i = 0; i < infos_.size(); ++i)
      tw.push_back({infos_[i], data[i]});
    ASSERT_TRUE(WriteSafetensors(path, tw, {}).ok());
  }
  void Reopen() {
    store_.reset();
    auto s = OpenStore(*ParseStoreSpec("file:" + path_));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
  }
  void MakeChunks(ChunkKind kind, std::vector<Bytes>* out) {
    auto enc = std::move(*ChunkEncoder::Create(EncodeOptions()));
    for (uint32_t t = 0; t < infos_.size(); ++t) {
      size_t w = DTypeSize(infos_[t].dtype);
      uint64_t n = infos_[t].NumElements();
      for (uint32_t s = 0; s < SpanCount(n, kSpan); ++s) {
        uint64_t off = s * kSpan * w, len = std::min(kSpan, n - s * kSpan) * w;
        Bytes c;
        auto r = enc->EncodeDiff(kind, {t, s}, w,
                                 std::span(base_[t]).subspan(off, len),
                                 std::span(target_[t]).subspan(off, len), &c);
        ASSERT_TRUE(r.ok());
        if (*r) out->push_back(std::move(c));
      }
    }
  }
  // Each span's changes cut into `parts` parts as a producers' refit
  // sends them: element e goes to part e % parts + 1 (ranks interleaved
  // element by element, the hardest case). Values are XOR masks or the
  // target's bits, by `kind`.
  void MakePartChunks(ChunkKind kind, uint16_t parts, std::vector<Bytes>* out) {
    auto enc = std::move(*ChunkEncoder::Create(EncodeOptions()));
    for (uint32_t t = 0; t < infos_.size(); ++t) {
      size_t w = DTypeSize(infos_[t].dtype);
      uint64_t n = infos_[t].NumElements();
      for (uint32_t s = 0; s < SpanCount(n, kSpan); ++s) {
        const uint64_t first = s * kSpan;
        const uint32_t len = static_cast<uint32_t>(std::min(kSpan, n - first));
        for (uint16_t p = 0; p < parts; ++p) {
          std::vector<uint32_t> positions;
          Bytes values;
          for (uint32_t e = p; e < len; e += parts) {
            const std::byte* b = base_[t].data() + (first + e) * w;
            const std::byte* g = target_[t].data() + (first + e) * w;
            if (std::memcmp(b, g, w) == 0) continue;
            positions.push_back(e);
            for (size_t k = 0; k < w; ++k) {
              values.push_back(kind == ChunkKind::kXor ? (b[k] ^ g[k]) : g[k]);
            }
          }
          if (positions.empty()) continue;
          Bytes c;
          ASSERT_TRUE(enc->EncodeChanges(kind, ChunkId{t, s, uint16_t(p + 1)},
                                         w, len, positions, values, &c)
                          .ok());
          out->push_back(std::move(c));
        }
      }
    }
  }
  void MakeFullChunks(std::vector<Bytes>* out) {
    auto enc = std::move(*ChunkEncoder::Create(EncodeOptions()));
    for (uint32_t t = 0; t < infos_.size(); ++t) {
      size_t w = DTypeSize(infos_[t].dtype);
      uint64_t n = infos_[t].NumElements();
      for (uint32_t s = 0; s < SpanCount(n, kSpan); ++s) {
        uint64_t off = s * kSpan * w, len = std::min(kSpan, n - s * kSpan) * w;
        Bytes c;
        ASSERT_TRUE(enc->EncodeFull({t, s}, w,
                                    std::span(target_[t]).subspan(off, len), &c)
                        .ok());
        out->push_back(std::move(c));
      }
    }
  }
  EndMsg End(const std::vector<Bytes>& chunks) {
    std::vector<ChunkId> ids;
    for (const auto& c : chunks) ids.push_back(PeekChunkHeader(c)->id);
    const uint64_t n = ids.size();
    return EndMsg{n, ChunkIdsDigest(std::move(ids))};
  }
  std::unique_ptr<RefitSession> Begin(RefitSession::Options options = {}) {
    NodeResult refusal;
    auto s = RefitSession::Begin(store_.get(), "n0", refit_, plan_, &refusal,
                                 options);
    EXPECT_TRUE(s) << refusal.detail;
    return s;
  }
  bool StoreHolds(const std::vector<Bytes>& data) {
    return testing::StoreHolds(*store_, data);
  }

  testing::TempDir dir_;
  std::vector<TensorInfo> infos_;
  std::vector<Bytes> base_, target_;
  std::string path_;
  std::unique_ptr<WeightStore> store_;
  Version base_v_, target_v_;
  PlanMsg plan_;
  RefitId refit_;
  std::unique_ptr<ChunkDecoder> decoder_;
  std::vector<Bytes> xor_chunks_, overwrite_chunks_;
};

}  // namespace dcr::testing_relay

#endif  // DCR_TESTS_UNIT_RELAY_REFIT_SESSION_FIXTURE_H_
