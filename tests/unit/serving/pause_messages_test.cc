#include "serving/pause_messages.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace dcr {
namespace {

using ::testing::HasSubstr;
using Op = PauseMsg::Op;

RefitId Id(uint8_t b) {
  RefitId id;
  id.bytes.fill(b);
  return id;
}

TEST(PauseMessagesTest, EveryOpRoundTrips) {
  std::vector<PauseMsg> all;
  PauseMsg m;
  m.op = Op::kHello;
  m.pid = 1234;
  m.image = 1;
  all.push_back(m);
  m.image.reset();
  all.push_back(m);
  m.cuda_ipc = "/run/server/weights.sock";
  all.push_back(m);
  for (Op op : {Op::kPause, Op::kPaused}) {
    m = {};
    m.op = op;
    m.refit = Id(0x5a);
    all.push_back(m);
  }
  m = {};
  m.op = Op::kReady;
  m.refit = Id(0xab);
  all.push_back(m);
  m = {};
  m.op = Op::kFlipped;
  m.image = 0;
  m.version.step = 9;
  all.push_back(m);
  m = {};
  m.op = Op::kPrepare;
  m.refit = Id(3);
  m.version.step = 10;
  all.push_back(m);
  for (Op op : {Op::kLive, Op::kCommit}) {
    m = {};
    m.op = op;
    if (op == Op::kCommit) m.refit = Id(7);
    m.image = 1;
    m.version = {11, {0x1122334455667788, 0x99aabbccddeeff00}};
    m.flips = 12;
    all.push_back(m);
  }
  m.op = Op::kLive;
  m.refit = {};
  m.cuda = true;
  all.push_back(m);
  m = {};
  m.op = Op::kAbort;
  m.refit = Id(9);
  all.push_back(m);
  m = {};
  m.op = Op::kError;
  m.detail = "another serving process is attached";
  all.push_back(m);
  for (const PauseMsg& msg : all) {
    const std::string line = EncodePauseMsg(msg);
    SCOPED_TRACE(line);
    ASSERT_EQ(line.back(), '\n');
    ASSERT_EQ(line.find('\n'), line.size() - 1);
    auto back =
        DecodePauseMsg(std::string_view(line).substr(0, line.size() - 1));
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, msg);
  }
}

TEST(PauseMessagesTest, UnknownKeysAreIgnored) {
  auto m =
      DecodePauseMsg(R"({"op":"flipped","image":1,"step":4,"future":[1,2]})");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->image, 1u);
  EXPECT_EQ(m->version.step, 4u);
}

TEST(PauseMessagesTest, TheGpuKeysAreOptionalAndWrittenOnlyWhenSet) {
  // An older server's hello and an older relay's live still decode.
  auto hello = DecodePauseMsg(R"({"op":"hello","pid":3,"image":null})");
  ASSERT_TRUE(hello.ok()) << hello.status().ToString();
  EXPECT_EQ(hello->cuda_ipc, "");
  auto live = DecodePauseMsg(
      R"({"op":"live","image":0,"step":1,"digest":"00112233445566778899aabbccddeeff","flips":1})");
  ASSERT_TRUE(live.ok()) << live.status().ToString();
  EXPECT_FALSE(live->cuda);
  // And a relay writes neither key to a server that did not ask.
  EXPECT_EQ(EncodePauseMsg(*hello).find("cuda"), std::string::npos);
  EXPECT_EQ(EncodePauseMsg(*live).find("cuda"), std::string::npos);
}

TEST(PauseMessagesTest, BadLinesSayWhatIsWrong) {
  struct Case {
    const char* line;
    const char* why;
  } cases[] = {
      {"", "not a JSON object"},
      {"[1]", "not a JSON object"},
      {"{\"op\":1}", "\"op\" must be a string"},
      {"{\"op\":\"launch\"}", "unknown op \"launch\""},
      {"{\"op\":\"hello\",\"image\":0}", "\"pid\""},
      {"{\"op\":\"hello\",\"pid\":1}", "\"image\" is missing"},
      {"{\"op\":\"hello\",\"pid\":-1,\"image\":0}", "\"pid\""},
      {"{\"op\":\"flipped\",\"image\":2,\"step\":1}", "0 or 1"},
      {"{\"op\":\"ready\",\"refit\":\"xyz\"}", "32 hex digits"},
      {"{\"op\":\"live\",\"image\":0,\"step\":1,\"digest\":\"00\",\"flips\":1}",
       "\"digest\" must be 32 hex digits"},
      {"{\"op\":\"prepare\",\"refit\":\"00112233445566778899aabbccddeeff\","
       "\"step\":1.5}",
       "\"step\""},
      {"{\"op\":\"hello\",\"pid\":1,\"image\":null,\"cuda_ipc\":\"rel.sock\"}",
       "absolute socket path"},
      {"{\"op\":\"hello\",\"pid\":1,\"image\":null,\"cuda_ipc\":7}",
       "\"cuda_ipc\" must be a string"},
      {"{\"op\":\"live\",\"image\":0,\"step\":1,\"digest\":"
       "\"00112233445566778899aabbccddeeff\",\"flips\":1,\"cuda\":1}",
       "\"cuda\" must be true or false"},
      {"{\"op\":\"paused\"}", "\"refit\""},
  };
  {
    const std::string long_path = "/" + std::string(kMaxSocketPath, 'a');
    auto m =
        DecodePauseMsg(R"({"op":"hello","pid":1,"image":null,"cuda_ipc":")" +
                       long_path + "\"}");
    ASSERT_FALSE(m.ok());
    EXPECT_THAT(m.status().message(), HasSubstr("at most 107 bytes"));
  }
  for (const Case& c : cases) {
    auto m = DecodePauseMsg(c.line);
    ASSERT_FALSE(m.ok()) << c.line;
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(m.status().message(), HasSubstr(c.why)) << c.line;
  }
  EXPECT_FALSE(DecodePauseMsg(std::string(kMaxPauseLine, ' ')).ok());
}

TEST(PauseMessagesTest, AnErrorDetailIsBoundedToFitALine) {
  PauseMsg m;
  m.op = Op::kError;
  m.detail = std::string(10000, '\x01');  // escaped: 6 bytes each
  EXPECT_LE(EncodePauseMsg(m).size(), kMaxPauseLine);
}

}  // namespace
}  // namespace dcr
