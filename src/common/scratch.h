// Scratch buffers that grow without being zeroed.
//
// std::vector<T>::resize value-initializes the new elements: for the
// codec's scratch (a span's changed positions and value planes, sized for
// every element of the span, and compressors' output bounds) that is a
// memset of the whole capacity, and on first use a page fault for every
// page of it, although a chunk at a few percent change writes a small
// part. A ScratchVector's resize default-initializes instead: for the
// trivial types used here it writes nothing, so only the pages the code
// writes are ever touched. Measured on the testbed's root (`dcr refit` is
// a new process per refit; 2 encoder threads, 99 MB model at 5%): each
// thread's first 2 MB spans took 0.03 s to encode, 6 times the later
// ones, half of it in that memset and its page faults (perf); with
// ScratchVector 0.012 s, so the stream's first chunk leaves 0.02 s
// earlier.
//
// Contract: an element the caller did not write holds an unspecified
// value. Every user writes what it reads (as it must anyway: Reserve
// keeps the previous contents when the buffer is reused).
#ifndef DCR_COMMON_SCRATCH_H_
#define DCR_COMMON_SCRATCH_H_

#include <cstddef>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace dcr {

template <typename T>
class DefaultInitAllocator : public std::allocator<T> {
 public:
  static_assert(std::is_trivially_default_constructible_v<T>,
                "scratch elements must need no construction");
  DefaultInitAllocator() noexcept = default;
  template <typename U>
  DefaultInitAllocator(const DefaultInitAllocator<U>& /*other*/) noexcept {}
  template <typename U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  // resize(n): default-initialization, which for T leaves it as it is.
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

template <typename T>
using ScratchVector = std::vector<T, DefaultInitAllocator<T>>;

// Grows `v` to at least n elements without shrinking (scratch reuse).
template <typename T, typename A>
T* Reserve(std::vector<T, A>* v, size_t n) {
  if (v->size() < n) v->resize(n);
  return v->data();
}

}  // namespace dcr

#endif  // DCR_COMMON_SCRATCH_H_
