// Cleanup: runs a callable when it goes out of scope, unless Cancel() was
// called first. For undoing a half-made thing on every error path (a
// temporary file, a shared-memory object being created) and keeping it
// once the last step succeeded:
//
//   Cleanup unlink([&] { ::unlink(tmp.c_str()); });
//   DCR_RETURN_IF_ERROR(WriteAll(fd, data));  // error: tmp is removed
//   unlink.Cancel();                           // success: tmp stays
//
// Thread safety: none; a scope's local.
#ifndef DCR_COMMON_CLEANUP_H_
#define DCR_COMMON_CLEANUP_H_

#include <utility>

namespace dcr {

template <typename F>
class [[nodiscard]] Cleanup {
 public:
  explicit Cleanup(F f) : f_(std::move(f)) {}
  ~Cleanup() {
    if (armed_) f_();
  }
  Cleanup(const Cleanup&) = delete;
  Cleanup& operator=(const Cleanup&) = delete;

  // The callable will not run.
  void Cancel() { armed_ = false; }

 private:
  F f_;
  bool armed_ = true;
};

}  // namespace dcr

#endif  // DCR_COMMON_CLEANUP_H_
