// Retention of refits' objects (coord/object_retention.h) over a directory
// store: the last K committed kept, older and aborted ones removed, an
// unfinished refit kept, what no record names reported (and removed only
// when asked), dry runs, damaged records, a store that fails deletes.
#include "coord/object_retention.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "testing/temp_dir.h"
#include "testing/test_util.h"

namespace dcr {
namespace {

using testing::TestRefitId;

// A store whose LIST misses the newest objects (S3's LIST may lag behind
// recent writes), over a working one.
class LaggingListStore final : public ObjectStore {
 public:
  LaggingListStore(ObjectStore* base, size_t hide) : base_(base), hide_(hide) {}
  Status Put(std::string_view key, std::span<const std::byte> d) override {
    return base_->Put(key, d);
  }
  Result<std::vector<std::byte>> Get(std::string_view key) override {
    return base_->Get(key);
  }
  Status Delete(std::string_view key) override { return base_->Delete(key); }
  Result<std::vector<std::string>> List(std::string_view prefix) override {
    DCR_ASSIGN_OR_RETURN(std::vector<std::string> keys, base_->List(prefix));
    keys.resize(keys.size() > hide_ ? keys.size() - hide_ : 0);
    return keys;
  }
  std::string describe() const override { return "lagging"; }
  ObjectStoreStats stats() const override { return {}; }

 private:
  ObjectStore* base_;
  size_t hide_;
};

// A store that refuses every Delete (a bucket policy without
// s3:DeleteObject), over a working one.
class NoDeleteStore final : public ObjectStore {
 public:
  explicit NoDeleteStore(ObjectStore* base) : base_(base) {}
  Status Put(std::string_view key, std::span<const std::byte> d) override {
    return base_->Put(key, d);
  }
  Result<std::vector<std::byte>> Get(std::string_view key) override {
    return base_->Get(key);
  }
  Status Delete(std::string_view key) override {
    return Status::InvalidArgument("access denied deleting " +
                                   std::string(key));
  }
  Result<std::vector<std::string>> List(std::string_view prefix) override {
    return base_->List(prefix);
  }
  std::string describe() const override { return "no-delete"; }
  ObjectStoreStats stats() const override { return {}; }

 private:
  ObjectStore* base_;
};

class ObjectRetentionTest : public ::testing::Test {
 protected:
  ObjectRetentionTest() : state_(dir_.Path("state")) {
    EXPECT_TRUE(state_.Create().ok());
    auto s = OpenDirObjectStore(dir_.Path("bucket"));
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
  }

  // Uploads `n` objects of `refit` as a refit would.
  void Upload(const RefitId& refit, int n) {
    const std::vector<std::byte> data(100, std::byte{7});
    for (int i = 0; i < n; ++i) {
      ASSERT_TRUE(store_->Put(RefitObjectKey(refit.ToHex(), i), data).ok());
    }
  }
  size_t Objects(const RefitId& refit) {
    auto keys = store_->List(RefitObjectPrefix(refit.ToHex()));
    EXPECT_TRUE(keys.ok());
    return keys.ok() ? keys->size() : 0;
  }
  // A refit at `epoch` that uploaded `n` objects and committed (or not).
  void Refit(ObjectRetention* r, const RefitId& id, uint64_t epoch, int n,
             bool commit, bool whole_tree = true) {
    ASSERT_TRUE(r->Begin(id, epoch, epoch * 10, whole_tree).ok());
    Upload(id, n);
    if (commit) {
      ASSERT_TRUE(r->Committed(id).ok());
    }
  }
  bool HasRecord(const RefitId& id) {
    return std::filesystem::exists(state_.ObjectsDir() + "/" + id.ToHex() +
                                   ".json");
  }

  testing::TempDir dir_;
  StateDir state_;
  std::unique_ptr<ObjectStore> store_;
};

TEST_F(ObjectRetentionTest, KeepsTheLastKCommittedAndRemovesTheRest) {
  ObjectRetention r(state_, store_.get(), 2);
  Refit(&r, TestRefitId(1), 1, 3, true);
  Refit(&r, TestRefitId(2), 2, 4, false);  // aborted, and its removal failed
  Refit(&r, TestRefitId(3), 3, 2, true);
  Refit(&r, TestRefitId(4), 4, 5, true);
  auto report = r.Prune(TestRefitId(4));
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->objects_removed, 3u + 4u);
  EXPECT_EQ(report->failures, 0u);
  EXPECT_EQ(Objects(TestRefitId(1)), 0u);
  EXPECT_EQ(Objects(TestRefitId(2)), 0u);
  EXPECT_EQ(Objects(TestRefitId(3)), 2u);
  EXPECT_EQ(Objects(TestRefitId(4)), 5u);
  EXPECT_FALSE(HasRecord(TestRefitId(1)));
  EXPECT_FALSE(HasRecord(TestRefitId(2)));
  EXPECT_TRUE(HasRecord(TestRefitId(3)));
  ASSERT_EQ(report->refits.size(), 4u);
  EXPECT_EQ(report->refits[0].refit, TestRefitId(4).ToHex());  // newest first
  EXPECT_FALSE(report->refits[0].removed);
  EXPECT_EQ(report->refits[0].why,
            "one of the last 2 committed (root.keep_deltas)");
  EXPECT_TRUE(report->refits[2].removed);
  EXPECT_EQ(report->refits[2].state, "uploading");
  EXPECT_EQ(report->refits[3].target_step, 10u);

  // The next commit pushes TestRefitId(3) out.
  Refit(&r, TestRefitId(5), 5, 1, true);
  report = r.Prune(std::nullopt);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(Objects(TestRefitId(3)), 0u);
  EXPECT_EQ(Objects(TestRefitId(4)), 5u);
  EXPECT_EQ(Objects(TestRefitId(5)), 1u);
}

TEST_F(ObjectRetentionTest, KeepZeroKeepsOnlyWhatIsNotOver) {
  ObjectRetention r(state_, store_.get(), 0);
  Refit(&r, TestRefitId(1), 1, 3, true);
  Refit(&r, TestRefitId(2), 2, 2, false);  // still uploading
  auto report = r.Prune(TestRefitId(2));
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(Objects(TestRefitId(1)), 0u);
  EXPECT_FALSE(HasRecord(TestRefitId(1)));
  EXPECT_EQ(Objects(TestRefitId(2)), 2u);
  EXPECT_TRUE(HasRecord(TestRefitId(2)));
}

TEST_F(ObjectRetentionTest, RemoveTakesAnAbortedRefitsObjectsAndRecord) {
  ObjectRetention r(state_, store_.get(), 2);
  Refit(&r, TestRefitId(1), 1, 4, false);
  const std::string torn = dir_.Path("bucket/refits/" + TestRefitId(1).ToHex() +
                                     "/f/0000000004.dcr-tmp-1-1");
  std::ofstream(torn) << "cut short";
  ASSERT_TRUE(r.Remove(TestRefitId(1)).ok());
  EXPECT_FALSE(std::filesystem::exists(torn));
  EXPECT_FALSE(std::filesystem::exists(dir_.Path("bucket/refits")));
  EXPECT_EQ(Objects(TestRefitId(1)), 0u);
  EXPECT_FALSE(HasRecord(TestRefitId(1)));
  // Nothing left under refits/ (the directory backend removes emptied
  // folders), nor what a root that died mid-upload left.
  auto keys = store_->List("");
  ASSERT_TRUE(keys.ok());
  EXPECT_TRUE(keys->empty());
}

TEST_F(ObjectRetentionTest, RefitsOfNamedNodesAreNotKeptNorCounted) {
  ObjectRetention r(state_, store_.get(), 1);
  Refit(&r, TestRefitId(1), 1, 3, true);
  Refit(&r, TestRefitId(2), 2, 2, true, /*whole_tree=*/false);  // a catch-up
  auto report = r.Prune(std::nullopt);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(Objects(TestRefitId(1)), 3u);  // still the last whole-tree commit
  EXPECT_EQ(Objects(TestRefitId(2)), 0u);
  EXPECT_EQ(report->refits[0].why,
            "a refit of named nodes (catch-up, repair, seed)");
}

TEST_F(ObjectRetentionTest, RemoveTakesPushedObjectsALaggingListMisses) {
  LaggingListStore lagging(store_.get(), 2);
  ObjectRetention r(state_, &lagging, 2);
  Refit(&r, TestRefitId(1), 1, 5, false);
  ASSERT_TRUE(r.Remove(TestRefitId(1), /*pushed=*/5).ok());
  EXPECT_EQ(Objects(TestRefitId(1)), 0u);
}

TEST_F(ObjectRetentionTest, BeginKeepsTheRecordOfAResumedRefit) {
  ObjectRetention r(state_, store_.get(), 2);
  Refit(&r, TestRefitId(1), 1, 1, true);
  ASSERT_TRUE(r.Begin(TestRefitId(1), 7, 70, false).ok());
  auto records = r.Records();
  ASSERT_TRUE(records.ok());
  ASSERT_EQ(records->size(), 1u);
  EXPECT_TRUE((*records)[0].committed);
  EXPECT_TRUE((*records)[0].whole_tree);
  EXPECT_EQ((*records)[0].epoch, 1u);
}

TEST_F(ObjectRetentionTest, KeepsTheUnfinishedRefitCurrentJsonNames) {
  ObjectRetention r(state_, store_.get(), 0);
  Refit(&r, TestRefitId(1), 1, 2, false);  // its root stopped after deciding
  CurrentRefit c;
  c.refit = TestRefitId(1);
  c.epoch = 1;
  c.base = Version{1, Digest128{1, 2}};
  c.target = Version{2, Digest128{3, 4}};
  ASSERT_TRUE(state_.WriteCurrent(c).ok());
  auto report = r.Prune(std::nullopt, /*scan_store=*/true);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(Objects(TestRefitId(1)), 2u);
  ASSERT_EQ(report->refits.size(), 1u);
  EXPECT_EQ(report->refits[0].why, "its refit is not over");
  state_.RemoveCurrent();
  report = r.Prune(std::nullopt, true);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(Objects(TestRefitId(1)), 0u);
}

TEST_F(ObjectRetentionTest, ScanReportsUnrecordedRefitsAndForeignKeys) {
  ObjectRetention r(state_, store_.get(), 1);
  Refit(&r, TestRefitId(1), 1, 2, true);
  Upload(TestRefitId(9), 3);  // another root's, or a record removed by hand
  const std::vector<std::byte> data(10, std::byte{1});
  ASSERT_TRUE(store_->Put("refits/not-a-refit", data).ok());
  ASSERT_TRUE(store_->Put("refits/README/x", data).ok());
  ASSERT_TRUE(store_->Put("elsewhere/kept", data).ok());

  auto report = r.Prune(std::nullopt, /*scan_store=*/true);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_EQ(report->refits.size(), 2u);
  EXPECT_EQ(report->refits[0].objects, 2u);
  EXPECT_FALSE(report->refits[0].removed);
  EXPECT_EQ(report->refits[1].state, "unrecorded");
  EXPECT_EQ(report->refits[1].objects, 3u);
  EXPECT_FALSE(report->refits[1].removed);
  EXPECT_EQ(Objects(TestRefitId(9)), 3u);
  EXPECT_EQ(
      report->foreign_keys,
      (std::vector<std::string>{"refits/README/x", "refits/not-a-refit"}));

  // A dry run says it would remove them, and removes nothing.
  report = r.Prune(std::nullopt, true, /*remove_unrecorded=*/true,
                   /*dry_run=*/true);
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->refits[1].removed);
  EXPECT_EQ(Objects(TestRefitId(9)), 3u);

  report = r.Prune(std::nullopt, true, /*remove_unrecorded=*/true);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->objects_removed, 3u);
  EXPECT_EQ(Objects(TestRefitId(9)), 0u);
  EXPECT_EQ(Objects(TestRefitId(1)), 2u);
  EXPECT_TRUE(store_->Get("elsewhere/kept").ok());
  EXPECT_TRUE(store_->Get("refits/not-a-refit").ok());
}

TEST_F(ObjectRetentionTest, AFailedRemovalKeepsTheRecordForTheNextPrune) {
  NoDeleteStore refusing(store_.get());
  ObjectRetention r(state_, &refusing, 0);
  Refit(&r, TestRefitId(1), 1, 2, true);
  Refit(&r, TestRefitId(2), 2, 2, true);
  auto report = r.Prune(std::nullopt);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->failures, 2u);
  EXPECT_FALSE(report->refits[0].removed);
  EXPECT_NE(report->refits[0].why.find("access denied"), std::string::npos)
      << report->refits[0].why;
  EXPECT_TRUE(HasRecord(TestRefitId(1)));
  // Once deletes work, the next prune finishes the job.
  ObjectRetention working(state_, store_.get(), 0);
  report = working.Prune(std::nullopt);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->objects_removed, 4u);
  EXPECT_FALSE(HasRecord(TestRefitId(1)));
}

TEST_F(ObjectRetentionTest, ADamagedRecordIsKeptAndItsObjectsToo) {
  ObjectRetention r(state_, store_.get(), 0);
  Refit(&r, TestRefitId(1), 1, 2, true);
  const std::string path =
      state_.ObjectsDir() + "/" + TestRefitId(1).ToHex() + ".json";
  std::ofstream(path) << "{\"format\": 2, \"refit\": \"zz\"}";
  std::ofstream(state_.ObjectsDir() + "/notes.txt") << "mine";
  auto records = r.Records();
  ASSERT_TRUE(records.ok());
  EXPECT_TRUE(records->empty());
  auto report = r.Prune(std::nullopt);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(Objects(TestRefitId(1)), 2u);
  EXPECT_TRUE(std::filesystem::exists(path));
  EXPECT_TRUE(std::filesystem::exists(state_.ObjectsDir() + "/notes.txt"));
  // dcr gc shows it, and --unrecorded does not take its objects.
  report = r.Prune(std::nullopt, /*scan_store=*/true,
                   /*remove_unrecorded=*/true);
  ASSERT_TRUE(report.ok());
  ASSERT_EQ(report->refits.size(), 1u);
  EXPECT_EQ(report->refits[0].state, "unreadable");
  EXPECT_FALSE(report->refits[0].removed);
  EXPECT_EQ(report->refits[0].objects, 2u);
  EXPECT_EQ(Objects(TestRefitId(1)), 2u);
  // Committed() on it names the file and the field.
  Status s = r.Committed(TestRefitId(1));
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.ToString().find(path), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace dcr
