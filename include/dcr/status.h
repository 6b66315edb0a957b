// Status and Result<T>: how every fallible dcr function reports failure.
//
// dcr does not throw across its API. A function that can fail returns a
// Status (or a Result<T> holding either a value or a non-OK Status). An OK
// Status costs one byte and allocates nothing; the message of an error names
// what was wrong and where (file, tensor, chunk, peer).
//
// Thread safety: Status and Result are values; distinct objects may be used
// from distinct threads without synchronization.
#ifndef DCR_STATUS_H_
#define DCR_STATUS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace dcr {

enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument,    // the caller asked for something malformed
  kNotFound,           // a named file, tensor or node does not exist
  kCorruption,         // stored or received bytes failed validation
  kIOError,            // the operating system refused an operation
  kBaseMismatch,       // a delta does not apply to the bits it was given
  kUnsupported,        // valid, but this build or format version cannot do it
  kResourceExhausted,  // a configured bound would be exceeded
  kAborted,            // an operation was cancelled or rolled back
  kInternal,           // a dcr bug: an invariant did not hold
};

// Returns the lower-case name of `code`, e.g. "corruption".
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  // An OK status.
  Status() = default;

  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string_view msg) {
    return Status(StatusCode::kInvalidArgument, msg);
  }
  static Status NotFound(std::string_view msg) {
    return Status(StatusCode::kNotFound, msg);
  }
  static Status Corruption(std::string_view msg) {
    return Status(StatusCode::kCorruption, msg);
  }
  static Status IOError(std::string_view msg) {
    return Status(StatusCode::kIOError, msg);
  }
  // An I/O error that appends strerror(errnum) to `msg`.
  static Status FromErrno(std::string_view msg, int errnum);
  static Status BaseMismatch(std::string_view msg) {
    return Status(StatusCode::kBaseMismatch, msg);
  }
  static Status Unsupported(std::string_view msg) {
    return Status(StatusCode::kUnsupported, msg);
  }
  static Status ResourceExhausted(std::string_view msg) {
    return Status(StatusCode::kResourceExhausted, msg);
  }
  static Status Aborted(std::string_view msg) {
    return Status(StatusCode::kAborted, msg);
  }
  static Status Internal(std::string_view msg) {
    return Status(StatusCode::kInternal, msg);
  }

  // Returns true iff the status indicates success.
  bool ok() const { return rep_ == nullptr; }
  StatusCode code() const { return rep_ ? rep_->code : StatusCode::kOk; }
  // The message without the code name; empty when OK.
  std::string_view message() const {
    return rep_ ? std::string_view(rep_->message) : std::string_view();
  }
  // "OK" or "<code name>: <message>".
  std::string ToString() const;

  // Returns a status with the same code whose message is
  // "<context>: <message>". OK stays OK.
  Status WithContext(std::string_view context) const;

  bool IsCorruption() const { return code() == StatusCode::kCorruption; }
  bool IsNotFound() const { return code() == StatusCode::kNotFound; }
  bool IsBaseMismatch() const { return code() == StatusCode::kBaseMismatch; }
  bool IsInvalidArgument() const {
    return code() == StatusCode::kInvalidArgument;
  }

  Status(const Status& other)
      : rep_(other.rep_ ? std::make_unique<Rep>(*other.rep_) : nullptr) {}
  Status& operator=(const Status& other) {
    if (this != &other) {
      rep_ = other.rep_ ? std::make_unique<Rep>(*other.rep_) : nullptr;
    }
    return *this;
  }
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;

 private:
  struct Rep {
    StatusCode code;
    std::string message;
  };
  Status(StatusCode code, std::string_view msg)
      : rep_(std::make_unique<Rep>(Rep{code, std::string(msg)})) {}

  std::unique_ptr<Rep> rep_;
};

// Either a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    if (std::get<Status>(v_).ok()) {
      v_ = Status::Internal("Result constructed from an OK Status");
    }
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  // The error; OK when a value is held.
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }

  // Requires ok().
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace dcr

#define DCR_STATUS_CONCAT_INNER_(a, b) a##b
#define DCR_STATUS_CONCAT_(a, b) DCR_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (a Status) is not OK.
#define DCR_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::dcr::Status dcr_status_ = (expr);        \
    if (!dcr_status_.ok()) return dcr_status_; \
  } while (0)

// Evaluates `rexpr` (a Result<T>); on error returns its Status, else moves
// the value into `lhs` (a declaration or an lvalue).
#define DCR_ASSIGN_OR_RETURN(lhs, rexpr)                                     \
  DCR_ASSIGN_OR_RETURN_IMPL_(DCR_STATUS_CONCAT_(dcr_result_, __LINE__), lhs, \
                             rexpr)
#define DCR_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                               \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()

#endif  // DCR_STATUS_H_
