#include "objstore/s3_http.h"

#include <curl/curl.h>
#include <openssl/evp.h>
#include <strings.h>

#include <algorithm>
#include <cctype>
#include <random>
#include <thread>

#include "common/log.h"
#include "fmt/format.h"
#include "objstore/retry.h"
#include "objstore/s3_xml.h"

namespace dcr::objstore_internal {
namespace {

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// Transport failures another attempt may get past.
bool RetryableCurl(CURLcode c) {
  switch (c) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return true;
    default:
      return false;
  }
}

double UnitRandom() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng);
}

size_t OnBody(char* p, size_t size, size_t n, void* user) {
  auto* body = static_cast<std::vector<std::byte>*>(user);
  const auto* b = reinterpret_cast<const std::byte*>(p);
  body->insert(body->end(), b, b + size * n);
  return size * n;
}

size_t OnHeader(char* p, size_t size, size_t n, void* user) {
  auto* headers = static_cast<std::map<std::string, std::string>*>(user);
  std::string_view line(p, size * n);
  size_t colon = line.find(':');
  if (colon != std::string_view::npos) {
    std::string name(line.substr(0, colon));
    for (char& c : name) c = static_cast<char>(std::tolower(c));
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) {
      value.remove_prefix(1);
    }
    while (!value.empty() && (value.back() == '\r' || value.back() == '\n' ||
                              value.back() == ' ')) {
      value.remove_suffix(1);
    }
    (*headers)[std::move(name)] = std::string(value);
  } else if (line.rfind("HTTP/", 0) == 0) {
    headers->clear();  // a new response (after "100 Continue")
  }
  return size * n;
}

struct SlistDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};

}  // namespace

struct S3Http::Handle {
  CURL* curl = nullptr;
};

void S3Http::HandleDeleter::operator()(Handle* h) const {
  if (h->curl != nullptr) curl_easy_cleanup(h->curl);
  delete h;
}

std::string AwsUriEncode(std::string_view s, bool keep_slash) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

std::string Sha256Hex(std::span<const std::byte> data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr);
  std::string out;
  out.reserve(2 * len);
  for (unsigned int i = 0; i < len; ++i) out += fmt::format("{:02x}", md[i]);
  return out;
}

Status CheckCurlVersion() {
  GlobalInit();
  const curl_version_info_data* v = curl_version_info(CURLVERSION_NOW);
  if (v->version_num < 0x075700) {
    return Status::Unsupported(fmt::format(
        "libcurl {} cannot sign S3 requests correctly; the S3 object store "
        "needs 7.87 or later",
        v->version));
  }
  return Status::OK();
}

S3Http::S3Http(S3Config config, S3Credentials credentials)
    : config_(std::move(config)),
      credentials_(std::move(credentials)),
      sigv4_(fmt::format("aws:amz:{}:s3", config_.region)) {
  GlobalInit();
}

S3Http::~S3Http() = default;

S3Http::HandlePtr S3Http::Take() {
  {
    MutexLock lock(&mu_);
    if (!idle_.empty()) {
      HandlePtr h = std::move(idle_.back());
      idle_.pop_back();
      return h;
    }
  }
  HandlePtr h(new Handle);
  h->curl = curl_easy_init();
  return h;
}

void S3Http::Return(HandlePtr h) {
  MutexLock lock(&mu_);
  idle_.push_back(std::move(h));
}

Result<S3Response> S3Http::Attempt(const S3Request& req, bool* retryable) {
  *retryable = false;
  HandlePtr h = Take();
  if (h->curl == nullptr) return Status::Internal("curl_easy_init failed");
  CURL* c = h->curl;
  curl_easy_reset(c);  // keeps the connection cache
  std::string url = config_.endpoint + req.path;
  if (!req.query.empty()) url += "?" + req.query;

  std::unique_ptr<curl_slist, SlistDeleter> headers;
  auto add = [&](const std::string& line) {
    headers.reset(curl_slist_append(headers.release(), line.c_str()));
  };
  add("x-amz-content-sha256: " + Sha256Hex(req.body));
  if (!credentials_.session_token.empty()) {
    add("x-amz-security-token: " + credentials_.session_token);
  }
  for (const std::string& line : req.headers) add(line);
  const std::string_view method(req.method);
  if (method == "PUT" || method == "POST") {
    bool typed = false;
    for (const std::string& line : req.headers) {
      typed = typed || (line.size() >= 13 &&
                        strncasecmp(line.c_str(), "content-type:", 13) == 0);
    }
    if (!typed) add("Content-Type: application/octet-stream");
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE,
                     static_cast<curl_off_t>(req.body.size()));
    curl_easy_setopt(
        c, CURLOPT_POSTFIELDS,
        req.body.empty() ? "" : reinterpret_cast<const char*>(req.body.data()));
    if (method == "PUT") curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, "PUT");
  } else if (method == "HEAD") {
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  } else if (method == "DELETE") {
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, "DELETE");
  } else {
    curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
  }
  S3Response resp;
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers.get());
  curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sigv4_.c_str());
  curl_easy_setopt(c, CURLOPT_USERNAME, credentials_.access_key_id.c_str());
  curl_easy_setopt(c, CURLOPT_PASSWORD, credentials_.secret_access_key.c_str());
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(config_.connect_timeout.count()));
  // A transfer is cut when it moves under 1 KiB/s for stall_timeout, not
  // after a fixed time: a large object over a slow link may take long.
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME,
                   static_cast<long>(std::max<int64_t>(
                       1, (config_.stall_timeout.count() + 999) / 1000)));
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &OnBody);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &resp.body);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, &OnHeader);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &resp.headers);
  requests_.fetch_add(1, std::memory_order_relaxed);
  CURLcode rc = curl_easy_perform(c);
  if (rc != CURLE_OK) {
    *retryable = RetryableCurl(rc);
    // A connection in an unknown state is not reused.
    return Status::IOError(fmt::format("{}{}: {}", config_.endpoint, req.path,
                                       curl_easy_strerror(rc)));
  }
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &resp.status);
  Return(std::move(h));
  if (resp.status == 200 && req.error_may_come_with_200 &&
      IsS3ErrorDocument(resp.text())) {
    resp.status = 500;  // what AWS means by it: retry
  }
  if (resp.status >= 300) {
    *retryable = IsRetryableHttp(resp.status, ParseS3Error(resp.text()).code);
  }
  return resp;
}

Result<S3Response> S3Http::Send(const S3Request& req, std::string_view what) {
  for (int attempt = 1;; ++attempt) {
    bool retryable = false;
    Result<S3Response> r = Attempt(req, &retryable);
    if (!retryable || attempt >= config_.max_attempts) {
      if (r.ok()) r->attempts = attempt;
      if (!r.ok()) {
        return r.status().WithContext(fmt::format(
            "{} (attempt {} of {})", what, attempt, config_.max_attempts));
      }
      return r;
    }
    std::string why = r.ok() ? fmt::format("HTTP {}", r->status)
                             : std::string(r.status().message());
    auto delay = BackoffDelay(attempt, config_.retry_base, config_.retry_cap,
                              UnitRandom());
    spdlog::debug("objstore: {} failed ({}); attempt {} of {} in {} ms", what,
                  why, attempt + 1, config_.max_attempts, delay.count());
    retries_.fetch_add(1, std::memory_order_relaxed);
    std::this_thread::sleep_for(delay);
  }
}

}  // namespace dcr::objstore_internal
