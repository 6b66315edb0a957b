// The weights of the GPU serving test (cuda_serving_test.cc and its relay,
// cuda_serving_peer.cc): two tensors and their bits at steps 1 and 2,
// computed alike in both processes.
#ifndef DCR_TESTS_CUDA_CUDA_SERVING_BITS_H_
#define DCR_TESTS_CUDA_CUDA_SERVING_BITS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dcr/checkpoint.h"

namespace dcr::cudatest {

inline std::vector<TensorInfo> ServingTensors() {
  return {{"model.a.weight", DType::kBF16, {256, 128}},
          {"model.b.bias", DType::kF32, {1000}}};
}

// Tensor `t`'s bytes at `step` (1 or 2): step 2 changes every 37th byte.
inline std::vector<std::byte> ServingBits(size_t t, uint64_t step) {
  std::vector<std::byte> b(ServingTensors()[t].NumBytes());
  for (size_t i = 0; i < b.size(); ++i) {
    uint8_t v = static_cast<uint8_t>(i * 131 + t * 17 + 1);
    if (step >= 2 && i % 37 == 0) v ^= 0x5a;
    b[i] = std::byte{v};
  }
  return b;
}

}  // namespace dcr::cudatest

#endif  // DCR_TESTS_CUDA_CUDA_SERVING_BITS_H_
