// Strict reading of the coordinator's JSON files (state_dir.h): a reader
// over one object of one file that takes each field by name and type and
// refuses, naming the file and the field, what is missing, of another
// type, malformed, or not part of the format. Errors are Corruption, but
// a `format` newer than this build's, which is Unsupported.
//
// Thread safety: a value over a JSON object the caller keeps alive.
#ifndef DCR_COORD_STATE_JSON_H_
#define DCR_COORD_STATE_JSON_H_

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/refit_codes.h"
#include "dcr/status.h"
#include "dcr/version.h"

namespace dcr {

// The format version of every coordinator JSON file this build writes; a
// file without a `format` field (written before it existed) is format 1.
// Format 2 names versions by linear tensor digests (docs/FORMAT.md
// §"Digests"); format 1 by the XXH3 digests of earlier builds.
inline constexpr uint64_t kStateFormat = 2;

// "delta" or "full".
std::string_view RefitModeName(RefitMode mode);

class StateJson {
 public:
  // Parses `text` as strict JSON (common/strict_json.h) holding one object.
  static Result<nlohmann::json> Parse(std::string_view text,
                                      const std::string& file);

  // Reads fields of `object`, a part of `file` at `prefix` ("" for the top
  // level, "base." for a nested object).
  StateJson(const nlohmann::json& object, std::string file,
            std::string prefix = "")
      : j_(object), file_(std::move(file)), prefix_(std::move(prefix)) {}

  // Refuses any key but `known`.
  Status OnlyFields(std::initializer_list<std::string_view> known) const;
  // The file's `format` (1 when absent); Unsupported above kStateFormat.
  Result<uint64_t> Format() const;
  // Format() for a file whose digests must be this build's (a refit to
  // finish, a commit decision): format 1 is Unsupported, saying to finish
  // its refit with the earlier dcr or remove the file.
  Status FormatWithLinearDigests() const;

  bool Has(const char* key) const { return j_.contains(key); }
  Result<uint64_t> Uint(const char* key) const;
  Result<double> Number(const char* key) const;
  Result<bool> Bool(const char* key) const;
  Result<std::string> String(const char* key) const;
  Result<RefitId> Refit(const char* key) const;
  Result<RefitMode> Mode(const char* key) const;
  // {"step": N, "digest": "<32 hex>"}.
  Result<Version> VersionField(const char* key) const;
  Result<std::vector<std::string>> Strings(const char* key) const;
  // The nested object or array (type checked).
  Result<const nlohmann::json*> Object(const char* key) const;
  Result<const nlohmann::json*> Array(const char* key) const;

  // Corruption "<file>: field '<prefix><key>': <why>".
  Status Bad(std::string_view key, std::string_view why) const;
  const std::string& file() const { return file_; }
  const std::string& prefix() const { return prefix_; }

 private:
  Result<const nlohmann::json*> Get(const char* key) const;

  const nlohmann::json& j_;
  std::string file_;
  std::string prefix_;
};

}  // namespace dcr

#endif  // DCR_COORD_STATE_JSON_H_
