// Seconds between two steady-clock points, for phase timings and logs.
#ifndef DCR_COMMON_ELAPSED_H_
#define DCR_COMMON_ELAPSED_H_

#include <chrono>

namespace dcr {

inline double Seconds(std::chrono::steady_clock::time_point from,
                      std::chrono::steady_clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace dcr

#endif  // DCR_COMMON_ELAPSED_H_
