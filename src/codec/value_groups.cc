// Value groups of context-coded chunks (codec/value_groups.h).
#include "codec/value_groups.h"

#include <array>
#include <cstring>

#include "codec/context.h"
#include "codec/context_scan.h"
#include "codec/diff.h"

namespace dcr {
void GatherGroups(size_t w, size_t groups, const uint8_t* group, size_t n,
                  const uint8_t* const* gp, std::byte* out) {
  if (groups == 1) return JoinPlanes(w, gp, n, out);
  ContextScan().gather_groups(w, group, n, groups, gp, out);
}

namespace {

// The inverse of GatherGroups: appends byte j of change i to plane
// gp[group[i] * W + j], in order. Every group's next slot is written for
// every change and only the change's own group advances, so the loop has
// no branch and its counters stay in registers; each plane needs one byte
// past its changes.
template <size_t W, size_t G>
void GatherByGroupWG(const uint8_t* group, size_t n,
                     const uint8_t* const* planes, uint8_t* const* gp) {
  size_t at[G] = {};
  for (size_t i = 0; i < n; ++i) {
    const size_t gi = group[i];
#pragma GCC unroll 4
    for (size_t g = 0; g < G; ++g) {
#pragma GCC unroll 4
      for (size_t j = 0; j < W; ++j) gp[g * W + j][at[g]] = planes[j][i];
      at[g] += gi == g ? 1 : 0;
    }
  }
}

template <size_t W>
void GatherByGroupW(size_t groups, const uint8_t* group, size_t n,
                    const uint8_t* const* planes, uint8_t* const* gp) {
  switch (groups) {
    case 1:
      for (size_t j = 0; j < W; ++j) std::memcpy(gp[j], planes[j], n);
      return;
    case 2:
      return GatherByGroupWG<W, 2>(group, n, planes, gp);
    case 3:
      return GatherByGroupWG<W, 3>(group, n, planes, gp);
    default:
      return GatherByGroupWG<W, 4>(group, n, planes, gp);
  }
}

}  // namespace

void GatherByGroup(size_t w, size_t groups, const uint8_t* group, size_t n,
                   const uint8_t* const* planes, uint8_t* const* gp) {
  static_assert(kMaxContextGroups == 4);
  switch (w) {
    case 1:
      return GatherByGroupW<1>(groups, group, n, planes, gp);
    case 2:
      return GatherByGroupW<2>(groups, group, n, planes, gp);
    default:
      return GatherByGroupW<4>(groups, group, n, planes, gp);
  }
}

}  // namespace dcr
