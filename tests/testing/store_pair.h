// Test data shared by the relay's unit tests: a base and a target for a
// list of tensors (random base bits; the target flips the low bit of every
// 7th byte, about 1 in 7 elements changed), and a check of a store's bits.
#ifndef DCR_TESTS_TESTING_STORE_PAIR_H_
#define DCR_TESTS_TESTING_STORE_PAIR_H_

#include <algorithm>
#include <cstddef>
#include <random>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/store.h"

namespace dcr::testing {

struct StorePair {
  std::vector<std::vector<std::byte>> base, target;
};

inline StorePair MakeStorePair(const std::vector<TensorInfo>& infos) {
  StorePair p;
  std::mt19937 rng(1);
  for (const TensorInfo& t : infos) {
    std::vector<std::byte> b(t.NumBytes());
    for (auto& x : b) x = static_cast<std::byte>(rng());
    p.base.push_back(b);
    for (size_t i = 0; i < b.size(); i += 7) b[i] ^= std::byte{1};
    p.target.push_back(std::move(b));
  }
  return p;
}

// True iff every tensor of `store` holds exactly `data`'s bytes.
inline bool StoreHolds(const WeightStore& store,
                       const std::vector<std::vector<std::byte>>& data) {
  for (size_t i = 0; i < data.size(); ++i) {
    auto t = store.Tensor(i);
    if (!std::equal(t.begin(), t.end(), data[i].begin(), data[i].end())) {
      return false;
    }
  }
  return true;
}

}  // namespace dcr::testing

#endif  // DCR_TESTS_TESTING_STORE_PAIR_H_
