// The root's encoder pipeline without a tree: the bounded queue blocks at
// its capacity, chunks come out in item order whatever order the workers
// finish in, the first failure (prepare, encode or emit) stops the
// producer once, with nothing queued after it, and a held producer emits
// nothing before its release.
#include "coord/chunk_producer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <vector>

namespace dcr {
namespace {

using namespace std::chrono_literals;

Outgoing TestOutgoing(size_t bytes, uint8_t tag = 0) {
  auto b = std::make_shared<std::vector<std::byte>>(bytes, std::byte{tag});
  return Outgoing{b, bytes};
}

// A job of `n` items; item i encodes to one byte i (or nothing when
// `skip(i)`), after a pseudo-random delay so that workers finish out of
// order.
ChunkJob CountingJob(size_t n, std::function<bool(size_t)> skip = nullptr) {
  ChunkJob job;
  job.items = n;
  job.encode = [skip](size_t i, size_t, EncodedChunk* out) {
    std::this_thread::sleep_for(std::chrono::microseconds((i * 7919) % 300));
    if (!skip || !skip(i)) out->bytes.push_back(std::byte(i & 0xff));
    out->sizes.changed = 1;
    return Status::OK();
  };
  job.emit = [](size_t i, const EncodedChunk& c) -> Result<Outgoing> {
    EXPECT_EQ(c.bytes.size(), 1u);
    return TestOutgoing(16, static_cast<uint8_t>(i));
  };
  return job;
}

// Waits (at most 5 s) until `ready()`; false if it never was.
bool WaitFor(const std::function<bool()>& ready) {
  for (int i = 0; i < 5000; ++i) {
    if (ready()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return ready();
}

// Pops everything until the producer is done; the tags in order.
std::vector<uint8_t> Drain(ChunkProducer& p) {
  std::vector<uint8_t> tags;
  for (;;) {
    bool done = p.done();
    while (auto o = p.Pop()) tags.push_back(uint8_t((*o->frame)[0]));
    if (done) break;
    std::this_thread::sleep_for(100us);
  }
  return tags;
}

TEST(ChunkQueueTest, PushBlocksAtCapacityUntilPopped) {
  ChunkQueue q(/*capacity=*/20);
  std::atomic<int> pushed{0};
  std::thread t([&] {
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(q.Push(TestOutgoing(10)));
      ++pushed;
    }
  });
  // Two frames fill it (10, then 20 >= capacity); the third waits.
  ASSERT_TRUE(WaitFor([&] { return q.blocked() == 1; }));
  EXPECT_EQ(pushed, 2) << "Push went past the capacity";
  EXPECT_EQ(q.bytes(), 20u);
  ASSERT_TRUE(q.Pop().has_value());
  t.join();
  EXPECT_EQ(pushed, 3);
  EXPECT_EQ(q.bytes(), 20u);
}

// A chunk in two encodings (a mixed tree) takes the room of both frames.
TEST(ChunkQueueTest, BothFramesOfAChunkCountAgainstTheCapacity) {
  ChunkQueue q(/*capacity=*/30);
  Outgoing two = TestOutgoing(10);
  two.plain = std::make_shared<std::vector<std::byte>>(14);
  two.plain_payload = 14;
  ASSERT_TRUE(q.Push(two));
  EXPECT_EQ(q.bytes(), 24u);
  ASSERT_TRUE(q.Push(TestOutgoing(6)));
  EXPECT_EQ(q.bytes(), 30u);
  std::atomic<bool> pushed{false};
  std::thread t([&] { pushed = q.Push(TestOutgoing(1)); });
  ASSERT_TRUE(WaitFor([&] { return q.blocked() == 1; }));
  auto o = q.Pop();
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->plain->size(), 14u);
  t.join();
  EXPECT_TRUE(pushed);
  EXPECT_EQ(q.bytes(), 7u);
}

TEST(ChunkQueueTest, CancelWakesABlockedPushAndRefusesMore) {
  ChunkQueue q(10);
  ASSERT_TRUE(q.Push(TestOutgoing(10)));
  std::atomic<bool> result{true};
  std::thread t([&] { result = q.Push(TestOutgoing(10)); });
  ASSERT_TRUE(WaitFor([&] { return q.blocked() == 1; }));
  q.Cancel();
  t.join();
  EXPECT_FALSE(result);
  EXPECT_FALSE(q.Push(TestOutgoing(1)));
  // What was queued before stays.
  EXPECT_TRUE(q.Pop().has_value());
  EXPECT_FALSE(q.Pop().has_value());
}

TEST(ChunkProducerTest, QueuesInItemOrderAndSkipsEmptyChunks) {
  ThreadPool pool(4);
  std::atomic<int> wakes{0};
  ChunkProducer p(&pool, 1 << 20, [&] { ++wakes; });
  p.Start(CountingJob(100, [](size_t i) { return i % 10 == 3; }));
  std::vector<uint8_t> tags = Drain(p);
  EXPECT_TRUE(p.Join().ok());
  std::vector<uint8_t> want;
  for (size_t i = 0; i < 100; ++i) {
    if (i % 10 != 3) want.push_back(uint8_t(i));
  }
  EXPECT_EQ(tags, want);
  // Once per chunk queued and once when it stopped.
  EXPECT_EQ(wakes, 91);
}

// Each slot is reused batch after batch; what an item left in it must not
// reach the next item's emit (a history chunk once carried the one before
// it when the next was not context-coded).
TEST(ChunkProducerTest, EachItemStartsFromAnEmptyChunk) {
  ThreadPool pool(2);
  ChunkProducer p(&pool, 1 << 20, [] {});
  ChunkJob job;
  job.items = 200;
  job.encode = [](size_t i, size_t, EncodedChunk* out) {
    EXPECT_TRUE(out->bytes.empty());
    EXPECT_TRUE(out->base_independent.empty()) << i;
    EXPECT_EQ(out->sizes.changed, 0u);
    EXPECT_EQ(out->sha256, Sha256Digest{});
    out->bytes.push_back(std::byte(i & 0xff));
    if (i % 3 == 0) out->base_independent.push_back(std::byte{1});
    out->sizes.changed = 1;
    out->sha256[0] = std::byte{7};
    return Status::OK();
  };
  job.emit = [](size_t i, const EncodedChunk& c) -> Result<Outgoing> {
    EXPECT_EQ(c.base_independent.size(), i % 3 == 0 ? 1u : 0u) << i;
    return TestOutgoing(16, static_cast<uint8_t>(i));
  };
  p.Start(std::move(job));
  EXPECT_EQ(Drain(p).size(), 200u);
  EXPECT_TRUE(p.Join().ok());
}

// after_batch runs once per batch, after that batch's chunks were emitted,
// with `last` only on the final one; its error stops the producer.
TEST(ChunkProducerTest, AfterBatchFollowsEachBatchsEmits) {
  ThreadPool pool(2);  // a first batch of 2, then batches of 8
  for (bool fail : {false, true}) {
    ChunkProducer p(&pool, 1 << 20, [] {});
    ChunkJob job = CountingJob(20);
    std::vector<std::pair<size_t, bool>> calls;  // (emitted so far, last)
    size_t emitted = 0;
    auto emit = job.emit;
    job.emit = [&, emit](size_t i, const EncodedChunk& c) {
      ++emitted;
      return emit(i, c);
    };
    job.after_batch = [&](bool last) {
      calls.emplace_back(emitted, last);
      return fail && calls.size() == 2 ? Status::IOError("disk gone")
                                       : Status::OK();
    };
    p.Start(std::move(job));
    std::vector<uint8_t> tags = Drain(p);
    Status s = p.Join();
    if (!fail) {
      EXPECT_TRUE(s.ok());
      EXPECT_EQ(tags.size(), 20u);
      EXPECT_EQ(calls, (std::vector<std::pair<size_t, bool>>{
                           {2, false}, {10, false}, {18, false}, {20, true}}));
    } else {
      EXPECT_EQ(s.code(), StatusCode::kIOError) << s.ToString();
      EXPECT_EQ(tags.size(), 10u);
      EXPECT_EQ(calls.size(), 2u);
    }
  }
}

// The stream's first chunk is queued once one item per worker is encoded,
// not a whole batch: here items from 2 on block until the first is popped.
TEST(ChunkProducerTest, TheFirstChunkIsQueuedBeforeAWholeBatchIsEncoded) {
  ThreadPool pool(2);
  ChunkProducer p(&pool, 1 << 20, nullptr);
  ChunkJob job = CountingJob(20);
  std::atomic<bool> popped{false};
  auto encode = job.encode;
  job.encode = [&, encode](size_t i, size_t w, EncodedChunk* out) {
    if (i >= 2) WaitFor([&] { return popped.load(); });
    return encode(i, w, out);
  };
  p.Start(std::move(job));
  std::optional<Outgoing> first;
  EXPECT_TRUE(WaitFor([&] { return (first = p.Pop()).has_value(); }));
  popped = true;
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(uint8_t((*first->frame)[0]), 0);
  EXPECT_EQ(Drain(p).size(), 19u);
  EXPECT_TRUE(p.Join().ok());
}

TEST(ChunkProducerTest, RunsAtMostOneWindowAhead) {
  ThreadPool pool(2);
  ChunkProducer p(&pool, /*capacity=*/64, nullptr);
  ChunkJob job = CountingJob(50);
  std::atomic<int> emitted{0};
  auto emit = job.emit;
  job.emit = [&, emit](size_t i, const EncodedChunk& c) {
    ++emitted;
    return emit(i, c);
  };
  p.Start(std::move(job));
  // 16-byte frames: four fill the window, the fifth waits to be queued;
  // nobody pops, so nothing more is framed.
  ASSERT_TRUE(WaitFor([&] { return p.blocked(); }));
  EXPECT_EQ(emitted, 5);
  EXPECT_FALSE(p.done());
  std::vector<uint8_t> all = Drain(p);
  EXPECT_TRUE(p.Join().ok());
  EXPECT_EQ(all.size(), 50u);
}

TEST(ChunkProducerTest, AnEncodeFailureStopsEverythingOnce) {
  ThreadPool pool(4);
  std::atomic<int> wakes{0};
  std::atomic<int> emitted_after{0};
  ChunkProducer p(&pool, 1 << 20, [&] { ++wakes; });
  ChunkJob job = CountingJob(200);
  auto encode = job.encode;
  job.encode = [encode](size_t i, size_t w, EncodedChunk* out) {
    if (i == 37) return Status::Corruption("span 37 does not decode");
    return encode(i, w, out);
  };
  auto emit = job.emit;
  job.emit = [&, emit](size_t i, const EncodedChunk& c) {
    if (i > 37) ++emitted_after;
    return emit(i, c);
  };
  p.Start(std::move(job));
  std::vector<uint8_t> tags = Drain(p);
  Status s = p.Join();
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.message().find("span 37"), std::string::npos);
  EXPECT_EQ(tags.size(), 37u);  // items 0..36, none after the failure
  EXPECT_EQ(emitted_after, 0);
  EXPECT_EQ(wakes, 38);
}

TEST(ChunkProducerTest, PrepareAndEmitFailuresTakeTheSameExit) {
  ThreadPool pool(2);
  {
    ChunkProducer p(&pool, 1 << 20, nullptr);
    ChunkJob job = CountingJob(10);
    std::atomic<int> encoded{0};
    job.prepare = [] { return Status::IOError("no encoder"); };
    auto encode = job.encode;
    job.encode = [&, encode](size_t i, size_t w, EncodedChunk* out) {
      ++encoded;
      return encode(i, w, out);
    };
    p.Start(std::move(job));
    EXPECT_TRUE(Drain(p).empty());
    EXPECT_EQ(p.Join().code(), StatusCode::kIOError);
    EXPECT_EQ(encoded, 0);
  }
  {
    ChunkProducer p(&pool, 1 << 20, nullptr);
    ChunkJob job = CountingJob(10);
    auto emit = job.emit;
    job.emit = [emit](size_t i, const EncodedChunk& c) -> Result<Outgoing> {
      if (i == 5) return Status::ResourceExhausted("frame too large");
      return emit(i, c);
    };
    p.Start(std::move(job));
    EXPECT_EQ(Drain(p).size(), 5u);
    EXPECT_EQ(p.Join().code(), StatusCode::kResourceExhausted);
  }
}

TEST(ChunkProducerTest, CancelStopsABlockedProducerWithoutAnError) {
  ThreadPool pool(2);
  ChunkProducer p(&pool, /*capacity=*/16, nullptr);
  p.Start(CountingJob(1000));
  ASSERT_TRUE(WaitFor([&] { return p.blocked(); }));
  p.Cancel();
  EXPECT_TRUE(p.Join().ok());
  EXPECT_TRUE(p.done());
  size_t left = 0;
  while (p.Pop()) ++left;
  EXPECT_LE(left, 1u);
}

// Held (the refit's stream started before the PLAN's replies): the first
// batch is encoded, nothing is emitted or encoded beyond it until Release,
// then everything comes out in order.
TEST(ChunkProducerTest, AHeldProducerEncodesItsFirstBatchThenWaitsForRelease) {
  ThreadPool pool(2);
  ChunkProducer p(&pool, 1 << 20, nullptr);
  ChunkJob job = CountingJob(20);
  std::atomic<bool> released{false};
  std::atomic<int> encoded{0};
  auto encode = job.encode;
  job.encode = [&, encode](size_t i, size_t w, EncodedChunk* out) {
    EXPECT_TRUE(i < 2 || released) << "item " << i << " encoded while held";
    ++encoded;
    return encode(i, w, out);
  };
  auto emit = job.emit;
  job.emit = [&, emit](size_t i, const EncodedChunk& c) {
    EXPECT_TRUE(released) << "item " << i << " emitted while held";
    return emit(i, c);
  };
  p.Hold();
  p.Start(std::move(job));
  // The first batch: one item per worker.
  ASSERT_TRUE(WaitFor([&] { return encoded == 2; }));
  EXPECT_FALSE(p.Pop().has_value());
  EXPECT_FALSE(p.done());
  released = true;
  p.Release();
  std::vector<uint8_t> tags = Drain(p);
  EXPECT_TRUE(p.Join().ok());
  ASSERT_EQ(tags.size(), 20u);
  for (size_t i = 0; i < tags.size(); ++i) EXPECT_EQ(tags[i], i);
}

// A refit whose PLAN the tree did not take drops its held stream: nothing
// is emitted, and the producer ends (cancelled, or destroyed) at once.
TEST(ChunkProducerTest, AHeldProducerCancelledOrDestroyedEmitsNothing) {
  ThreadPool pool(2);
  std::atomic<int> emitted{0};
  std::atomic<int> encoded{0};
  auto held_job = [&] {
    ChunkJob job = CountingJob(20);
    auto encode = job.encode;
    job.encode = [&, encode](size_t i, size_t w, EncodedChunk* out) {
      ++encoded;
      return encode(i, w, out);
    };
    auto emit = job.emit;
    job.emit = [&, emit](size_t i, const EncodedChunk& c) {
      ++emitted;
      return emit(i, c);
    };
    return job;
  };
  {
    ChunkProducer p(&pool, 1 << 20, nullptr);
    p.Hold();
    p.Start(held_job());
    ASSERT_TRUE(WaitFor([&] { return encoded == 2; }));
    p.Cancel();
    Status s = p.Join();
    EXPECT_EQ(s.code(), StatusCode::kAborted) << s.ToString();
    EXPECT_TRUE(p.done());
    EXPECT_FALSE(p.Pop().has_value());
  }
  {
    ChunkProducer p(&pool, 1 << 20, nullptr);
    p.Hold();
    p.Start(held_job());
    ASSERT_TRUE(WaitFor([&] { return encoded == 4; }));
  }  // the destructor cancels and joins
  EXPECT_EQ(emitted, 0);
  EXPECT_EQ(encoded, 4);
}

// A held producer that stopped before its release (nothing to encode, or
// a failed prepare) woke its consumer while nobody waited for the stream:
// the release wakes it again, or the stream would wait for a timer.
TEST(ChunkProducerTest, ReleasingAStoppedHeldProducerWakesTheConsumer) {
  ThreadPool pool(2);
  for (bool fail : {false, true}) {
    std::atomic<int> wakes{0};
    ChunkProducer p(&pool, 1 << 20, [&] { ++wakes; });
    ChunkJob job = CountingJob(fail ? 10 : 0);
    if (fail) job.prepare = [] { return Status::IOError("no encoder"); };
    p.Hold();
    p.Start(std::move(job));
    ASSERT_TRUE(WaitFor([&] { return p.done(); }));
    EXPECT_EQ(wakes, 1);
    p.Release();
    EXPECT_EQ(wakes, 2);
    EXPECT_EQ(p.Join().ok(), !fail);
  }
}

// Released, then cancelled while its first batch still encodes (every
// cluster head left): the stream had begun, and it ends as a cancelled
// stream does, without an error.
TEST(ChunkProducerTest, ACancelAfterTheReleaseIsNotAnError) {
  ThreadPool pool(2);
  ChunkProducer p(&pool, 1 << 20, nullptr);
  ChunkJob job = CountingJob(20);
  std::atomic<bool> go{false};
  auto encode = job.encode;
  job.encode = [&, encode](size_t i, size_t w, EncodedChunk* out) {
    WaitFor([&] { return go.load(); });
    return encode(i, w, out);
  };
  p.Hold();
  p.Start(std::move(job));
  p.Release();
  p.Cancel();
  go = true;
  Status s = p.Join();
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_FALSE(p.Pop().has_value());
}

TEST(ChunkProducerTest, AHeldJobWithMarksIsRefused) {
  ThreadPool pool(2);
  ChunkProducer p(&pool, 1 << 20, nullptr);
  ChunkJob job = CountingJob(4);
  job.fetch = [](size_t) -> Result<size_t> { return size_t{0}; };
  job.mark = []() -> Result<std::optional<Outgoing>> {
    return std::optional<Outgoing>(TestOutgoing(16));
  };
  p.Hold();
  p.Start(std::move(job));
  EXPECT_EQ(p.Join().code(), StatusCode::kInternal);
  EXPECT_FALSE(p.Pop().has_value());
}

}  // namespace
}  // namespace dcr
