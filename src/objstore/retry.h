// When an S3 request is sent again, and after how long. Pure functions,
// table-tested (tests/unit/objstore/retry_test.cc).
#ifndef DCR_OBJSTORE_RETRY_H_
#define DCR_OBJSTORE_RETRY_H_

#include <chrono>
#include <string_view>

namespace dcr::objstore_internal {

// Whether a request answered with HTTP `status` and S3 error code `code`
// (possibly empty) may succeed if sent again unchanged: 5xx, 429, and the
// 4xx codes S3 uses for throttling and for a connection that was too slow
// ("SlowDown", "Throttling", "RequestTimeout", ...). Never 403 or 404:
// credentials and missing objects do not heal by waiting (a head that
// waits for an object to appear retries at its own level).
bool IsRetryableHttp(long status, std::string_view code);

// The wait before retry number `retry` (1 for the second attempt):
// `unit` (uniform in [0, 1)) times min(cap, base * 2^(retry-1)), i.e.
// exponential backoff with full jitter, so that many heads throttled at
// once do not come back in step.
std::chrono::milliseconds BackoffDelay(int retry,
                                       std::chrono::milliseconds base,
                                       std::chrono::milliseconds cap,
                                       double unit);

}  // namespace dcr::objstore_internal

#endif  // DCR_OBJSTORE_RETRY_H_
