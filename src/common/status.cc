#include "dcr/status.h"

#include <cstring>

namespace dcr {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid argument";
    case StatusCode::kNotFound:
      return "not found";
    case StatusCode::kCorruption:
      return "corruption";
    case StatusCode::kIOError:
      return "I/O error";
    case StatusCode::kBaseMismatch:
      return "base mismatch";
    case StatusCode::kUnsupported:
      return "unsupported";
    case StatusCode::kResourceExhausted:
      return "resource exhausted";
    case StatusCode::kAborted:
      return "aborted";
    case StatusCode::kInternal:
      return "internal error";
  }
  return "unknown";
}

Status Status::FromErrno(std::string_view msg, int errnum) {
  std::string m(msg);
  m += ": ";
  m += std::strerror(errnum);
  return Status(StatusCode::kIOError, m);
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(StatusCodeName(rep_->code));
  s += ": ";
  s += rep_->message;
  return s;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return Status();
  std::string m(context);
  m += ": ";
  m += rep_->message;
  return Status(rep_->code, m);
}

}  // namespace dcr
