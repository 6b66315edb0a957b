// The CUDA IPC manifest (dcr/cuda.h) and the Unix socket that carries it:
// no GPU needed. Round trips, every malformed field refused as Corruption
// naming it, and the socket's edges (a server not up yet, none at all, a
// stale socket, a path that is not a socket).
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "dcr/cuda.h"
#include "testing/temp_dir.h"

namespace dcr::cuda {
namespace {

IpcManifest Sample() {
  IpcManifest m;
  m.device = "0000:19:00.0";
  IpcTensor a;
  a.name = "model.layers.0.mlp.up_proj.weight";
  a.dtype = DType::kBF16;
  a.shape = {4, 8};
  a.handle = std::string(128, 'a');
  a.offset = 512;
  a.bytes = 64;
  IpcTensor b = a;
  b.name = "lm_head.weight";
  b.dtype = DType::kF32;
  b.shape = {3};
  b.bytes = 12;
  b.offset = 0;
  b.handle = std::string(64, '0') + std::string(64, 'f');
  m.tensors = {a, b};
  return m;
}

void ExpectSame(const IpcManifest& a, const IpcManifest& b) {
  ASSERT_EQ(a.device, b.device);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    EXPECT_EQ(a.tensors[i].name, b.tensors[i].name);
    EXPECT_EQ(a.tensors[i].dtype, b.tensors[i].dtype);
    EXPECT_EQ(a.tensors[i].shape, b.tensors[i].shape);
    EXPECT_EQ(a.tensors[i].handle, b.tensors[i].handle);
    EXPECT_EQ(a.tensors[i].offset, b.tensors[i].offset);
    EXPECT_EQ(a.tensors[i].bytes, b.tensors[i].bytes);
  }
}

TEST(IpcManifestTest, RoundTrips) {
  const IpcManifest m = Sample();
  const std::string text = EncodeIpcManifest(m);
  EXPECT_EQ(text.back(), '\n');
  auto back = ParseIpcManifest(text);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectSame(m, *back);
  auto empty = ParseIpcManifest(R"({"format":1,"device":"","tensors":[]})");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->tensors.empty());
}

TEST(IpcManifestTest, RefusesMalformedManifests) {
  const std::string h(128, 'a');
  auto tensor = [&](const std::string& fields) {
    return R"({"format":1,"device":"d","tensors":[{)" + fields + "}]}";
  };
  const std::string ok_fields =
      R"("name":"w","dtype":"BF16","shape":[2,3],"handle":")" + h +
      R"(","offset":0,"bytes":12)";
  {
    auto good = ParseIpcManifest(tensor(ok_fields));
    ASSERT_TRUE(good.ok()) << good.status().ToString();
  }
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"", "JSON"},
      {"[]", "not an object"},
      {R"({"format":1,"device":"d"})", "lacks \"tensors\""},
      {R"({"format":1,"device":"d","tensors":[],"x":1})", "unknown key \"x\""},
      {R"({"format":-1,"device":"d","tensors":[]})", "\"format\""},
      {R"({"format":1,"device":7,"tensors":[]})", "\"device\""},
      {R"({"format":1,"device":"d","tensors":{}})", "\"tensors\""},
      {tensor(R"("name":"","dtype":"BF16","shape":[2,3],"handle":")" + h +
              R"(","offset":0,"bytes":12)"),
       "\"name\""},
      {tensor(R"("name":"w","dtype":"BF17","shape":[2,3],"handle":")" + h +
              R"(","offset":0,"bytes":12)"),
       "tensor 'w'"},
      {tensor(R"("name":"w","dtype":"BF16","shape":[2,-3],"handle":")" + h +
              R"(","offset":0,"bytes":12)"),
       "dimension"},
      {tensor(R"("name":"w","dtype":"BF16","shape":[2,3],"handle":")" + h +
              R"(","offset":0,"bytes":13)"),
       "\"bytes\""},
      {tensor(
           R"("name":"w","dtype":"BF16","shape":[2,3],"handle":"AA","offset":0,"bytes":12)"),
       "\"handle\""},
      {tensor(R"("name":"w","dtype":"BF16","shape":[2,3],"handle":")" +
              std::string(128, 'G') + R"(","offset":0,"bytes":12)"),
       "\"handle\""},
      {tensor(R"("name":"w","dtype":"BF16","shape":[2,3],"handle":")" + h +
              R"(","offset":18446744073709551615,"bytes":12)"),
       "overflows"},
      {tensor(
           R"("name":"w","dtype":"BF16","shape":[4294967296,4294967296,2],"handle":")" +
           h + R"(","offset":0,"bytes":0)"),
       "overflows"},
      {tensor(ok_fields + R"(,"extra":true)"), "unknown key"},
      {R"({"format":1,"device":"d","tensors":[{)" + ok_fields + "},{" +
           ok_fields + "}]}",
       "appears twice"},
  };
  for (const auto& [text, what] : bad) {
    auto r = ParseIpcManifest(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << text;
    EXPECT_NE(r.status().ToString().find(what), std::string::npos)
        << r.status().ToString() << " lacks " << what;
  }
  auto newer = ParseIpcManifest(R"({"format":2,"device":"d","tensors":[]})");
  ASSERT_FALSE(newer.ok());
  EXPECT_EQ(newer.status().code(), StatusCode::kUnsupported);
}

TEST(IpcManifestTest, ServesTheManifestOnAUnixSocket) {
  testing::TempDir dir;
  const std::string path = dir.Path("ipc.sock");
  // The client starts first and waits for the server.
  Result<IpcManifest> got = Status::IOError("not run");
  std::thread client([&] { got = FetchIpcManifest(path, 5000); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto server = IpcServer::Start(path, Sample());
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  client.join();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSame(Sample(), *got);
  // Every connection gets it.
  auto again = FetchIpcManifest(path, 1000);
  ASSERT_TRUE(again.ok());
  server.value().reset();
  struct stat sb;
  EXPECT_NE(::stat(path.c_str(), &sb), 0) << "the socket outlived its server";
  // Nothing listening: a timeout that says what to check.
  auto none = FetchIpcManifest(path, 200);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().ToString().find("serving process"),
            std::string::npos);
}

TEST(IpcManifestTest, ReplacesAStaleSocketButNoLiveOneOrOtherFile) {
  testing::TempDir dir;
  const std::string path = dir.Path("ipc.sock");
  {
    // A socket file as a crashed server leaves it: bound, nobody listening.
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, path.data(), path.size());
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    ::close(fd);
    auto s = IpcServer::Start(path, Sample());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    // A live server's socket is not taken over.
    auto s2 = IpcServer::Start(path, Sample());
    ASSERT_FALSE(s2.ok());
    EXPECT_NE(s2.status().ToString().find("already answers"),
              std::string::npos);
    EXPECT_TRUE(FetchIpcManifest(path, 1000).ok());
  }
  // A server that stops removes only its own socket: a newer one bound at
  // the path meanwhile keeps it.
  {
    auto old_server = IpcServer::Start(path, Sample());
    ASSERT_TRUE(old_server.ok());
    ASSERT_EQ(::unlink(path.c_str()), 0);  // as an operator's cleanup would
    auto newer = IpcServer::Start(path, Sample());
    ASSERT_TRUE(newer.ok());
    old_server.value().reset();
    EXPECT_TRUE(FetchIpcManifest(path, 1000).ok())
        << "the old server removed the newer one's socket";
  }
  const std::string file = dir.Path("weights.bin");
  std::ofstream(file) << "not a socket";
  auto refused = IpcServer::Start(file, Sample());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().ToString().find("not a socket"),
            std::string::npos);
  std::ifstream in(file);
  std::string kept;
  std::getline(in, kept);
  EXPECT_EQ(kept, "not a socket");
  EXPECT_FALSE(IpcServer::Start(std::string(200, 'x'), Sample()).ok());
}

}  // namespace
}  // namespace dcr::cuda
