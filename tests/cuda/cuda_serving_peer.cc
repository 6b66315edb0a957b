// The relay's side of the GPU serving test (cuda_serving_test.cc), a
// process of its own as CUDA IPC requires: shm images at steps 1 (live)
// and 2, ServingImages on DIR/relay.sock attaching the test's exported
// buffers through AttachCudaIpcWeights, and a flip to step 2 once they
// are attached and the test created DIR/go. Exits 0 once the server moved to
// step 2 (printing the relay's figures), 1 otherwise.
//
// Usage: cuda_serving_peer DIR
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <thread>

#include "cuda_serving_bits.h"
#include "dcr/serving.h"
#include "dcr/store.h"
#include "relay/device_weights.h"
#include "relay/serving_images.h"

namespace {

using dcr::cudatest::ServingBits;
using dcr::cudatest::ServingTensors;

int Fail(const std::string& why) {
  std::fprintf(stderr, "cuda_serving_peer: %s\n", why.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return Fail("usage: cuda_serving_peer DIR");
  const std::string dir = argv[1];
  dcr::StoreSpec spec;
  spec.kind = dcr::StoreSpec::Kind::kShm;
  spec.path = "/dcr_cuda_serving_" + std::to_string(::getpid());
  auto cleanup = [&] {
    for (uint32_t i = 0; i < 2; ++i) {
      (void)dcr::RemoveStore(dcr::ServingImageSpec(spec, i));
      ::shm_unlink((spec.path + "." + std::to_string(i) + ".readers").c_str());
    }
    (void)dcr::LiveHeader::Remove(dcr::LiveHeaderName(spec));
  };
  auto m = dcr::Manifest::Create(ServingTensors());
  if (!m.ok()) return Fail(m.status().ToString());
  for (uint32_t i = 0; i < 2; ++i) {
    auto s = dcr::CreateStore(dcr::ServingImageSpec(spec, i), *m);
    if (!s.ok()) return Fail(s.status().ToString());
    for (size_t t = 0; t < m->size(); ++t) {
      const std::vector<std::byte> bits = ServingBits(t, i + 1);
      std::memcpy((*s)->MutableTensor(t).data(), bits.data(), bits.size());
    }
    if (!(*s)->Commit(dcr::Version{i + 1, {i + 1, i + 1}}, {}).ok()) {
      return Fail("commit");
    }
  }
  if (!dcr::LiveHeader::Create(dcr::LiveHeaderName(spec), {0, {1, {1, 1}}, 1})
           .ok()) {
    return Fail("header");
  }
  std::deque<std::function<void()>> posted;
  std::mutex mu;
  dcr::ServingImages::Options o;
  o.node = "peer";
  o.store = spec;
  o.socket = dir + "/relay.sock";
  o.deadline = std::chrono::seconds(10);
  o.post = [&](std::function<void()> fn) {
    std::lock_guard<std::mutex> l(mu);
    posted.push_back(std::move(fn));
  };
  o.attach_device = [](const std::string& path, const dcr::Manifest*) {
    return dcr::AttachCudaIpcWeights(path, ServingTensors(), "the test server",
                                     "the test's tensors");
  };
  auto images = dcr::ServingImages::Open(std::move(o));
  if (!images.ok()) return Fail(images.status().ToString());
  if (!(*images)->Listen().ok()) return Fail("listen");
  std::unique_ptr<dcr::WeightStore> standby;
  bool flipped = false;
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < until) {
    std::deque<std::function<void()>> run;
    {
      std::lock_guard<std::mutex> l(mu);
      run.swap(posted);
    }
    for (auto& fn : run) fn();
    (*images)->Tick();
    const dcr::ServingStats st = (*images)->stats();
    // The test says go once it checked the buffers at step 1.
    if (!flipped && st.gpu && ::access((dir + "/go").c_str(), F_OK) == 0) {
      auto s = dcr::OpenStore(dcr::ServingImageSpec(spec, 1));
      if (!s.ok()) return Fail(s.status().ToString());
      standby = *std::move(s);
      dcr::RefitId refit;
      refit.bytes.fill(0x42);
      if (!(*images)
               ->Flip(standby, refit, std::chrono::steady_clock::now())
               .ok()) {
        return Fail("flip");
      }
      flipped = true;
    }
    if (st.pauses == 1) {
      std::printf(
          "gpu syncs %llu, tensors patched %llu (%llu bytes), tensors "
          "rewritten %llu, last sync %.3f ms, pause %.3f ms\n",
          static_cast<unsigned long long>(st.gpu_syncs),
          static_cast<unsigned long long>(st.gpu_patched),
          static_cast<unsigned long long>(st.gpu_patched_bytes),
          static_cast<unsigned long long>(st.gpu_rewritten),
          st.last_gpu_sync_seconds * 1e3, st.last_pause_seconds * 1e3);
      images->reset();
      standby.reset();
      cleanup();
      return 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  images->reset();
  standby.reset();
  cleanup();
  return Fail(flipped ? "the server never moved to step 2"
                      : "the server's buffers were never attached");
}
