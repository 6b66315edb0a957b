// A WeightStore that forwards to another one (which must outlive it), for
// tests that wrap a store to slow, gate, count or fail its writes. The
// wrapper keeps its own version record, in memory (a copy of the inner
// store's at construction).
#ifndef DCR_TESTS_TESTING_FORWARDING_STORE_H_
#define DCR_TESTS_TESTING_FORWARDING_STORE_H_

#include <cstddef>
#include <span>
#include <string>
#include <utility>

#include "dcr/store.h"

namespace dcr::testing {

class ForwardingStore : public WeightStore {
 public:
  ForwardingStore(std::string describe, WeightStore* inner)
      : WeightStore(std::move(describe), "", inner->record()), inner_(inner) {}
  const Manifest& manifest() const override { return inner_->manifest(); }
  std::span<const std::byte> Tensor(size_t i) const override {
    return inner_->Tensor(i);
  }
  std::span<std::byte> MutableTensor(size_t i) override {
    return inner_->MutableTensor(i);
  }

 protected:
  Status SyncData(size_t) override { return Status::OK(); }
  WeightStore* inner() const { return inner_; }

 private:
  WeightStore* inner_;
};

}  // namespace dcr::testing

#endif  // DCR_TESTS_TESTING_FORWARDING_STORE_H_
