// Reading and writing refit message payloads (protocol/messages.h's
// conventions): little-endian fixed-width integers, LEB128 varints,
// strings as a varint length and bytes, digests high then low, versions
// as step then digest. Internal to src/protocol.
//
// Thread safety: values and pure functions.
#ifndef DCR_PROTOCOL_MESSAGE_IO_H_
#define DCR_PROTOCOL_MESSAGE_IO_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/bytes.h"
#include "dcr/digest.h"
#include "dcr/status.h"
#include "dcr/version.h"
#include "protocol/messages.h"

namespace dcr::message_io {

// Every payload's first byte; messages with later versions name theirs.
inline constexpr uint8_t kMessageVersion = 1;

inline void PutString(ByteWriter* w, std::string_view s) {
  w->PutVarint(s.size());
  w->PutBytes(std::as_bytes(std::span<const char>(s.data(), s.size())));
}
inline void PutDigest(ByteWriter* w, const Digest128& d) {
  w->Put<uint64_t>(d.high);
  w->Put<uint64_t>(d.low);
}
inline void PutVersion(ByteWriter* w, const Version& v) {
  w->Put<uint64_t>(v.step);
  PutDigest(w, v.digest);
}

// Reads fields in order; the first failure is remembered with the name of
// the field that failed, and later reads are no-ops.
class Reader {
 public:
  // Accepts message versions 1 to `max_version`.
  Reader(std::span<const std::byte> b, const char* message,
         uint8_t max_version = kMessageVersion)
      : r_(b), message_(message) {
    if (!r_.Get(&version_)) {
      Fail("version", "empty payload");
    } else if (version_ < kMessageVersion || version_ > max_version) {
      Fail("version", "unknown message version " + std::to_string(version_));
    }
  }
  uint8_t version() const { return version_; }
  template <typename T>
  T Get(const char* field) {
    T v{};
    if (ok() && !r_.Get(&v)) Fail(field, "truncated");
    return v;
  }
  uint64_t Varint(const char* field, uint64_t max) {
    uint64_t v = 0;
    if (!ok()) return 0;
    if (!r_.GetVarint(&v)) {
      Fail(field, "truncated");
    } else if (v > max) {
      Fail(field, std::to_string(v) + " exceeds " + std::to_string(max));
    }
    return ok() ? v : 0;
  }
  // `n` bytes of the payload, not copied (valid as long as it is).
  std::span<const std::byte> View(const char* field, uint64_t n) {
    std::span<const std::byte> b;
    if (ok() && !r_.GetBytes(n, &b)) Fail(field, "truncated");
    return ok() ? b : std::span<const std::byte>();
  }
  // Exactly `n` bytes, checked against what is left before copying.
  std::vector<std::byte> Bytes(const char* field, uint64_t n) {
    std::span<const std::byte> b;
    if (ok() && !r_.GetBytes(n, &b)) Fail(field, "truncated");
    if (!ok()) return {};
    return std::vector<std::byte>(b.begin(), b.end());
  }
  std::string String(const char* field) {
    uint64_t n = Varint(field, kMaxMessageString);
    std::span<const std::byte> b;
    if (ok() && !r_.GetBytes(n, &b)) Fail(field, "truncated");
    if (!ok()) return {};
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  }
  Digest128 Digest(const char* field) {
    Digest128 d;
    d.high = Get<uint64_t>(field);
    d.low = Get<uint64_t>(field);
    return d;
  }
  Version Ver(const char* field) {
    Version v;
    v.step = Get<uint64_t>(field);
    v.digest = Digest(field);
    return v;
  }
  void Fail(const std::string& field, const std::string& why) {
    if (status_.ok()) {
      status_ =
          Status::Corruption(std::string(message_) + "." + field + ": " + why);
    }
  }
  bool ok() const { return status_.ok(); }
  // The final status: also fails on trailing bytes.
  Status Finish() {
    if (ok() && r_.remaining() != 0) {
      Fail("end", std::to_string(r_.remaining()) + " trailing bytes");
    }
    return status_;
  }

 private:
  ByteReader r_;
  const char* message_;
  uint8_t version_ = 0;
  Status status_;
};

}  // namespace dcr::message_io

#endif  // DCR_PROTOCOL_MESSAGE_IO_H_
