// The S3 backend of ObjectStore (dcr/objstore.h): object semantics
// (checksums, multipart, listing, error messages) over S3Http.
#include <algorithm>
#include <atomic>
#include <thread>

#include "common/mutex.h"
#include "dcr/digest.h"
#include "dcr/objstore.h"
#include "fmt/format.h"
#include "objstore/s3_http.h"
#include "objstore/s3_xml.h"

namespace dcr {
namespace {

using objstore_internal::AwsUriEncode;
using objstore_internal::S3Http;
using objstore_internal::S3Request;
using objstore_internal::S3Response;

constexpr std::string_view kChecksumHeader = "x-amz-meta-dcr-xxh3";

// Maps a non-2xx answer to a Status that says what to fix.
Status AnswerError(std::string_view what, const S3Response& r) {
  objstore_internal::S3Error e = objstore_internal::ParseS3Error(r.text());
  std::string detail =
      e.code.empty() ? fmt::format("HTTP {}", r.status)
                     : fmt::format("HTTP {} {}{}{}", r.status, e.code,
                                   e.message.empty() ? "" : ": ", e.message);
  if (r.status == 404) {
    return Status::NotFound(fmt::format("{}: {}", what, detail));
  }
  if (r.status == 401 || r.status == 403) {
    return Status::InvalidArgument(fmt::format(
        "{}: the server refused the request ({}): check the access key id "
        "and secret (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the "
        "credentials file), the bucket's policy, and this host's clock",
        what, detail));
  }
  if (r.attempts > 1) {
    detail += fmt::format(" (gave up after attempt {})", r.attempts);
  }
  return Status::IOError(fmt::format("{}: {}", what, detail));
}

class S3ObjectStore final : public ObjectStore {
 public:
  S3ObjectStore(S3Config config, S3Credentials credentials)
      : http_(std::move(config), std::move(credentials)),
        base_path_("/" + AwsUriEncode(http_.config().bucket, false) + "/" +
                   AwsUriEncode(http_.config().prefix, true)) {}

  Status Put(std::string_view key, std::span<const std::byte> data) override {
    DCR_RETURN_IF_ERROR(ValidateObjectKey(key));
    const std::string checksum =
        fmt::format("{}: {}", kChecksumHeader, Hash128(data).ToHex());
    Status s = data.size() > http_.config().multipart_threshold
                   ? PutMultipart(key, data, checksum)
                   : PutSingle(key, data, checksum);
    if (s.ok()) bytes_up_.fetch_add(data.size(), std::memory_order_relaxed);
    return s;
  }

  Result<std::vector<std::byte>> Get(std::string_view key) override {
    DCR_RETURN_IF_ERROR(ValidateObjectKey(key));
    const std::string what = fmt::format("GET {}", Describe(key));
    S3Request req;
    req.method = "GET";
    req.path = base_path_ + std::string(key);
    DCR_ASSIGN_OR_RETURN(S3Response r, http_.Send(req, what));
    if (r.status != 200) return AnswerError(what, r);
    auto it = r.headers.find(std::string(kChecksumHeader));
    if (it == r.headers.end()) {
      return Status::Corruption(
          fmt::format("{}: the object has no {} header (not written by dcr)",
                      what, kChecksumHeader));
    }
    Result<Digest128> want = Digest128::FromHex(it->second);
    if (!want.ok() || Hash128(r.body) != *want) {
      return Status::Corruption(fmt::format(
          "{}: its {} bytes do not match the checksum written with it "
          "(changed or truncated after upload)",
          what, r.body.size()));
    }
    bytes_down_.fetch_add(r.body.size(), std::memory_order_relaxed);
    return std::move(r.body);
  }

  Status Delete(std::string_view key) override {
    DCR_RETURN_IF_ERROR(ValidateObjectKey(key));
    const std::string what = fmt::format("DELETE {}", Describe(key));
    S3Request req;
    req.method = "DELETE";
    req.path = base_path_ + std::string(key);
    DCR_ASSIGN_OR_RETURN(S3Response r, http_.Send(req, what));
    if (r.status == 404 || (r.status >= 200 && r.status < 300)) {
      return Status::OK();
    }
    return AnswerError(what, r);
  }

  Result<std::vector<std::string>> List(std::string_view prefix) override {
    const S3Config& cfg = http_.config();
    const std::string full = cfg.prefix + std::string(prefix);
    const std::string what = fmt::format("LIST {}", Describe(prefix));
    std::vector<std::string> keys;
    std::string token;
    do {
      S3Request req;
      req.method = "GET";
      req.path = "/" + AwsUriEncode(cfg.bucket, false);
      // Parameters in canonical (sorted) order.
      if (!token.empty()) {
        req.query = "continuation-token=" + AwsUriEncode(token, false) + "&";
      }
      req.query += "list-type=2&prefix=" + AwsUriEncode(full, false);
      DCR_ASSIGN_OR_RETURN(S3Response r, http_.Send(req, what));
      if (r.status != 200) return AnswerError(what, r);
      DCR_ASSIGN_OR_RETURN(objstore_internal::S3ListPage page,
                           objstore_internal::ParseListPage(r.text()));
      for (std::string& k : page.keys) {
        if (k.compare(0, cfg.prefix.size(), cfg.prefix) != 0) continue;
        keys.push_back(k.substr(cfg.prefix.size()));
      }
      token = page.truncated ? page.next_token : "";
    } while (!token.empty());
    std::sort(keys.begin(), keys.end());
    return keys;
  }

  std::string describe() const override {
    const S3Config& cfg = http_.config();
    return fmt::format("s3:{}/{}/{}", cfg.endpoint, cfg.bucket, cfg.prefix);
  }

  ObjectStoreStats stats() const override {
    ObjectStoreStats s;
    s.requests = http_.requests();
    s.retries = http_.retries();
    s.bytes_up = bytes_up_.load(std::memory_order_relaxed);
    s.bytes_down = bytes_down_.load(std::memory_order_relaxed);
    s.multipart_uploads = multipart_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  std::string Describe(std::string_view key) const {
    return fmt::format("{}{}", describe(), key);
  }

  Status PutSingle(std::string_view key, std::span<const std::byte> data,
                   const std::string& checksum) {
    const std::string what = fmt::format("PUT {}", Describe(key));
    S3Request req;
    req.method = "PUT";
    req.path = base_path_ + std::string(key);
    req.body = data;
    req.headers.push_back(checksum);
    DCR_ASSIGN_OR_RETURN(S3Response r, http_.Send(req, what));
    if (r.status != 200) return AnswerError(what, r);
    return Status::OK();
  }

  // CreateMultipartUpload, the parts (up to parallel_parts at once),
  // CompleteMultipartUpload; AbortMultipartUpload if anything fails, so
  // no half-uploaded parts are left to be billed.
  Status PutMultipart(std::string_view key, std::span<const std::byte> data,
                      const std::string& checksum) {
    const S3Config& cfg = http_.config();
    const std::string path = base_path_ + std::string(key);
    const std::string what = fmt::format("multipart PUT {}", Describe(key));
    S3Request create;
    create.method = "POST";
    create.path = path;
    create.query = "uploads=";
    create.headers.push_back(checksum);
    DCR_ASSIGN_OR_RETURN(S3Response cr, http_.Send(create, what));
    if (cr.status != 200) return AnswerError(what, cr);
    DCR_ASSIGN_OR_RETURN(std::string upload_id,
                         objstore_internal::ParseUploadId(cr.text()));
    const std::string id_query = "uploadId=" + AwsUriEncode(upload_id, false);
    multipart_.fetch_add(1, std::memory_order_relaxed);

    const uint64_t part = std::max<uint64_t>(cfg.part_size, 1);
    const size_t parts = static_cast<size_t>((data.size() + part - 1) / part);
    std::vector<std::string> etags(parts);
    std::atomic<size_t> next{0};
    Mutex mu;
    Status first_error;
    auto worker = [&] {
      for (;;) {
        {
          MutexLock lock(&mu);
          if (!first_error.ok()) return;
        }
        size_t i = next.fetch_add(1);
        if (i >= parts) return;
        S3Request up;
        up.method = "PUT";
        up.path = path;
        up.query = fmt::format("partNumber={}&{}", i + 1, id_query);
        up.body = data.subspan(
            i * part, std::min<uint64_t>(part, data.size() - i * part));
        std::string part_what = fmt::format("{} part {}", what, i + 1);
        Result<S3Response> r = http_.Send(up, part_what);
        Status s = !r.ok()            ? r.status()
                   : r->status != 200 ? AnswerError(part_what, *r)
                                      : Status::OK();
        if (s.ok()) {
          auto it = r->headers.find("etag");
          if (it == r->headers.end() || it->second.empty()) {
            s = Status::Corruption(fmt::format(
                "{}: the server answered without an ETag", part_what));
          } else {
            etags[i] = it->second;
          }
        }
        if (!s.ok()) {
          MutexLock lock(&mu);
          if (first_error.ok()) first_error = std::move(s);
          return;
        }
      }
    };
    const size_t threads = std::min<size_t>(
        parts, static_cast<size_t>(std::max(cfg.parallel_parts, 1)));
    std::vector<std::thread> pool;
    for (size_t t = 1; t < threads; ++t) pool.emplace_back(worker);
    worker();
    for (std::thread& t : pool) t.join();

    Status s;
    {
      MutexLock lock(&mu);
      s = first_error;
    }
    if (s.ok()) {
      const std::string body = objstore_internal::CompleteMultipartBody(etags);
      S3Request done;
      done.method = "POST";
      done.path = path;
      done.query = id_query;
      done.body = std::as_bytes(std::span(body.data(), body.size()));
      done.headers.push_back("Content-Type: application/xml");
      done.error_may_come_with_200 = true;
      Result<S3Response> r = http_.Send(done, what + " (complete)");
      if (!r.ok()) {
        s = r.status();
      } else if (r->status != 200 && r->attempts > 1 &&
                 HasChecksum(path, checksum)) {
        // An earlier attempt completed the upload and its answer was lost;
        // the retries found no upload (S3: 404 NoSuchUpload; s3rver: 500).
        s = Status::OK();
      } else if (r->status != 200) {
        s = AnswerError(what + " (complete)", *r);
      }
    }
    if (!s.ok()) {
      S3Request abort;
      abort.method = "DELETE";
      abort.path = path;
      abort.query = id_query;
      (void)http_.Send(abort, what + " (abort)");
    }
    return s;
  }

  // Whether the object at `path` exists with the checksum header line
  // `checksum` ("x-amz-meta-dcr-xxh3: <hex>").
  bool HasChecksum(const std::string& path, const std::string& checksum) {
    S3Request head;
    head.method = "HEAD";
    head.path = path;
    Result<S3Response> r = http_.Send(head, "HEAD " + path);
    if (!r.ok() || r->status != 200) return false;
    auto it = r->headers.find(std::string(kChecksumHeader));
    return it != r->headers.end() &&
           checksum == fmt::format("{}: {}", kChecksumHeader, it->second);
  }

  S3Http http_;
  const std::string base_path_;
  std::atomic<uint64_t> bytes_up_{0};
  std::atomic<uint64_t> bytes_down_{0};
  std::atomic<uint64_t> multipart_{0};
};

Status CheckPrefix(std::string_view prefix) {
  if (prefix.empty()) return Status::OK();
  if (prefix.back() != '/') {
    return Status::InvalidArgument(fmt::format(
        "the S3 prefix '{}' must end in '/' (e.g. '{}/')", prefix, prefix));
  }
  Status s = ValidateObjectKey(prefix.substr(0, prefix.size() - 1));
  if (!s.ok()) {
    return Status::InvalidArgument(
        fmt::format("the S3 prefix '{}' may hold only [A-Za-z0-9._-] "
                    "segments separated by '/'",
                    prefix));
  }
  return Status::OK();
}

}  // namespace

Result<std::unique_ptr<ObjectStore>> OpenS3ObjectStore(
    const S3Config& config, const S3Credentials& credentials) {
  S3Config cfg = config;
  while (!cfg.endpoint.empty() && cfg.endpoint.back() == '/') {
    cfg.endpoint.pop_back();
  }
  if (cfg.endpoint.rfind("http://", 0) != 0 &&
      cfg.endpoint.rfind("https://", 0) != 0) {
    return Status::InvalidArgument(fmt::format(
        "the S3 endpoint '{}' must start with http:// or https:// (e.g. "
        "https://s3.{}.amazonaws.com)",
        cfg.endpoint, cfg.region.empty() ? "us-east-1" : cfg.region));
  }
  if (cfg.bucket.empty() || cfg.bucket.size() > 63 ||
      !ValidateObjectKey(cfg.bucket).ok() ||
      cfg.bucket.find('/') != std::string::npos) {
    return Status::InvalidArgument(fmt::format(
        "'{}' is not a bucket name (3-63 characters of a-z, 0-9, '.', '-')",
        cfg.bucket));
  }
  if (cfg.region.empty()) {
    return Status::InvalidArgument("the S3 region is empty (e.g. us-east-1)");
  }
  DCR_RETURN_IF_ERROR(CheckPrefix(cfg.prefix));
  if (cfg.max_attempts < 1 || cfg.parallel_parts < 1 || cfg.part_size == 0) {
    return Status::InvalidArgument(
        "S3 max_attempts, parallel_parts and part_size must be positive");
  }
  DCR_RETURN_IF_ERROR(objstore_internal::CheckCurlVersion());
  if (credentials.access_key_id.empty() ||
      credentials.secret_access_key.empty()) {
    return Status::InvalidArgument("the S3 credentials are empty");
  }
  return std::unique_ptr<ObjectStore>(new S3ObjectStore(cfg, credentials));
}

}  // namespace dcr
