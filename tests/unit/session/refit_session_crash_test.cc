// A relay killed mid-refit: RefitSession::RecoverAfterCrash from the
// journal the dead process left.
#include <gtest/gtest.h>

#include <string>

#include "session/refit_session.h"
#include "unit/session/refit_session_fixture.h"

namespace dcr {
namespace {

using testing_relay::RefitSessionTest;

// A relay killed mid-refit: its journal outlives it, and the restart
// recovers from it (RefitSession::RecoverAfterCrash).
class CrashRecoveryTest : public RefitSessionTest {
 protected:
  using Outcome = RefitSession::CrashRecovery::Outcome;
  std::string JournalFile() const {
    return JournalPath(store_->record_path(), "");
  }
  // The process dies: the session goes without Abort or Commit (its
  // destructor only closes the journal), then the store is reopened.
  void Crash(std::unique_ptr<RefitSession> s) {
    s.reset();
    Reopen();
  }
  RefitSession::CrashRecovery Recover(const std::string& boot) {
    return RefitSession::RecoverAfterCrash(store_.get(), JournalFile(), boot,
                                           nullptr);
  }
  std::string BootId() const {
    auto b = CurrentBootId();
    return b.ok() ? *b : std::string();
  }
  // Half the XOR chunks, one of them overwritten again (a repair), and an
  // overwrite of a span no XOR reached.
  void ApplySome(RefitSession* s) {
    for (size_t i = 0; i < xor_chunks_.size() / 2; ++i) {
      ASSERT_TRUE(s->Apply(xor_chunks_[i], decoder_.get()).ok());
    }
    ASSERT_TRUE(s->Apply(overwrite_chunks_[0], decoder_.get()).ok());
    ASSERT_TRUE(s->Apply(overwrite_chunks_.back(), decoder_.get()).ok());
  }
};

TEST_F(CrashRecoveryTest, NoYesVoteRestoresTheBaseByItself) {
  ASSERT_FALSE(BootId().empty()) << "needs /proc/sys/kernel/random/boot_id";
  auto s = Begin();
  ASSERT_TRUE(s);
  ApplySome(s.get());
  ASSERT_FALSE(StoreHolds(base_));
  Crash(std::move(s));
  // A torn record at the tail: the apply it was written for never started.
  {
    std::ofstream f(JournalFile(), std::ios::app | std::ios::binary);
    f << "\x01\x00\x00\x00\xff\x00";
  }
  ASSERT_TRUE(store_->InProgress().has_value());
  RefitSession::CrashRecovery r = Recover(BootId());
  EXPECT_EQ(r.outcome, Outcome::kRestored) << r.detail;
  EXPECT_EQ(r.unfinished->refit, refit_);
  EXPECT_EQ(r.spans, xor_chunks_.size() / 2 + 1);
  EXPECT_GT(r.bytes, 0u);
  EXPECT_TRUE(StoreHolds(base_));
  EXPECT_FALSE(store_->InProgress().has_value());
  EXPECT_FALSE(std::filesystem::exists(JournalFile()));
  // The restored base survives another restart, and the same refit can be
  // taken again with a normal session (XOR applies, the vote is yes).
  Reopen();
  EXPECT_FALSE(store_->InProgress().has_value());
  auto again = Begin();
  ASSERT_TRUE(again);
  for (const auto& c : xor_chunks_) {
    ASSERT_EQ(*again->Apply(c, decoder_.get()),
              RefitSession::ApplyOutcome::kApplied);
  }
  EXPECT_EQ(again->Vote(End(xor_chunks_), nullptr).code, NodeCode::kOk);
  ASSERT_TRUE(again->Commit().ok());
  EXPECT_TRUE(StoreHolds(target_));
  EXPECT_FALSE(std::filesystem::exists(JournalFile()));
}

TEST_F(CrashRecoveryTest, AKilledProcessIsRestoredAtRestart) {
  ASSERT_FALSE(BootId().empty());
  // The relay's process applies and exits without any cleanup.
  store_.reset();
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto st = OpenStore(*ParseStoreSpec("file:" + path_));
    if (!st.ok()) ::_exit(2);
    store_ = std::move(*st);
    NodeResult refusal;
    auto s = RefitSession::Begin(store_.get(), "n0", refit_, plan_, &refusal);
    if (!s) ::_exit(3);
    for (size_t i = 0; i + 1 < xor_chunks_.size(); ++i) {
      if (!s->Apply(xor_chunks_[i], decoder_.get()).ok()) ::_exit(4);
    }
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  Reopen();
  ASSERT_TRUE(store_->InProgress().has_value());
  ASSERT_FALSE(StoreHolds(base_));
  RefitSession::CrashRecovery r = Recover(BootId());
  EXPECT_EQ(r.outcome, Outcome::kRestored) << r.detail;
  EXPECT_TRUE(StoreHolds(base_));
  EXPECT_FALSE(store_->InProgress().has_value());
}

TEST_F(CrashRecoveryTest, AYesVoteIsNeverRestored) {
  ASSERT_FALSE(BootId().empty());
  auto s = Begin();
  ASSERT_TRUE(s);
  for (const auto& c : xor_chunks_) {
    ASSERT_TRUE(s->Apply(c, decoder_.get()).ok());
  }
  ASSERT_EQ(s->Vote(End(xor_chunks_), nullptr).code, NodeCode::kOk);
  Crash(std::move(s));
  RefitSession::CrashRecovery r = Recover(BootId());
  EXPECT_EQ(r.outcome, Outcome::kPrepared) << r.detail;
  // Prepared: the target's bits, the refit still unfinished, the journal
  // kept (a second crash finds the vote again).
  EXPECT_TRUE(StoreHolds(target_));
  ASSERT_TRUE(store_->InProgress().has_value());
  EXPECT_EQ(store_->InProgress()->refit, refit_);
  EXPECT_TRUE(std::filesystem::exists(JournalFile()));
  EXPECT_EQ(Recover(BootId()).outcome, Outcome::kPrepared);

  // Bits that are not the target's: an unknown mix, still not restored.
  store_->MutableTensor(0)[3] ^= std::byte{0x20};
  r = Recover(BootId());
  EXPECT_EQ(r.outcome, Outcome::kPreparedMix) << r.detail;
  EXPECT_TRUE(store_->InProgress().has_value());
}

// A PLAN that left the target's digest to END: the record names the target
// step with a zero digest, and the yes vote in the journal supplies it.
TEST_F(CrashRecoveryTest, AYesVoteForATargetLearnedAtEndIsPrepared) {
  ASSERT_FALSE(BootId().empty());
  const Version target = plan_.target;
  plan_.target.digest = Digest128{};
  auto s = Begin();
  ASSERT_TRUE(s);
  EXPECT_EQ(store_->InProgress()->target, plan_.target);
  for (const auto& c : xor_chunks_) {
    ASSERT_TRUE(s->Apply(c, decoder_.get()).ok());
  }
  s->LearnTarget(target, {});
  ASSERT_EQ(s->Vote(End(xor_chunks_), nullptr).code, NodeCode::kOk);
  Crash(std::move(s));
  RefitSession::CrashRecovery r = Recover(BootId());
  EXPECT_EQ(r.outcome, Outcome::kPrepared) << r.detail;
  ASSERT_TRUE(r.unfinished);
  EXPECT_EQ(r.unfinished->target, target);
  // The resumed coordinator's PLAN names the decided target: the relay
  // rejoins (same refit, same step) and commits it.
  plan_.target = target;
  RefitSession::Options o;
  o.rejoin = true;
  auto rejoined = Begin(o);
  ASSERT_TRUE(rejoined);
  ASSERT_TRUE(rejoined->Commit().ok());
  EXPECT_EQ(store_->committed(), target);
  EXPECT_TRUE(StoreHolds(target_));
}

// A commit can hand its journal over, so that the relay answers before the
// unlink (which may wait for a file system commit); a journal left behind
// by a crash meanwhile names a refit the record no longer does, and a
// restart removes it.
TEST_F(CrashRecoveryTest, ACommitHandsItsJournalOverForRemovalAfterTheReply) {
  ASSERT_FALSE(BootId().empty());
  auto s = Begin();
  ASSERT_TRUE(s);
  for (const auto& c : xor_chunks_) {
    ASSERT_TRUE(s->Apply(c, decoder_.get()).ok());
  }
  ASSERT_EQ(s->Vote(End(xor_chunks_), nullptr).code, NodeCode::kOk);
  std::unique_ptr<Journal> spent;
  ASSERT_TRUE(s->Commit(&spent).ok());
  ASSERT_TRUE(spent);
  EXPECT_EQ(store_->committed(), plan_.target);
  EXPECT_TRUE(std::filesystem::exists(JournalFile()));
  // Crash before the caller removed it: the restart drops it.
  spent.reset();
  s.reset();
  Reopen();
  RefitSession::CrashRecovery r = Recover(BootId());
  EXPECT_EQ(r.outcome, Outcome::kNothing) << r.detail;
  EXPECT_FALSE(std::filesystem::exists(JournalFile()));
  EXPECT_TRUE(StoreHolds(target_));
}

TEST_F(CrashRecoveryTest, ARejoinedSessionRecordsItsYesVoteToo) {
  ASSERT_FALSE(BootId().empty());
  auto s = Begin();
  ASSERT_TRUE(s);
  ApplySome(s.get());
  Crash(std::move(s));
  // The journal was lost: the relay rejoins taking overwrites only.
  std::filesystem::remove(JournalFile());
  EXPECT_EQ(Recover(BootId()).outcome, Outcome::kNoJournal);
  RefitSession::Options o;
  o.rejoin = true;
  auto rejoined = Begin(o);
  ASSERT_TRUE(rejoined);
  for (const auto& c : overwrite_chunks_) {
    ASSERT_TRUE(rejoined->Apply(c, decoder_.get()).ok());
  }
  ASSERT_EQ(rejoined->Vote(End(overwrite_chunks_), nullptr).code,
            NodeCode::kOk);
  Crash(std::move(rejoined));
  EXPECT_EQ(Recover(BootId()).outcome, Outcome::kPrepared);
  EXPECT_TRUE(StoreHolds(target_));
}

TEST_F(CrashRecoveryTest, AnotherBootsOrAnotherRefitsJournalIsNotTrusted) {
  ASSERT_FALSE(BootId().empty());
  auto s = Begin();
  ASSERT_TRUE(s);
  ApplySome(s.get());
  Crash(std::move(s));
  const std::vector<std::byte> mix(store_->Tensor(0).begin(),
                                   store_->Tensor(0).end());
  // After a reboot (another boot id) the journal may have lost records.
  RefitSession::CrashRecovery r =
      Recover("99999999-8888-7777-6666-555555555555");
  EXPECT_EQ(r.outcome, Outcome::kNoJournal);
  EXPECT_NE(r.detail.find("reboot"), std::string::npos) << r.detail;
  EXPECT_TRUE(std::equal(mix.begin(), mix.end(), store_->Tensor(0).begin()));
  EXPECT_TRUE(store_->InProgress().has_value());
  // A record naming another refit: not this journal's.
  RefitId other;
  other.bytes[0] = 99;
  ASSERT_TRUE(store_->BeginRefit(other, base_v_, target_v_).ok());
  EXPECT_EQ(Recover(BootId()).outcome, Outcome::kNoJournal);
  // A torn header.
  ASSERT_TRUE(store_->BeginRefit(refit_, base_v_, target_v_).ok());
  std::filesystem::resize_file(JournalFile(), 60);
  EXPECT_EQ(Recover(BootId()).outcome, Outcome::kNoJournal);
  EXPECT_TRUE(store_->InProgress().has_value());
  // Nothing unfinished: a journal left behind is removed.
  ASSERT_TRUE(store_->EndRefit().ok());
  EXPECT_EQ(Recover(BootId()).outcome, Outcome::kNothing);
  EXPECT_FALSE(std::filesystem::exists(JournalFile()));
}

TEST_F(CrashRecoveryTest, BitsThatDoNotRestoreToTheBaseStayUnfinished) {
  ASSERT_FALSE(BootId().empty());
  auto s = Begin();
  ASSERT_TRUE(s);
  ApplySome(s.get());
  Crash(std::move(s));
  // A byte no apply touched changed too (the journal cannot undo it).
  store_->MutableTensor(1)[9] ^= std::byte{0x01};  // element 2: unchanged
  RefitSession::CrashRecovery r = Recover(BootId());
  EXPECT_EQ(r.outcome, Outcome::kRestoreFailed);
  EXPECT_NE(r.detail.find("not step 1's"), std::string::npos) << r.detail;
  EXPECT_TRUE(store_->InProgress().has_value());
}

}  // namespace
}  // namespace dcr
