// The value groups of context-coded chunks (codec/context.h): a chunk's
// changed values are coded as byte planes per group of exponent ranges, in
// position order within each group. These move values between the chunk's
// element-major planes and the groups' planes.
//
// Internal to the codec.
#ifndef DCR_CODEC_VALUE_GROUPS_H_
#define DCR_CODEC_VALUE_GROUPS_H_

#include <cstddef>
#include <cstdint>

namespace dcr {

// Appends byte j of change i (planes[j][i], n changes of w bytes) to plane
// gp[group[i] * w + j], in order; group[i] < groups <= 4. Every group's
// next slot is written for every change and only the change's own group
// advances, so the loop has no branch and its counters stay in registers:
// each group plane needs one byte past its values.
void GatherByGroup(size_t w, size_t groups, const uint8_t* group, size_t n,
                   const uint8_t* const* planes, uint8_t* const* gp);

// The inverse: out[i * w + j] = byte j of the next value of change i's
// group, from the group planes gp[g * w + j].
void GatherGroups(size_t w, size_t groups, const uint8_t* group, size_t n,
                  const uint8_t* const* gp, std::byte* out);

}  // namespace dcr

#endif  // DCR_CODEC_VALUE_GROUPS_H_
