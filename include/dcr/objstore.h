// Object stores: where a refit's chunks wait for the cluster heads that
// pull them, instead of receiving them over a relay link (DESIGN.md §3
// "objstore").
//
// An ObjectStore holds immutable objects named by keys relative to the
// store's own prefix, e.g. "refits/0a1b.../c/00000017". Keys use only
// [A-Za-z0-9._-] and '/' between non-empty segments, none of them "." or
// ".."; anything else is refused with InvalidArgument, so a key never needs
// escaping in a path or a URL. Backends:
//
//   dir     a directory (a shared filesystem; the embedded default, no
//           server needed). An object is a file "<root>/<key>" written to a
//           temporary name, fsynced and renamed into place: a reader sees
//           the whole object or none. Temporary files ("*.dcr-tmp-*") are
//           never listed.
//   s3      a bucket of an S3-compatible server over HTTP(S), path-style
//           ("<endpoint>/<bucket>/<prefix><key>"), signed with AWS SigV4.
//           Objects above S3Config::multipart_threshold go up as multipart
//           uploads (parts in parallel); requests that fail in a way that
//           may pass (5xx, throttling, timeouts, refused or reset
//           connections) are retried with exponential backoff and full
//           jitter, up to S3Config::max_attempts.
//
// Integrity: Put() records an XXH3-128 of the object's bytes with the
// object (dir: a 32-byte trailer, docs/FORMAT.md §"Objects"; s3: the
// metadata header "x-amz-meta-dcr-xxh3", and the body's SHA-256 in
// "x-amz-content-sha256", which the server checks on upload). Get()
// recomputes it: an object that changed after upload, a truncated one or
// one that dcr did not write is Corruption, never returned.
//
// Errors: NotFound for a missing object (or bucket), PermissionDenied-like
// refusals (wrong key, bad signature, no access) as InvalidArgument whose
// message says which credential to check, IOError for what retries could
// not overcome (naming the request, the HTTP status and the server's error
// code).
//
// Multipart uploads: a failed upload is aborted. One whose creation was
// answered but the answer lost is never seen, so never aborted: give the
// bucket a lifecycle rule that aborts incomplete multipart uploads (e.g.
// after one day), as AWS advises. A completion whose answer was lost and
// whose retry finds the upload gone is checked against the object's
// checksum, so a Put that took effect reports success.
//
// Thread safety: every method may be called concurrently from any number
// of threads; a caller that wants N requests in flight uses N threads. An
// S3 store keeps its idle connections for reuse: as many as requests were
// ever in flight at once. A multipart Put runs parallel_parts - 1 threads
// of its own while it uploads.
#ifndef DCR_OBJSTORE_H_
#define DCR_OBJSTORE_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/status.h"

namespace dcr {

// Counters since the store was opened; each is monotonic.
struct ObjectStoreStats {
  uint64_t requests = 0;    // requests sent (every attempt counts)
  uint64_t retries = 0;     // attempts after a retryable failure
  uint64_t bytes_up = 0;    // object bytes written (Put)
  uint64_t bytes_down = 0;  // object bytes read (Get)
  uint64_t multipart_uploads = 0;
};

class ObjectStore {
 public:
  virtual ~ObjectStore() = default;

  // Writes `data` as the object `key`, replacing any object of that name.
  virtual Status Put(std::string_view key, std::span<const std::byte> data) = 0;
  // Reads the object `key` whole and checks its checksum.
  virtual Result<std::vector<std::byte>> Get(std::string_view key) = 0;
  // Removes the object `key`; a missing object is not an error.
  virtual Status Delete(std::string_view key) = 0;
  // The keys that begin with `prefix` (a key prefix, not only a folder),
  // sorted. For maintenance (`dcr gc`), not for the data path: an S3 LIST
  // costs a request per 1,000 keys and may lag behind recent writes.
  virtual Result<std::vector<std::string>> List(std::string_view prefix) = 0;
  // Removes what writes that never finished left under `prefix` (a writer
  // that died mid-Put) and returns how many it removed. Call it only when
  // no write under `prefix` is in progress. dir: the temporary files; s3:
  // nothing (an incomplete multipart upload is the bucket lifecycle
  // rule's, see above).
  virtual Result<uint64_t> RemoveUnfinished(std::string_view prefix) {
    (void)prefix;
    return uint64_t{0};
  }

  // "dir:/mnt/shared/dcr" or "s3:http://host:port/bucket/prefix", for
  // messages. Never contains a credential.
  virtual std::string describe() const = 0;
  virtual ObjectStoreStats stats() const = 0;
};

// Returns OK iff `key` is a valid object key (see above); the message of
// an error names the key and what is wrong with it.
Status ValidateObjectKey(std::string_view key);

// Opens (creating it if needed) the directory `root` as an object store.
Result<std::unique_ptr<ObjectStore>> OpenDirObjectStore(
    const std::string& root);

// An access key. Never logged; describe() never shows it.
struct S3Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // empty unless temporary credentials
};

struct S3Config {
  // "http://127.0.0.1:4568" or "https://s3.eu-west-1.amazonaws.com".
  std::string endpoint;
  std::string region = "us-east-1";
  std::string bucket;
  // Prepended to every key; empty or ending in '/', e.g. "dcr/prod/".
  std::string prefix;
  // An AWS shared-credentials file ("[profile]" sections with
  // aws_access_key_id, aws_secret_access_key, aws_session_token). Empty:
  // the environment's AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
  // AWS_SESSION_TOKEN.
  std::string credentials_file;
  std::string profile = "default";

  // Objects of more than multipart_threshold bytes go up in parts of
  // part_size bytes (S3 refuses parts under 5 MiB except the last, so
  // lower both only against a test server), up to parallel_parts at once.
  uint64_t multipart_threshold = uint64_t{8} << 20;
  uint64_t part_size = uint64_t{8} << 20;
  int parallel_parts = 4;

  // Retries: attempt n (n >= 1) waits a uniformly random time in
  // [0, min(retry_cap, retry_base * 2^(n-1))] before it is sent.
  int max_attempts = 6;
  std::chrono::milliseconds retry_base{100};
  std::chrono::milliseconds retry_cap{5000};
  std::chrono::milliseconds connect_timeout{5000};
  // An attempt whose transfer moves under 1 KiB/s for this long (rounded
  // up to seconds) fails and is retried; there is no limit on a transfer
  // that keeps moving.
  std::chrono::milliseconds stall_timeout{30000};
};

// Parses an AWS shared-credentials file's text and returns `profile`'s
// keys. The error names the line that is wrong (never its value) or the
// profile or key that is missing.
Result<S3Credentials> ParseS3Credentials(std::string_view text,
                                         std::string_view profile);
// The credentials `config` names: its credentials_file's profile, or the
// environment. The error says which variable or file to fix.
Result<S3Credentials> LoadS3Credentials(const S3Config& config);

// Opens the bucket `config` names. Checks the configuration and the
// credentials' presence, not the server: the first request does that.
Result<std::unique_ptr<ObjectStore>> OpenS3ObjectStore(
    const S3Config& config, const S3Credentials& credentials);

struct ObjectStoreSpec;  // dcr/topology.h

// How hard one request of an S3 store tries (S3Config's fields of the same
// names). A caller that retries by itself (a head's puller, which polls)
// wants one attempt and a short stall limit, so that it stops quickly.
struct ObjectRequestLimits {
  int max_attempts = 6;
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds stall_timeout{30000};
};

// Opens the object store a topology's objstore: section names; S3
// credentials from its credentials_file, else the environment.
Result<std::unique_ptr<ObjectStore>> OpenObjectStore(
    const ObjectStoreSpec& spec, const ObjectRequestLimits& limits = {});

// The key of object `ordinal` (0, 1, ...) of refit `refit_hex`'s frame
// sequence: "refits/<refit_hex>/f/<ordinal, 10 digits>" (docs/PROTOCOL.md
// §"Chunks through an object store").
std::string RefitObjectKey(std::string_view refit_hex, uint64_t ordinal);
// The prefix of every object of refit `refit_hex`: "refits/<refit_hex>/".
std::string RefitObjectPrefix(std::string_view refit_hex);

}  // namespace dcr

#endif  // DCR_OBJSTORE_H_
