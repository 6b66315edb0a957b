// Checked YAML documents: what the topology and the placement layout
// parsers share. yaml-cpp stays behind this header's users: no public
// header (include/dcr/) includes it.
//
// Every error is an InvalidArgument status whose message names the source
// file, the 1-based line where it is known, and the key path, e.g.
//   "layout.yaml:12: tensors[3].split: expected one of ..., got 'rows'"
//
// Thread safety: the functions touch only their arguments; a Reader is a
// value.
#ifndef DCR_COMMON_YAML_DOC_H_
#define DCR_COMMON_YAML_DOC_H_

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dcr/status.h"

namespace dcr::yaml_doc {

using Keys = std::span<const std::string_view>;

// "<source>:<line>: <path>: <msg>", leaving out what is unknown (line 0,
// empty path).
Status Error(std::string_view source, int line, std::string_view path,
             std::string_view msg);

// "" when `s` is valid UTF-8 without control characters (tab and newline
// allowed), else why not.
std::string CheckText(std::string_view s);
// An integer in [lo, hi] written in decimal.
Result<uint64_t> ParseUint(std::string_view s, uint64_t lo, uint64_t hi);
// The closest of `known` to `key` by edit distance, if close enough to be a
// likely typo; else "".
std::string ClosestKey(std::string_view key, Keys known);
// ", "-joined list.
std::string JoinKeys(Keys known);
// "a map", "a list", "a scalar", "nothing", ...
const char* TypeName(const YAML::Node& n);

// Refuses, before a document is loaded, text that yaml-cpp 0.7 handles
// badly: control characters and invalid UTF-8 (it can loop forever),
// collections nested more than 32 deep or indented more than 256 columns
// (it recurses on the stack), unclosed flow collections (it can loop
// forever), a quoted string that runs past its line (so that the scan for
// those cannot be misled), and anchors, aliases and tags (a small file can
// expand exponentially), the last found by yaml-cpp's own event parser,
// which builds no node. `kind` names the file's kind in messages
// ("topology", "layout").
Status CheckSafe(std::string_view text, std::string_view source,
                 std::string_view kind);

// The number of YAML documents in `text`, counted by their "---" markers
// (yaml-cpp 0.7's LoadAll can loop forever on malformed input, fixed
// upstream after 0.7 as jbeder/yaml-cpp#1040).
int CountDocuments(std::string_view text);

// Calls `parse()` (returning a Result or Status) and turns the yaml-cpp
// exceptions it throws into located errors.
template <typename Fn>
auto Guarded(std::string_view source, Fn parse) -> decltype(parse()) {
  try {
    return parse();
  } catch (const YAML::Exception& e) {
    int line = e.mark.line >= 0 ? e.mark.line + 1 : 0;
    return Error(source, line, "", "YAML syntax error: " + std::string(e.msg));
  } catch (const std::exception& e) {
    return Error(source, 0, "", std::string("cannot parse: ") + e.what());
  }
}

struct Field {
  std::string key;
  int line;  // of the value
  YAML::Node value;
};

// The checked entries of one YAML map, in file order.
class Fields {
 public:
  const Field* Get(std::string_view key) const {
    for (const Field& f : fields_) {
      if (f.key == key) return &f;
    }
    return nullptr;
  }
  const std::vector<Field>& all() const { return fields_; }
  void Add(Field f) { fields_.push_back(std::move(f)); }
  int line = 0;  // of the map

 private:
  std::vector<Field> fields_;
};

// Reads the nodes of one document, naming `source` in its errors.
class Reader {
 public:
  explicit Reader(std::string_view source) : source_(source) {}

  const std::string& source() const { return source_; }
  // The 1-based line of `n`, or `fallback` where yaml-cpp knows none.
  static int LineOf(const YAML::Node& n, int fallback) {
    int line = n.Mark().line;
    return line >= 0 ? line + 1 : fallback;
  }
  Status Err(int line, std::string_view path, std::string_view msg) const {
    return Error(source_, line, path, msg);
  }

  // Checks that `n` is a map whose keys are distinct scalars from `known`;
  // an unknown key is refused with the closest known one, or the list.
  Result<Fields> Map(const YAML::Node& n, int line, const std::string& path,
                     Keys known) const;
  // OK iff `f` holds `key`.
  Status Required(const Fields& f, const std::string& path,
                  std::string_view key) const;
  // The items of a list (null counts as empty).
  Result<std::vector<YAML::Node>> List(const Field& f,
                                       const std::string& path) const;
  // A scalar that passes CheckText.
  Result<std::string> Scalar(const Field& f, const std::string& path) const;
  // A scalar integer in [lo, hi].
  Result<uint64_t> Uint(const Field& f, const std::string& path, uint64_t lo,
                        uint64_t hi) const;

 private:
  std::string source_;
};

}  // namespace dcr::yaml_doc

#endif  // DCR_COMMON_YAML_DOC_H_
