// A relay keeping a serving process's GPU buffers at its live image,
// through real CUDA IPC (docs/PROTOCOL.md §"GPU servers"): this process is
// the server (device buffers, exported, and a GpuReceiver), and
// cuda_serving_peer the relay (ServingImages with AttachCudaIpcWeights).
// Skipped where no GPU is usable.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "cuda_serving_bits.h"
#include "cuda_test_util.h"
#include "dcr/serving.h"

extern char** environ;

namespace dcr::cuda::cudatest {
namespace {

std::string ServingPeerPath() {
  return HelperBinary("cuda_serving_peer", "DCR_CUDA_SERVING_PEER",
                      DCR_CUDA_SERVING_PEER);
}

TEST_F(CudaTest, ARelayBringsAServersGpuBuffersToEachCommit) {
  const std::vector<TensorInfo> tensors = dcr::cudatest::ServingTensors();
  char dir_template[] = "/tmp/dcr-cuda-serving-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  // The server's weights, poisoned: the relay's attach must write them.
  std::vector<DeviceBuffer> buffers;
  IpcManifest manifest;
  manifest.device = Value(Probe()).devices.front().pci_bus_id;
  for (const TensorInfo& t : tensors) {
    buffers.push_back(Alloc(t.NumBytes()));
    ASSERT_TRUE(Fill(buffers.back().data(), kPoison, t.NumBytes()).ok());
    manifest.tensors.push_back(Value(
        ExportIpcTensor(t.name, t.dtype, t.shape, buffers.back().data())));
  }
  // A KV cache the relay must leave alone.
  DeviceBuffer kv = Alloc(4096);
  ASSERT_TRUE(Fill(kv.data(), 0x3c, kv.size()).ok());
  manifest.tensors.push_back(
      Value(ExportIpcTensor("kv_cache", DType::kU8, {4096}, kv.data())));
  auto server = Value(IpcServer::Start(dir + "/ipc.sock", manifest));

  const std::string peer = ServingPeerPath();
  const std::string out = dir + "/peer.out";
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<char*> args = {const_cast<char*>(peer.c_str()),
                             const_cast<char*>(dir.c_str()), nullptr};
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, peer.c_str(), &fa, nullptr, args.data(), environ),
            0)
      << peer;
  posix_spawn_file_actions_destroy(&fa);
  // Reaped below; killed if the test stops before.
  bool reaped = false;
  int wstatus = 0;
  struct Reaper {
    pid_t pid;
    bool* reaped;
    ~Reaper() {
      if (!*reaped) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
      }
    }
  } reaper{pid, &reaped};

  GpuReceiver::Options o;
  o.socket = dir + "/relay.sock";
  o.cuda_ipc = dir + "/ipc.sock";
  o.wait = std::chrono::seconds(20);
  auto r = GpuReceiver::Open(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  GpuReceiver& rc = **r;
  ASSERT_TRUE(rc.usable());
  EXPECT_EQ(rc.version().step, 1u);
  for (size_t t = 0; t < tensors.size(); ++t) {
    EXPECT_EQ(Download(buffers[t].data(), tensors[t].NumBytes()),
              dcr::cudatest::ServingBits(t, 1))
        << tensors[t].name << " at attach";
  }
  // Go: the peer flips to step 2; the next polls pause, wait while it
  // writes, and come back on step 2.
  std::ofstream(dir + "/go").put('\n');
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (rc.version().step != 2 && std::chrono::steady_clock::now() < until) {
    ASSERT_TRUE(rc.Poll().ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(rc.usable());
  EXPECT_EQ(rc.version().step, 2u);
  EXPECT_EQ(rc.pauses(), 1u);
  for (size_t t = 0; t < tensors.size(); ++t) {
    EXPECT_EQ(Download(buffers[t].data(), tensors[t].NumBytes()),
              dcr::cudatest::ServingBits(t, 2))
        << tensors[t].name << " after the commit";
  }
  EXPECT_EQ(Download(kv.data(), kv.size()),
            std::vector<std::byte>(kv.size(), std::byte{0x3c}));
  // The peer exits once our flipped reached it.
  for (int i = 0; i < 2000 && !reaped; ++i) {
    reaped = ::waitpid(pid, &wstatus, WNOHANG) == pid;
    if (!reaped) {
      (void)rc.Poll();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  std::ifstream in(out);
  std::stringstream figures;
  figures << in.rdbuf();
  EXPECT_TRUE(reaped) << "the peer did not exit; it printed: " << figures.str();
  EXPECT_TRUE(reaped && WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0)
      << "peer: " << figures.str();
  // The attach rewrote both tensors; step 2 (5% of "a"'s elements, 11% of
  // "b"'s) patched them.
  EXPECT_NE(figures.str().find(
                "tensors patched 2 (11504 bytes), tensors rewritten 2,"),
            std::string::npos)
      << figures.str();
  std::printf("GPU serving: %s", figures.str().c_str());
  server.reset();
}

}  // namespace
}  // namespace dcr::cuda::cudatest
