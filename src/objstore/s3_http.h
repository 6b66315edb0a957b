// One S3 request over libcurl, signed with AWS SigV4 and retried with
// backoff (retry.h), over a pool of connections. Not part of the public
// API; libcurl types stay in s3_http.cc.
#ifndef DCR_OBJSTORE_S3_HTTP_H_
#define DCR_OBJSTORE_S3_HTTP_H_

#include <atomic>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "dcr/objstore.h"
#include "dcr/status.h"

namespace dcr::objstore_internal {

struct S3Request {
  const char* method = "GET";  // GET, HEAD, PUT, POST, DELETE
  // The path below the endpoint, already in canonical (percent-encoded)
  // form, e.g. "/bucket/dcr/refits/ab/c/00000001".
  std::string path;
  // The query in canonical form: parameters sorted by name, each
  // "name=value" percent-encoded, joined by '&'; empty for none.
  std::string query;
  std::span<const std::byte> body;
  std::vector<std::string> headers;  // "name: value"
  // CompleteMultipartUpload may answer 200 and an <Error> document; with
  // this set, such an answer is a failure (status 500, retried).
  bool error_may_come_with_200 = false;
};

struct S3Response {
  long status = 0;
  int attempts = 1;  // how many were sent to get this answer
  std::vector<std::byte> body;
  std::map<std::string, std::string> headers;  // names lower-case
  std::string_view text() const {
    return {reinterpret_cast<const char*>(body.data()), body.size()};
  }
};

// Percent-encodes `s` the way SigV4 canonicalizes it: unreserved
// characters (A-Za-z0-9 -_.~) stay, '/' stays iff `keep_slash`, every
// other byte becomes %XX (upper-case hex).
std::string AwsUriEncode(std::string_view s, bool keep_slash);

// Lower-case hex SHA-256 of `data`.
std::string Sha256Hex(std::span<const std::byte> data);

// Unsupported unless the libcurl this process runs with signs S3
// requests correctly: 7.87 or later (older ones sign only host and
// x-amz-date, and ignore a given x-amz-content-sha256).
Status CheckCurlVersion();

class S3Http {
 public:
  S3Http(S3Config config, S3Credentials credentials);
  ~S3Http();
  S3Http(const S3Http&) = delete;
  S3Http& operator=(const S3Http&) = delete;

  // Sends `req`, retrying transport failures and retryable answers
  // (IsRetryableHttp) up to config.max_attempts times. Returns the last
  // answer, whatever its status (the caller maps it to a Status), or
  // IOError when no answer came back at all. `what` names the request in
  // messages ("PUT refits/ab/c/00000001").
  Result<S3Response> Send(const S3Request& req, std::string_view what);

  uint64_t requests() const { return requests_.load(); }
  uint64_t retries() const { return retries_.load(); }
  const S3Config& config() const { return config_; }

 private:
  struct Handle;
  struct HandleDeleter {
    void operator()(Handle* h) const;
  };
  using HandlePtr = std::unique_ptr<Handle, HandleDeleter>;

  // One attempt. A transport failure is an error whose `retryable` says
  // whether another attempt may pass.
  Result<S3Response> Attempt(const S3Request& req, bool* retryable);
  HandlePtr Take();
  void Return(HandlePtr h);

  const S3Config config_;
  const S3Credentials credentials_;
  const std::string sigv4_;  // "aws:amz:<region>:s3"
  Mutex mu_;
  std::vector<HandlePtr> idle_ DCR_GUARDED_BY(mu_);
  std::atomic<uint64_t> requests_{0};
  std::atomic<uint64_t> retries_{0};
};

}  // namespace dcr::objstore_internal

#endif  // DCR_OBJSTORE_S3_HTTP_H_
