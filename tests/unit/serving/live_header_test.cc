#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "dcr/serving.h"

namespace dcr {
namespace {

using ::testing::HasSubstr;

std::string Name() {
  static std::atomic<int> n{0};
  return "/dcr_live_test_" + std::to_string(::getpid()) + "_" +
         std::to_string(n++) + ".live";
}

TEST(ServingImagesTest, ImageSpecsNameBothImagesAndTheirRecords) {
  StoreSpec spec;
  spec.kind = StoreSpec::Kind::kShm;
  spec.path = "/policy";
  EXPECT_EQ(ServingImageSpec(spec, 0).path, "/policy.0");
  EXPECT_EQ(ServingImageSpec(spec, 1).path, "/policy.1");
  EXPECT_EQ(ServingImageSpec(spec, 1).record_path, "");
  EXPECT_EQ(LiveHeaderName(spec), "/policy.live");
  spec.record_path = "/var/lib/dcr/policy.dcr-version";
  EXPECT_EQ(ServingImageSpec(spec, 1).record_path,
            "/var/lib/dcr/policy.1.dcr-version");
}

TEST(ServingImagesTest, ReaderLocksKeepTheRelayOffAnImage) {
  StoreSpec spec;
  spec.kind = StoreSpec::Kind::kShm;
  spec.path = Name();
  {
    auto reader = LockImage(spec, 1, /*exclusive=*/false);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    auto second = LockImage(spec, 1, false);
    EXPECT_TRUE(second.ok());
    auto relay = LockImage(spec, 1, /*exclusive=*/true);
    ASSERT_FALSE(relay.ok());
    EXPECT_EQ(relay.status().code(), StatusCode::kAborted);
    EXPECT_THAT(relay.status().message(),
                HasSubstr("a serving process computes on image 1"));
    // The other image is free.
    EXPECT_TRUE(LockImage(spec, 0, true).ok());
  }
  // Every reader gone (a dead process's locks go with it).
  auto relay = LockImage(spec, 1, true);
  ASSERT_TRUE(relay.ok());
  auto reader = LockImage(spec, 1, false);
  ASSERT_FALSE(reader.ok());
  EXPECT_THAT(reader.status().message(), HasSubstr("the relay writes image 1"));
  for (int i = 0; i < 2; ++i) {
    ::shm_unlink((spec.path + "." + std::to_string(i) + ".readers").c_str());
  }
}

TEST(LiveHeaderTest, CreateWriteRead) {
  const std::string name = Name();
  EXPECT_EQ(LiveHeader::Open(name).status().code(), StatusCode::kNotFound);
  LiveState s{1, {7, {1, 2}}, 3};
  auto h = LiveHeader::Create(name, s);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  auto reader = LiveHeader::Open(name);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ(*reader->Read(), s);
  s = {0, {8, {3, 4}}, 4};
  h->Write(s);
  EXPECT_EQ(*reader->Read(), s);
  // Created again (a relay's restart): the state it is given.
  s = {1, {9, {5, 6}}, 5};
  ASSERT_TRUE(LiveHeader::Create(name, s).ok());
  EXPECT_EQ(*reader->Read(), s);
  ASSERT_TRUE(LiveHeader::Remove(name).ok());
  EXPECT_TRUE(LiveHeader::Remove(name).ok());
}

TEST(LiveHeaderTest, ReadersNeverSeeATornState) {
  const std::string name = Name();
  auto h = LiveHeader::Create(name, {0, {0, {0, 0}}, 0});
  ASSERT_TRUE(h.ok());
  auto r = LiveHeader::Open(name);
  ASSERT_TRUE(r.ok());
  std::atomic<bool> done{false};
  std::atomic<bool> go{false};
  std::thread writer([&] {
    while (!go) std::this_thread::yield();
    for (uint64_t i = 1; i <= 20000; ++i) {
      // Every field derived from i: a torn read mixes two i.
      h->Write({static_cast<uint32_t>(i % 2), {i, {i, ~i}}, i});
    }
    done = true;
  });
  uint64_t reads = 0;
  go = true;
  while (!done || reads == 0) {
    auto s = r->Read();
    ASSERT_TRUE(s.ok());
    const uint64_t i = s->flips;
    ASSERT_EQ(s->image, i % 2);
    ASSERT_EQ(s->version.step, i);
    ASSERT_EQ(s->version.digest.high, i);
    ASSERT_EQ(s->version.digest.low, i == 0 ? 0 : ~i);
    ++reads;
  }
  writer.join();
  EXPECT_GT(reads, 0u);
  (void)LiveHeader::Remove(name);
}

TEST(LiveHeaderTest, NotAHeaderIsRefused) {
  const std::string name = Name();
  {
    int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, 64), 0);
    ::close(fd);
  }
  auto h = LiveHeader::Open(name);
  ASSERT_FALSE(h.ok());
  EXPECT_THAT(h.status().message(), HasSubstr("bad magic"));
  {
    int fd = ::shm_open(name.c_str(), O_RDWR, 0644);
    ASSERT_EQ(::ftruncate(fd, 100), 0);
    ::close(fd);
  }
  h = LiveHeader::Open(name);
  ASSERT_FALSE(h.ok());
  EXPECT_THAT(h.status().message(), HasSubstr("not 64"));
  (void)LiveHeader::Remove(name);
}

}  // namespace
}  // namespace dcr
