// A store's background write-back (StoreSpec::write_back_delay): the
// record's unsynced mark, when it is cleared, and what an open after a
// crash or another boot does with it.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/failpoint.h"
#include "common/file.h"
#include "dcr/checkpoint.h"
#include "dcr/store.h"
#include "dcr/thread_pool.h"
#include "format/safetensors_header.h"
#include "testing/temp_dir.h"
#include "testing/test_util.h"
#include "unit/store/store_test_fixture.h"

namespace dcr {
namespace {

using store_testing::Fixture;
using store_testing::StoreTest;
using ::testing::HasSubstr;
using testing::ReadAllOrStatus;
using testing::TestRefitId;

// ------------------------------------------------- background write-back

// A boot id that is not this one.
constexpr const char* kOtherBoot = "00000000-1111-2222-3333-444444444444";

class DataSyncTest : public StoreTest {
 protected:
  void TearDown() override {
    DisarmFailpoints();
    StoreTest::TearDown();
  }
  // A file store of Fixture(1) committed at its own digest (step 1), the
  // write-back finished.
  StoreSpec Committed(const Fixture& f, Version* v) {
    const StoreSpec spec = WriteFixture(f, "p.safetensors");
    auto store = OpenStore(spec);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    *v = Version{1, (*store)->Digests().version};
    EXPECT_TRUE((*store)->Commit(*v, TestRefitId(1)).ok());
    EXPECT_TRUE((*store)->WaitDataSync().ok());
    return spec;
  }
  // Rewrites the record at `path` with an "unsynced" mark of `boot` (and
  // the version on disk when it was put, if known).
  static void Mark(const std::string& path, const std::string& boot,
                   std::optional<Version> synced = std::nullopt) {
    auto rec = ReadVersionRecord(path);
    ASSERT_TRUE(rec.ok() && rec->has_value());
    VersionRecord r = **rec;
    r.unsynced = DataUnsynced{boot, "2026-01-01T00:00:00Z", synced};
    ASSERT_TRUE(WriteVersionRecord(path, r).ok());
  }
  // Flips one bit of the "ids" tensor in the store file, behind dcr's back.
  static void FlipAByte(const std::string& path) {
    auto cp = Checkpoint::Open(path, Checkpoint::Mode::kReadWrite);
    ASSERT_TRUE(cp.ok());
    const int64_t ids = (*cp)->manifest().Find("ids");
    ASSERT_GE(ids, 0);
    (*cp)->MutableTensorData(ids)[3] ^= std::byte{0x10};
    ASSERT_TRUE((*cp)->Flush().ok());
  }
  // The record at `path` once the write-back dropped its mark, or as it is
  // after `limit` if it did not (polled; the write-back runs on its own
  // thread and tells no one).
  static std::optional<VersionRecord> Unmarked(
      const std::string& path, std::chrono::milliseconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    std::optional<VersionRecord> rec = OnDisk(path);
    while (rec && rec->unsynced && std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      rec = OnDisk(path);
    }
    return rec;
  }
  static std::optional<VersionRecord> OnDisk(const std::string& path) {
    auto rec = ReadVersionRecord(path);
    EXPECT_TRUE(rec.ok()) << rec.status().ToString();
    return rec.ok() ? *rec : std::nullopt;
  }
};

TEST_F(DataSyncTest, ACommitIsMarkedUntilTheWriteBackClearsIt) {
  auto boot = CurrentBootId();
  ASSERT_TRUE(boot.ok()) << boot.status().ToString();
  Fixture f;
  const StoreSpec spec = WriteFixture(f, "p.safetensors");
  auto store = OpenStore(spec);
  ASSERT_TRUE(store.ok());
  WeightStore& s = **store;
  // Hold the write-back, so the marked record can be seen.
  ASSERT_TRUE(ArmFailpoints("store.data_sync=delay(300)").ok());
  const Version v{1, s.Digests().version};
  ASSERT_TRUE(s.Commit(v, TestRefitId(1)).ok());
  auto marked = OnDisk(s.record_path());
  ASSERT_TRUE(marked && marked->unsynced);
  EXPECT_EQ(marked->unsynced->boot_id, *boot);
  EXPECT_EQ(marked->committed->version, v);
  // Nothing was committed before: no version is known to be on disk.
  EXPECT_FALSE(marked->unsynced->synced);
  ASSERT_TRUE(s.WaitDataSync().ok());
  // The next commit's mark names the version on disk before it.
  const Version v2{2, Digest128{2, 2}};
  ASSERT_TRUE(s.BeginRefit(TestRefitId(2), v, v2).ok());
  ASSERT_TRUE(s.Commit(v2, TestRefitId(2)).ok());
  marked = OnDisk(s.record_path());
  ASSERT_TRUE(marked && marked->unsynced);
  EXPECT_EQ(marked->unsynced->synced, v);
  // A third commit before the write-back keeps the first mark.
  const Version v3{3, Digest128{3, 3}};
  ASSERT_TRUE(s.BeginRefit(TestRefitId(3), v2, v3).ok());
  ASSERT_TRUE(s.Commit(v3, TestRefitId(3)).ok());
  marked = OnDisk(s.record_path());
  if (marked && marked->unsynced) {
    EXPECT_EQ(marked->unsynced->synced, v);
  }
  const Version& last = v3;
  EXPECT_THAT(ReadAllOrStatus(s.record_path()), HasSubstr("{\"format\":4,"));
  ASSERT_TRUE(s.WaitDataSync().ok());
  auto cleared = OnDisk(s.record_path());
  ASSERT_TRUE(cleared);
  EXPECT_FALSE(cleared->unsynced);
  EXPECT_EQ(cleared->committed->version, last);
  EXPECT_FALSE(s.record().unsynced);
  EXPECT_THAT(ReadAllOrStatus(s.record_path()), HasSubstr("{\"format\":3,"));
}

// StoreSpec::write_back_delay: the write-back starts that long after the
// first commit it serves, so a commit within the wait shares it.
TEST_F(DataSyncTest, TheWriteBackWaitsOutItsDelayForEveryCommitInIt) {
  using Clock = std::chrono::steady_clock;
  Fixture f;
  StoreSpec spec = WriteFixture(f, "p.safetensors");
  spec.write_back_delay = std::chrono::milliseconds(600);
  auto store = OpenStore(spec);
  ASSERT_TRUE(store.ok());
  WeightStore& s = **store;
  const Version v1{1, s.Digests().version};
  const Clock::time_point t0 = Clock::now();
  ASSERT_TRUE(s.Commit(v1, TestRefitId(1)).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto rec = OnDisk(s.record_path());
  ASSERT_TRUE(rec);
  if (Clock::now() - t0 < std::chrono::milliseconds(500)) {
    EXPECT_TRUE(rec->unsynced);
  }
  const Version v2{2, Digest128{2, 2}};
  ASSERT_TRUE(s.BeginRefit(TestRefitId(2), v1, v2).ok());
  ASSERT_TRUE(s.Commit(v2, TestRefitId(2)).ok());
  const bool within = Clock::now() - t0 < std::chrono::milliseconds(500);
  // The first record seen without the mark names v2: one write-back
  // served both commits (when the second came within the delay).
  rec = Unmarked(s.record_path(), std::chrono::seconds(5));
  ASSERT_TRUE(rec);
  const auto cleared_after = Clock::now() - t0;
  ASSERT_FALSE(rec->unsynced) << "still marked after 5 s";
  EXPECT_GE(cleared_after, std::chrono::milliseconds(600));
  if (within) {
    EXPECT_EQ(rec->committed->version, v2);
  }
}

// Who waits for the data, or closes the store, does not wait the delay out.
TEST_F(DataSyncTest, WaitingOrClosingWritesBackAtOnce) {
  using Clock = std::chrono::steady_clock;
  Fixture f;
  StoreSpec spec = WriteFixture(f, "p.safetensors");
  spec.write_back_delay = std::chrono::seconds(60);
  auto store = OpenStore(spec);
  ASSERT_TRUE(store.ok());
  const Version v1{1, (*store)->Digests().version};
  ASSERT_TRUE((*store)->Commit(v1, TestRefitId(1)).ok());
  Clock::time_point t0 = Clock::now();
  ASSERT_TRUE((*store)->WaitDataSync().ok());
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(30));
  auto rec = OnDisk((*store)->record_path());
  ASSERT_TRUE(rec);
  EXPECT_FALSE(rec->unsynced);
  const Version v2{2, Digest128{2, 2}};
  ASSERT_TRUE((*store)->BeginRefit(TestRefitId(2), v1, v2).ok());
  ASSERT_TRUE((*store)->Commit(v2, TestRefitId(2)).ok());
  const std::string record_path = (*store)->record_path();
  t0 = Clock::now();
  store->reset();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(30));
  rec = OnDisk(record_path);
  ASSERT_TRUE(rec);
  EXPECT_FALSE(rec->unsynced);
  EXPECT_EQ(rec->committed->version, v2);
}

// A record someone else wrote, or removed, while a write-back waited out
// its delay (a file and record put back under a process that keeps the
// store open) is left as it is: the write-back does not put its own back.
TEST_F(DataSyncTest, AWriteBackLeavesARecordItDidNotWrite) {
  Fixture f;
  StoreSpec spec = WriteFixture(f, "p.safetensors");
  spec.write_back_delay = std::chrono::seconds(60);
  auto store = OpenStore(spec);
  ASSERT_TRUE(store.ok());
  const Version v1{1, (*store)->Digests().version};
  ASSERT_TRUE((*store)->Commit(v1, TestRefitId(1)).ok());
  const std::string path = (*store)->record_path();
  auto mine = OnDisk(path);
  ASSERT_TRUE(mine && mine->unsynced);
  VersionRecord theirs = *mine;
  theirs.unsynced.reset();
  theirs.committed->version = Version{7, Digest128{7, 7}};
  ASSERT_TRUE(WriteVersionRecord(path, theirs).ok());
  ASSERT_TRUE((*store)->WaitDataSync().ok());
  auto rec = OnDisk(path);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->committed->version, theirs.committed->version);
  // Removed: still not put back.
  ASSERT_TRUE((*store)->BeginRefit(TestRefitId(2), v1, v1).ok());
  ASSERT_TRUE((*store)->Commit(v1, TestRefitId(2)).ok());
  std::filesystem::remove(path);
  ASSERT_TRUE((*store)->WaitDataSync().ok());
  EXPECT_FALSE(std::filesystem::exists(path));
}

// A write-back during which a record was written (the next refit began)
// cannot drop the mark; the next one then starts at its commit, without
// the delay, or refits closer together than the delay would keep the
// mark for ever.
TEST_F(DataSyncTest, AWriteBackThatKeptTheMarkMakesTheNextOneDueAtOnce) {
  using Clock = std::chrono::steady_clock;
  Fixture f;
  StoreSpec spec = WriteFixture(f, "p.safetensors");
  spec.write_back_delay = std::chrono::seconds(60);
  auto store = OpenStore(spec);
  ASSERT_TRUE(store.ok());
  WeightStore& s = **store;
  const Version v1{1, s.Digests().version};
  const Version v2{2, Digest128{2, 2}};
  ASSERT_TRUE(ArmFailpoints("store.data_sync=delay(500)@1").ok());
  ASSERT_TRUE(s.Commit(v1, TestRefitId(1)).ok());
  // A waiter starts the write-back; the failpoint holds it while the next
  // refit begins.
  std::thread waiter([&] { EXPECT_TRUE(s.WaitDataSync().ok()); });
  const FailpointId point = FailpointIdOf("store.data_sync");
  for (int i = 0; i < 500 && TEST_FailpointHits(point) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(TEST_FailpointHits(point), 1u);
  ASSERT_TRUE(s.BeginRefit(TestRefitId(2), v1, v2).ok());
  waiter.join();
  auto rec = OnDisk(s.record_path());
  ASSERT_TRUE(rec && rec->unsynced && rec->in_progress);
  const Clock::time_point t0 = Clock::now();
  ASSERT_TRUE(s.Commit(v2, TestRefitId(2)).ok());
  rec = Unmarked(s.record_path(), std::chrono::seconds(10));
  ASSERT_TRUE(rec);
  EXPECT_FALSE(rec->unsynced) << "still marked, the delay waited out";
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(30));
  EXPECT_EQ(rec->committed->version, v2);
}

TEST_F(DataSyncTest, SyncingAtCommitNeverMarks) {
  Fixture f;
  StoreSpec spec = WriteFixture(f, "p.safetensors");
  spec.data_sync = StoreSpec::DataSync::kAtCommit;
  auto store = OpenStore(spec);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE(ArmFailpoints("store.data_sync=drop").ok());  // never reached
  const Version v{1, (*store)->Digests().version};
  ASSERT_TRUE((*store)->Commit(v, TestRefitId(1)).ok());
  auto rec = OnDisk((*store)->record_path());
  ASSERT_TRUE(rec);
  EXPECT_FALSE(rec->unsynced);
  EXPECT_EQ(rec->committed->version, v);
  EXPECT_TRUE((*store)->WaitDataSync().ok());
}

TEST_F(DataSyncTest, ARecordWrittenDuringTheWriteBackKeepsTheMark) {
  Fixture f;
  Version v1;
  const StoreSpec spec = Committed(f, &v1);
  auto store = OpenStore(spec);
  ASSERT_TRUE(store.ok());
  WeightStore& s = **store;
  const Version v2{2, Digest128{2, 2}};
  ASSERT_TRUE(ArmFailpoints("store.data_sync=delay(300)").ok());
  ASSERT_TRUE(s.BeginRefit(TestRefitId(2), v1, v2).ok());
  ASSERT_TRUE(s.EndRefit().ok());  // base restored: marked, write-back held
  // The next refit starts while the write-back runs: what that write-back
  // covered is not known, so the mark must stay.
  ASSERT_TRUE(s.BeginRefit(TestRefitId(3), v1, v2).ok());
  ASSERT_TRUE(s.WaitDataSync().ok());
  auto rec = OnDisk(s.record_path());
  ASSERT_TRUE(rec && rec->unsynced && rec->in_progress);
  EXPECT_EQ(rec->in_progress->refit, TestRefitId(3));
  // Its commit queues another write-back, which clears it.
  ASSERT_TRUE(s.Commit(v2, TestRefitId(3)).ok());
  ASSERT_TRUE(s.WaitDataSync().ok());
  rec = OnDisk(s.record_path());
  ASSERT_TRUE(rec);
  EXPECT_FALSE(rec->unsynced);
  EXPECT_FALSE(rec->in_progress);
  EXPECT_EQ(rec->committed->version, v2);
}

TEST_F(DataSyncTest, AFailedWriteBackIsReportedAndKeepsTheMark) {
  Fixture f;
  Version v1;
  const StoreSpec spec = Committed(f, &v1);
  auto store = OpenStore(spec);
  ASSERT_TRUE(store.ok());
  WeightStore& s = **store;
  ASSERT_TRUE(ArmFailpoints("store.data_sync=drop").ok());
  const Version v2{2, Digest128{2, 2}};
  ASSERT_TRUE(s.BeginRefit(TestRefitId(2), v1, v2).ok());
  ASSERT_TRUE(s.Commit(v2, TestRefitId(2)).ok());
  Status st = s.WaitDataSync();
  EXPECT_EQ(st.code(), StatusCode::kIOError) << st.ToString();
  EXPECT_THAT(st.ToString(), HasSubstr("store.data_sync"));
  EXPECT_TRUE(s.WaitDataSync().ok());  // reported once
  auto rec = OnDisk(s.record_path());
  ASSERT_TRUE(rec && rec->unsynced);
  EXPECT_EQ(rec->committed->version, v2);
  // A later write-back that succeeds does not prove the failed pages
  // reached the disk (the kernel reports such an error once): the mark
  // stays for the rest of the process.
  DisarmFailpoints();
  const Version v3{3, Digest128{3, 3}};
  ASSERT_TRUE(s.BeginRefit(TestRefitId(3), v2, v3).ok());
  ASSERT_TRUE(s.Commit(v3, TestRefitId(3)).ok());
  EXPECT_TRUE(s.WaitDataSync().ok());
  rec = OnDisk(s.record_path());
  ASSERT_TRUE(rec && rec->unsynced);
  EXPECT_EQ(rec->committed->version, v3);
}

TEST_F(DataSyncTest, DestroyingAStoreFinishesItsWriteBack) {
  Fixture f;
  Version v1;
  const StoreSpec spec = Committed(f, &v1);
  std::string record_path;
  {
    auto store = OpenStore(spec);
    ASSERT_TRUE(store.ok());
    WeightStore& s = **store;
    record_path = s.record_path();
    // The first write-back is held; the second commit's request queues
    // behind it and is still pending when the store is destroyed.
    ASSERT_TRUE(ArmFailpoints("store.data_sync=delay(300)@1").ok());
    const Version v2{2, Digest128{2, 2}};
    ASSERT_TRUE(s.BeginRefit(TestRefitId(2), v1, v2).ok());
    ASSERT_TRUE(s.Commit(v2, TestRefitId(2)).ok());
    const Version v3{3, Digest128{3, 3}};
    ASSERT_TRUE(s.BeginRefit(TestRefitId(3), v2, v3).ok());
    ASSERT_TRUE(s.Commit(v3, TestRefitId(3)).ok());
  }
  // The held write-back saw a newer record and kept the mark; the queued
  // one, served on the way out, dropped it.
  auto rec = OnDisk(record_path);
  ASSERT_TRUE(rec && rec->committed);
  EXPECT_EQ(rec->committed->version.step, 3u);
  EXPECT_FALSE(rec->unsynced);
}

TEST_F(DataSyncTest, ADetachedStoreLeavesItsMarkToTheNextOpen) {
  Fixture f;
  Version v1;
  const StoreSpec spec = Committed(f, &v1);
  const Version v2{2, Digest128{2, 2}};
  {
    auto store = OpenStore(spec);
    ASSERT_TRUE(store.ok());
    (*store)->DetachDataSync();
    ASSERT_TRUE(ArmFailpoints("store.data_sync=delay(300)").ok());
    ASSERT_TRUE((*store)->BeginRefit(TestRefitId(2), v1, v2).ok());
    ASSERT_TRUE((*store)->Commit(v2, TestRefitId(2)).ok());
    ASSERT_TRUE((*store)->BeginRefit(TestRefitId(3), v2, v2).ok());
    ASSERT_TRUE((*store)->EndRefit().ok());  // a second request, queued
    // Destroying it waits for a write-back in flight (if the thread took
    // the first request already), not for the queued one.
  }
  DisarmFailpoints();
  auto rec = OnDisk(spec.path + ".dcr-version");
  ASSERT_TRUE(rec && rec->unsynced);
  EXPECT_EQ(rec->committed->version, v2);
  auto store = OpenStore(spec);  // this boot: written back, mark dropped
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ((*store)->committed(), v2);
  EXPECT_FALSE((*store)->record().unsynced);
  rec = OnDisk(spec.path + ".dcr-version");
  ASSERT_TRUE(rec);
  EXPECT_FALSE(rec->unsynced);
}

TEST_F(DataSyncTest, AMarkOfThisBootIsWrittenBackAtOpen) {
  auto boot = CurrentBootId();
  ASSERT_TRUE(boot.ok());
  Fixture f;
  Version v1;
  const StoreSpec spec = Committed(f, &v1);
  ASSERT_NO_FATAL_FAILURE(Mark(spec.path + ".dcr-version", *boot));
  // Only the process stopped: the page cache holds what it wrote, so the
  // open writes it back and keeps the version without hashing. (A byte
  // changed behind dcr's back shows that no hash was taken.)
  ASSERT_NO_FATAL_FAILURE(FlipAByte(spec.path));
  auto store = OpenStore(spec);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ((*store)->committed(), v1);
  EXPECT_FALSE((*store)->record().unsynced);
  auto rec = OnDisk(spec.path + ".dcr-version");
  ASSERT_TRUE(rec);
  EXPECT_FALSE(rec->unsynced);
}

TEST_F(DataSyncTest, AMarkOfAnotherBootIsCheckedAgainstTheBits) {
  Fixture f;
  Version v1;
  const StoreSpec spec = Committed(f, &v1);
  const std::string record_path = spec.path + ".dcr-version";
  // The bits hold the committed version: it stays, unmarked.
  ASSERT_NO_FATAL_FAILURE(Mark(record_path, kOtherBoot));
  {
    auto store = OpenStore(spec);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    EXPECT_EQ((*store)->committed(), v1);
    EXPECT_FALSE((*store)->record().unsynced);
  }
  auto rec = OnDisk(record_path);
  ASSERT_TRUE(rec && rec->committed);
  EXPECT_FALSE(rec->unsynced);

  // The write-back was lost: one byte on disk is not the committed bits.
  // The store counts as never committed, so no delta binds to it.
  ASSERT_NO_FATAL_FAILURE(Mark(record_path, kOtherBoot));
  ASSERT_NO_FATAL_FAILURE(FlipAByte(spec.path));
  {
    auto store = OpenStore(spec);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    EXPECT_FALSE((*store)->committed().has_value());
    EXPECT_FALSE((*store)->record().unsynced);
  }
  rec = OnDisk(record_path);
  ASSERT_TRUE(rec);
  EXPECT_FALSE(rec->committed);
  EXPECT_FALSE(rec->unsynced);
}

TEST_F(DataSyncTest, ALostWriteBackWithAKnownSyncedVersionIsAMixToRepair) {
  Fixture f;
  Version v1;
  const StoreSpec spec = Committed(f, &v1);
  const std::string record_path = spec.path + ".dcr-version";
  // The record says step 1 (refit 1), the disk held step 0 when the
  // write-back began to lag, and a byte did not make it.
  const Version v0{0, Digest128{9, 9}};
  ASSERT_NO_FATAL_FAILURE(Mark(record_path, kOtherBoot, v0));
  ASSERT_NO_FATAL_FAILURE(FlipAByte(spec.path));
  {
    auto store = OpenStore(spec);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    // A mix of step 0 and step 1, as refit 1 left unfinished: the
    // coordinator repairs it with the change sets between them.
    EXPECT_FALSE((*store)->committed().has_value());
    auto busy = (*store)->InProgress();
    ASSERT_TRUE(busy.has_value());
    EXPECT_EQ(busy->refit, TestRefitId(1));
    EXPECT_EQ(busy->base, v0);
    EXPECT_EQ(busy->target, v1);
    EXPECT_FALSE((*store)->record().unsynced);
  }
  // A refit in progress too: its mix now reaches down to step 0.
  Version v2{2, Digest128{2, 2}};
  {
    auto store = OpenStore(spec);
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->Commit(v1, TestRefitId(1)).ok());
    ASSERT_TRUE((*store)->WaitDataSync().ok());
    ASSERT_TRUE((*store)->BeginRefit(TestRefitId(2), v1, v2).ok());
  }
  ASSERT_NO_FATAL_FAILURE(Mark(record_path, kOtherBoot, v0));
  auto store = OpenStore(spec);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto busy = (*store)->InProgress();
  ASSERT_TRUE(busy.has_value());
  EXPECT_EQ(busy->refit, TestRefitId(2));
  EXPECT_EQ(busy->base, v0);
  EXPECT_EQ(busy->target, v2);
}

TEST_F(DataSyncTest, AMarkOfAnotherBootBesideARefitInProgressKeepsTheRefit) {
  Fixture f;
  Version v1;
  const StoreSpec spec = Committed(f, &v1);
  const Version v2{2, Digest128{2, 2}};
  {
    auto store = OpenStore(spec);
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->BeginRefit(TestRefitId(2), v1, v2).ok());
  }
  ASSERT_NO_FATAL_FAILURE(Mark(spec.path + ".dcr-version", kOtherBoot));
  auto store = OpenStore(spec);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  // The record already says the bits are a mix: nothing to hash.
  ASSERT_TRUE((*store)->InProgress().has_value());
  EXPECT_EQ((*store)->InProgress()->refit, TestRefitId(2));
  EXPECT_EQ((*store)->committed(), v1);
  EXPECT_FALSE((*store)->record().unsynced);
}

}  // namespace
}  // namespace dcr
