// Serving stores for tests (include/dcr/serving.h): two committed shm
// images made in one call, and everything a serving store leaves in
// /dev/shm removed in another.
#ifndef DCR_TESTS_TESTING_SERVING_IMAGES_TESTING_H_
#define DCR_TESTS_TESTING_SERVING_IMAGES_TESTING_H_

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>

#include "dcr/serving.h"
#include "dcr/store.h"

namespace dcr::testing {

// A shm store spec no other test (or run) uses: "/<prefix>_<pid>_<n>".
inline StoreSpec UniqueShmSpec(const std::string& prefix) {
  static std::atomic<int> n{0};
  StoreSpec spec;
  spec.kind = StoreSpec::Kind::kShm;
  spec.path = "/" + prefix + "_" + std::to_string(::getpid()) + "_" +
              std::to_string(n++);
  return spec;
}

// Removes both images of `spec`, their reader locks and the live header;
// missing ones are fine.
inline void RemoveServingStore(const StoreSpec& spec) {
  for (uint32_t i = 0; i < 2; ++i) {
    (void)RemoveStore(ServingImageSpec(spec, i));
    ::shm_unlink((spec.path + "." + std::to_string(i) + ".readers").c_str());
  }
  (void)LiveHeader::Remove(LiveHeaderName(spec));
}

// Both images of `spec`, each holding `manifest`'s tensors with every byte
// of image i set to 0x10 * (i + 1), committed at step i + 1 (digest
// {i, i}). No live header.
inline Status CreateServingImages(const StoreSpec& spec,
                                  const Manifest& manifest) {
  for (uint32_t i = 0; i < 2; ++i) {
    DCR_ASSIGN_OR_RETURN(std::unique_ptr<WeightStore> s,
                         CreateStore(ServingImageSpec(spec, i), manifest));
    for (size_t t = 0; t < manifest.size(); ++t) {
      std::span<std::byte> bytes = s->MutableTensor(t);
      std::memset(bytes.data(), 0x10 * (i + 1), bytes.size());
    }
    DCR_RETURN_IF_ERROR(s->Commit(Version{i + 1, {i, i}}, RefitId{}));
  }
  return Status::OK();
}

}  // namespace dcr::testing

#endif  // DCR_TESTS_TESTING_SERVING_IMAGES_TESTING_H_
