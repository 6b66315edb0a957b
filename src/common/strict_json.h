// Strict JSON for the files dcr reads from others (safetensors headers,
// indexes, version records): no comments, nothing after the value, no key
// twice in one object (a plain parser silently keeps the last one), and a
// bounded nesting depth.
#ifndef DCR_COMMON_STRICT_JSON_H_
#define DCR_COMMON_STRICT_JSON_H_

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "dcr/status.h"

namespace dcr {

struct StrictJsonOptions {
  int max_depth = 16;
  // Keys of objects at this depth name things (-1: none); a repeated one is
  // reported as "<noun> '<key>' appears twice".
  int named_depth = -1;
  std::string_view noun = "tensor";
};

// Every failure is Corruption with a message that starts with `what`.
Result<nlohmann::json> ParseStrictJson(std::string_view text,
                                       const std::string& what,
                                       const StrictJsonOptions& options = {});

}  // namespace dcr

#endif  // DCR_COMMON_STRICT_JSON_H_
