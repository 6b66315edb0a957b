// root.baseline while a refit streams (coord/baseline_stream.h): spans take
// the target's bits only after their chunks are synced in the history's
// temporary file; that file and the target restore the base exactly, from
// any mix of base, target and torn spans, any number of times.
#include "coord/baseline_stream.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <random>

#include "common/file.h"
#include "testing/forwarding_store.h"
#include "testing/temp_dir.h"

namespace dcr {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::byte>;

constexpr uint64_t kSpan = 4096;
// Three tensors: 3 spans (the last one short), 1 span, 2 spans.
const std::vector<uint64_t> kElems = {2 * kSpan + 1000, 700, 2 * kSpan};

std::vector<Bytes> Random(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Bytes> t;
  for (uint64_t n : kElems) {
    Bytes b(n * 2);
    for (auto& x : b) x = static_cast<std::byte>(rng());
    t.push_back(std::move(b));
  }
  return t;
}

std::vector<Bytes> Step(std::vector<Bytes> t, uint32_t seed) {
  std::mt19937 rng(seed);
  std::bernoulli_distribution pick(0.03);
  for (auto& b : t) {
    for (size_t i = 0; i < b.size(); i += 2) {
      if (pick(rng)) b[i] ^= static_cast<std::byte>(1 + rng() % 7);
    }
  }
  // One span that does not change at all.
  t[2] = Random(1)[2];
  return t;
}

class BaselineStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_bits_ = Random(1);
    target_bits_ = Step(base_bits_, 2);
    ASSERT_TRUE(Write(dir_.Path("base.safetensors"), base_bits_).ok());
    ASSERT_TRUE(Write(dir_.Path("target.safetensors"), target_bits_).ok());
    base_ = *Checkpoint::Open(dir_.Path("base.safetensors"),
                              Checkpoint::Mode::kReadOnly);
    target_ = *Checkpoint::Open(dir_.Path("target.safetensors"),
                                Checkpoint::Mode::kReadOnly);
    base_digest_ = base_->ComputeDigests().version;
    baseline_ = *CreateMemoryStoreFrom(*base_);
    encoder_ = *ChunkEncoder::Create(EncodeOptions{});
  }

  static Status Write(const std::string& path, const std::vector<Bytes>& t) {
    std::vector<TensorToWrite> w;
    for (size_t i = 0; i < t.size(); ++i) {
      w.push_back(
          {TensorInfo{"t" + std::to_string(i), DType::kBF16, {kElems[i]}},
           t[i]});
    }
    return WriteSafetensors(path, w, {});
  }

  std::vector<ChunkId> Spans() const {
    std::vector<ChunkId> ids;
    for (uint32_t t = 0; t < kElems.size(); ++t) {
      for (uint32_t s = 0; s < SpanCount(kElems[t], kSpan); ++s) {
        ids.push_back({t, s});
      }
    }
    return ids;
  }

  std::span<const std::byte> SpanOf(const Checkpoint& c, ChunkId id) const {
    const uint64_t first = uint64_t{id.span} * kSpan;
    const uint64_t n = std::min(kSpan, kElems[id.tensor] - first);
    return c.TensorData(id.tensor).subspan(first * 2, n * 2);
  }

  BaselineInStream::Options Opts(HistoryRecording* record,
                                 uint64_t sync_bytes) {
    BaselineInStream::Options o;
    o.baseline = baseline_.get();
    o.target = target_.get();
    o.pool = &pool_;
    o.record = record;
    o.refit.bytes[0] = 1;
    o.base = Version{0, base_digest_};
    o.to = Version{1, target_->ComputeDigests().version};
    o.span_elems = kSpan;
    o.sync_bytes = sync_bytes;
    return o;
  }

  // Streams every span as a refit does: encode, record, Changed, and
  // AfterBatch every `batch` spans (`after` sees each batch's state).
  // `last_in_background`: the last batch is left to
  // SettleLastInBackground, as RefitRun does.
  void Stream(HistoryRecording* record, BaselineInStream* in_stream,
              size_t batch, const std::function<void(size_t)>& after = {},
              bool last_in_background = false) {
    auto ids = Spans();
    for (size_t i = 0; i < ids.size(); ++i) {
      Bytes out;
      auto r = encoder_->EncodeDiff(ChunkKind::kXor, ids[i], 2,
                                    SpanOf(*base_, ids[i]),
                                    SpanOf(*target_, ids[i]), &out);
      ASSERT_TRUE(r.ok());
      if (*r) {
        record->Append(out);
        in_stream->Changed(ids[i]);
      }
      const bool last = i + 1 == ids.size();
      if (last && last_in_background) return;
      if ((i + 1) % batch == 0 || last) {
        ASSERT_TRUE(in_stream->AfterBatch(last).ok());
        if (after) after(i + 1);
      }
    }
  }

  bool BaselineIs(const Checkpoint& c) const {
    for (size_t t = 0; t < kElems.size(); ++t) {
      auto a = baseline_->Tensor(t);
      auto b = c.TensorData(t);
      if (!std::equal(a.begin(), a.end(), b.begin(), b.end())) return false;
    }
    return true;
  }

  testing::TempDir dir_;
  ThreadPool pool_{2};
  std::vector<Bytes> base_bits_, target_bits_;
  std::unique_ptr<Checkpoint> base_, target_;
  Digest128 base_digest_;
  std::unique_ptr<WeightStore> baseline_;
  std::unique_ptr<ChunkEncoder> encoder_;
};

TEST_F(BaselineStreamTest, SpansWaitForTheSyncThenTakeTheTarget) {
  DeltaHistory history(dir_.Path("history"), 4);
  HistoryRecording record(history, RefitId());
  ASSERT_TRUE(record.active());
  BaselineInStream in_stream(Opts(&record, uint64_t{1} << 30));
  Stream(&record, &in_stream, 2, [&](size_t done) {
    if (done < Spans().size()) {
      // Below sync_bytes: nothing written, nothing flagged yet.
      EXPECT_TRUE(BaselineIs(*base_)) << done;
      EXPECT_FALSE(baseline_->InProgress().has_value());
    }
  });
  EXPECT_TRUE(in_stream.complete());
  EXPECT_TRUE(in_stream.touched());
  EXPECT_TRUE(BaselineIs(*target_));
  ASSERT_TRUE(baseline_->InProgress().has_value());
  EXPECT_EQ(baseline_->InProgress()->base.digest, base_digest_);
  // The unchanged tensor was not written.
  EXPECT_EQ(in_stream.written_bytes(), (kElems[0] + kElems[1]) * 2);
  // The undo log is on disk, whole, and takes the baseline back.
  EXPECT_TRUE(fs::exists(record.undo_path()));
  auto r =
      RestoreBase(record.undo_path(), *target_, baseline_.get(), kSpan, &pool_);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->spans, 4u);
  EXPECT_FALSE(r->torn_tail);
  EXPECT_TRUE(BaselineIs(*base_));
}

TEST_F(BaselineStreamTest, ASmallSyncSizeWritesAsTheStreamGoes) {
  DeltaHistory history(dir_.Path("history"), 4);
  HistoryRecording record(history, RefitId());
  BaselineInStream in_stream(Opts(&record, 1));
  bool early = false;
  Stream(&record, &in_stream, 1, [&](size_t done) {
    if (done == 1) early = in_stream.touched();
  });
  EXPECT_TRUE(early) << "the first batch's span waited for the end";
  EXPECT_TRUE(in_stream.complete());
  EXPECT_TRUE(BaselineIs(*target_));
}

// A baseline whose writes wait until the test opens them (or 2 s pass, so
// that a settle run on the caller's thread ends, late, and the test fails
// instead of hanging).
class GatedStore final : public testing::ForwardingStore {
 public:
  explicit GatedStore(WeightStore* inner) : ForwardingStore("gated:", inner) {}
  Status WriteTensor(size_t i, uint64_t offset,
                     std::span<const std::byte> bytes) override {
    {
      std::unique_lock lock(mu_);
      open_cv_.wait_for(lock, std::chrono::seconds(2), [&] { return open_; });
      open_ = true;  // a timed-out wait lets the rest through
    }
    Status s = fail_ ? Status::IOError("disk full")
                     : inner()->WriteTensor(i, offset, bytes);
    std::lock_guard lock(mu_);
    ++finished_;
    return s;
  }
  void Open() {
    std::lock_guard lock(mu_);
    open_ = true;
    open_cv_.notify_all();
  }
  int finished() {
    std::lock_guard lock(mu_);
    return finished_;
  }
  bool fail_ = false;  // set before the writes start

 private:
  std::mutex mu_;
  std::condition_variable open_cv_;
  bool open_ = false;
  int finished_ = 0;
};

TEST_F(BaselineStreamTest, TheLastBatchIsWrittenBesideTheCaller) {
  DeltaHistory history(dir_.Path("history"), 4);
  HistoryRecording record(history, RefitId());
  GatedStore gated(baseline_.get());
  auto o = Opts(&record, uint64_t{1} << 30);
  o.baseline = &gated;
  BaselineInStream in_stream(o);
  Stream(&record, &in_stream, 2, {}, /*last_in_background=*/true);
  EXPECT_FALSE(in_stream.touched());
  std::atomic<int> woken{0};
  in_stream.SettleLastInBackground(2, [&] { ++woken; });
  // Back before a single write finished: END would not wait for them.
  EXPECT_EQ(gated.finished(), 0);
  EXPECT_FALSE(in_stream.finished());
  gated.Open();
  ASSERT_TRUE(in_stream.Join().ok());
  EXPECT_EQ(woken.load(), 1);
  EXPECT_EQ(gated.finished(), 4);
  EXPECT_TRUE(in_stream.complete());
  EXPECT_TRUE(BaselineIs(*target_));
  EXPECT_GE(in_stream.seconds(), 0.0);
  // Joined: a second Join returns at once, with the same status.
  EXPECT_TRUE(in_stream.Join().ok());
  // The undo log covers what the thread wrote.
  auto r =
      RestoreBase(record.undo_path(), *target_, baseline_.get(), kSpan, &pool_);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(BaselineIs(*base_));
}

TEST_F(BaselineStreamTest, AFailedLastBatchIsJoinsError) {
  DeltaHistory history(dir_.Path("history"), 4);
  HistoryRecording record(history, RefitId());
  GatedStore gated(baseline_.get());
  gated.fail_ = true;
  gated.Open();
  auto o = Opts(&record, uint64_t{1} << 30);
  o.baseline = &gated;
  BaselineInStream in_stream(o);
  Stream(&record, &in_stream, 2, {}, /*last_in_background=*/true);
  in_stream.SettleLastInBackground(1, {});
  Status s = in_stream.Join();
  EXPECT_EQ(s.code(), StatusCode::kIOError) << s.ToString();
  EXPECT_NE(s.ToString().find("writing root.baseline during the stream"),
            std::string::npos)
      << s.ToString();
  EXPECT_FALSE(in_stream.complete());
  // Flagged, and some writes may have landed: an abort restores the base.
  EXPECT_TRUE(in_stream.touched());
  EXPECT_TRUE(gated.InProgress().has_value());
}

TEST_F(BaselineStreamTest, NoRecordNoOverlap) {
  HistoryRecording none;
  BaselineInStream in_stream(Opts(&none, 1));
  EXPECT_FALSE(in_stream.active());
  in_stream.Changed({0, 0});
  EXPECT_TRUE(in_stream.AfterBatch(true).ok());
  EXPECT_FALSE(in_stream.complete());
  EXPECT_FALSE(in_stream.touched());
  EXPECT_TRUE(BaselineIs(*base_));
}

// A crash: the log cut inside a chunk, the baseline a mix of base, target
// and a torn span wherever the log reaches (write-ahead: nothing past it
// was written). The restore is exact, and exact again when repeated.
TEST_F(BaselineStreamTest, RestoreFromATornLogAndAnyMixIsExactAndRepeatable) {
  DeltaHistory history(dir_.Path("history"), 4);
  std::string log;
  {
    HistoryRecording record(history, RefitId());
    BaselineInStream in_stream(Opts(&record, uint64_t{1} << 30));
    Stream(&record, &in_stream, 100);
    record.Pin();
    log = record.undo_path();
  }  // pinned: the file outlives the recording
  ASSERT_TRUE(fs::exists(log));
  auto bytes = *ReadFileToString(log);
  // Cut the last chunk in half: tensor 1's span is not in the log.
  auto h = PeekChunkHeader(
      std::as_bytes(std::span(bytes)).subspan(kDeltaHeaderBytes));
  ASSERT_TRUE(h.ok());
  size_t at = kDeltaHeaderBytes, last = 0;
  while (at < bytes.size()) {
    last = at;
    at += PeekChunkHeader(std::as_bytes(std::span(bytes)).subspan(at))
              ->total_bytes;
  }
  bytes.resize(last + (bytes.size() - last) / 2);
  ASSERT_TRUE(WriteFileAtomic(log, std::as_bytes(std::span(bytes))).ok());
  // The baseline: tensor 0 span 0 at the target, span 1 torn (half target),
  // span 2 at the base; the cut chunk's span (tensor 1) at the base.
  baseline_ = *CreateMemoryStoreFrom(*base_);
  auto t0 = baseline_->MutableTensor(0);
  auto tgt = target_->TensorData(0);
  std::copy(tgt.begin(), tgt.begin() + kSpan * 2, t0.begin());
  std::copy(tgt.begin() + kSpan * 2, tgt.begin() + kSpan * 3,
            t0.begin() + kSpan * 2);
  for (int round = 0; round < 2; ++round) {
    auto r = RestoreBase(log, *target_, baseline_.get(), kSpan, &pool_);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(r->torn_tail);
    EXPECT_EQ(r->spans, 3u);
    EXPECT_TRUE(BaselineIs(*base_)) << "round " << round;
    EXPECT_EQ(baseline_->Digests(&pool_).version, base_digest_);
  }
  // A host crash may leave a whole header over bytes that never reached
  // the disk: the chunk does not decode, its span (never written) stays.
  bytes.resize(last);  // the third chunk ends the file again
  auto third = PeekChunkHeader(
      std::as_bytes(std::span(bytes)).subspan(kDeltaHeaderBytes));
  ASSERT_TRUE(third.ok());
  size_t at3 = kDeltaHeaderBytes, prev = at3;
  while (at3 < bytes.size()) {
    prev = at3;
    at3 += PeekChunkHeader(std::as_bytes(std::span(bytes)).subspan(at3))
               ->total_bytes;
  }
  std::fill(bytes.begin() + static_cast<std::ptrdiff_t>(prev + 40), bytes.end(),
            '\0');
  ASSERT_TRUE(WriteFileAtomic(log, std::as_bytes(std::span(bytes))).ok());
  baseline_ = *CreateMemoryStoreFrom(*base_);
  auto t0b = baseline_->MutableTensor(0);
  std::copy(tgt.begin(), tgt.begin() + kSpan * 2, t0b.begin());
  auto r = RestoreBase(log, *target_, baseline_.get(), kSpan, &pool_);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->torn_tail);
  EXPECT_EQ(r->spans, 2u);
  EXPECT_TRUE(BaselineIs(*base_));
}

TEST_F(BaselineStreamTest, RestoreRefusesWhatItCannotUndo) {
  // An overwrite chunk (its old values are not in it).
  DeltaHistory history(dir_.Path("history"), 4);
  std::string log;
  {
    HistoryRecording record(history, RefitId());
    Bytes out;
    ASSERT_TRUE(*encoder_->EncodeDiff(ChunkKind::kOverwrite, {0, 0}, 2,
                                      SpanOf(*base_, {0, 0}),
                                      SpanOf(*target_, {0, 0}), &out));
    record.Append(out);
    ASSERT_TRUE(record.Sync());
    record.Pin();
    log = record.undo_path();
  }
  auto r = RestoreBase(log, *target_, baseline_.get(), kSpan, &pool_);
  EXPECT_TRUE(r.status().IsInvalidArgument()) << r.status().ToString();
  // A finished delta of another span length.
  {
    auto w = *DeltaWriter::Create(dir_.Path("other.dcr"));
    DeltaHeader h;
    h.base = Version{0, base_digest_};
    h.target = Version{1, Digest128{1, 2}};
    h.manifest = target_->manifest().digest();
    h.span_elems = kSpan * 2;
    h.tensor_count = kElems.size();
    h.total_elements = target_->manifest().TotalElements();
    h.total_bytes = target_->manifest().TotalBytes();
    ASSERT_TRUE(w->Finish(h).ok());
  }
  r = RestoreBase(dir_.Path("other.dcr"), *target_, baseline_.get(), kSpan,
                  &pool_);
  EXPECT_TRUE(r.status().IsInvalidArgument()) << r.status().ToString();
  EXPECT_FALSE(RestoreBase(dir_.Path("missing.dcr"), *target_, baseline_.get(),
                           kSpan, &pool_)
                   .ok());
  EXPECT_TRUE(BaselineIs(*base_));
}

TEST_F(BaselineStreamTest, FileStampsTellARewriteAndARename) {
  FileStamps stamps(*target_);
  EXPECT_EQ(stamps.Changed(), "");
  ASSERT_TRUE(Write(dir_.Path("target.safetensors"), base_bits_).ok());
  EXPECT_EQ(stamps.Changed(), dir_.Path("target.safetensors"));
}

}  // namespace
}  // namespace dcr
