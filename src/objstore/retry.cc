#include "objstore/retry.h"

#include <algorithm>
#include <cmath>

namespace dcr::objstore_internal {

bool IsRetryableHttp(long status, std::string_view code) {
  if (status >= 500 && status <= 599) {
    return status != 501;  // NotImplemented will not change
  }
  if (status == 429) return true;
  if (status == 400 || status == 503) {
    return code == "RequestTimeout" || code == "SlowDown" ||
           code == "Throttling" || code == "ThrottlingException" ||
           code == "RequestThrottled" || code == "TooManyRequests";
  }
  return false;
}

std::chrono::milliseconds BackoffDelay(int retry,
                                       std::chrono::milliseconds base,
                                       std::chrono::milliseconds cap,
                                       double unit) {
  if (retry < 1) return std::chrono::milliseconds(0);
  double ceiling = static_cast<double>(base.count()) *
                   std::ldexp(1.0, std::min(retry - 1, 30));
  ceiling = std::min(ceiling, static_cast<double>(cap.count()));
  unit = std::clamp(unit, 0.0, 1.0);
  return std::chrono::milliseconds(static_cast<long long>(ceiling * unit));
}

}  // namespace dcr::objstore_internal
