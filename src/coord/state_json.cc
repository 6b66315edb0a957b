#include "coord/state_json.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/strict_json.h"

namespace dcr {

std::string_view RefitModeName(RefitMode mode) {
  return mode == RefitMode::kFull ? "full" : "delta";
}

Result<nlohmann::json> StateJson::Parse(std::string_view text,
                                        const std::string& file) {
  DCR_ASSIGN_OR_RETURN(nlohmann::json j, ParseStrictJson(text, file));
  if (!j.is_object()) {
    return Status::Corruption(file + ": not a JSON object");
  }
  return j;
}

Status StateJson::Bad(std::string_view key, std::string_view why) const {
  return Status::Corruption(
      fmt::format("{}: field '{}{}': {}", file_, prefix_, key, why));
}

Status StateJson::OnlyFields(
    std::initializer_list<std::string_view> known) const {
  for (const auto& [key, value] : j_.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      return Bad(key, "unknown field");
    }
  }
  return Status::OK();
}

Result<const nlohmann::json*> StateJson::Get(const char* key) const {
  auto it = j_.find(key);
  if (it == j_.end()) return Bad(key, "missing");
  return &*it;
}

Result<uint64_t> StateJson::Format() const {
  if (!j_.contains("format")) return uint64_t{1};
  DCR_ASSIGN_OR_RETURN(uint64_t f, Uint("format"));
  if (f == 0) return Bad("format", "0 is not a format");
  if (f > kStateFormat) {
    return Status::Unsupported(
        fmt::format("{}: field '{}format': format {} is newer than this build "
                    "reads (up to {})",
                    file_, prefix_, f, kStateFormat));
  }
  return f;
}

Status StateJson::FormatWithLinearDigests() const {
  DCR_ASSIGN_OR_RETURN(uint64_t f, Format());
  if (f >= 2) return Status::OK();
  return Status::Unsupported(fmt::format(
      "{}: format {} names versions by the XXH3 digests of an earlier dcr, "
      "which this one does not compute: finish that refit with the dcr that "
      "began it (dcr refit --resume), or remove the file and seed the "
      "relays again (dcr refit --full)",
      file_, f));
}

Result<uint64_t> StateJson::Uint(const char* key) const {
  DCR_ASSIGN_OR_RETURN(const nlohmann::json* v, Get(key));
  if (!v->is_number_unsigned()) return Bad(key, "not an unsigned integer");
  return v->get<uint64_t>();
}

Result<double> StateJson::Number(const char* key) const {
  DCR_ASSIGN_OR_RETURN(const nlohmann::json* v, Get(key));
  if (!v->is_number()) return Bad(key, "not a number");
  return v->get<double>();
}

Result<bool> StateJson::Bool(const char* key) const {
  DCR_ASSIGN_OR_RETURN(const nlohmann::json* v, Get(key));
  if (!v->is_boolean()) return Bad(key, "not true or false");
  return v->get<bool>();
}

Result<std::string> StateJson::String(const char* key) const {
  DCR_ASSIGN_OR_RETURN(const nlohmann::json* v, Get(key));
  if (!v->is_string()) return Bad(key, "not a string");
  return v->get<std::string>();
}

Result<RefitId> StateJson::Refit(const char* key) const {
  DCR_ASSIGN_OR_RETURN(std::string hex, String(key));
  auto id = RefitId::FromHex(hex);
  if (!id.ok()) return Bad(key, "not a refit id (32 hex digits)");
  return *id;
}

Result<RefitMode> StateJson::Mode(const char* key) const {
  DCR_ASSIGN_OR_RETURN(std::string mode, String(key));
  if (mode == "delta") return RefitMode::kDelta;
  if (mode == "full") return RefitMode::kFull;
  return Bad(key, fmt::format("unknown mode '{}' (delta or full)", mode));
}

Result<Version> StateJson::VersionField(const char* key) const {
  DCR_ASSIGN_OR_RETURN(const nlohmann::json* v, Object(key));
  StateJson f(*v, file_, prefix_ + key + ".");
  DCR_RETURN_IF_ERROR(f.OnlyFields({"step", "digest"}));
  DCR_ASSIGN_OR_RETURN(uint64_t step, f.Uint("step"));
  DCR_ASSIGN_OR_RETURN(const nlohmann::json* d, f.Get("digest"));
  if (d->is_null()) return Version{step, Digest128{}};  // not known
  DCR_ASSIGN_OR_RETURN(std::string hex, f.String("digest"));
  auto digest = Digest128::FromHex(hex);
  if (!digest.ok()) return f.Bad("digest", "not a digest (32 hex digits)");
  return Version{step, *digest};
}

Result<std::vector<std::string>> StateJson::Strings(const char* key) const {
  DCR_ASSIGN_OR_RETURN(const nlohmann::json* a, Array(key));
  std::vector<std::string> out;
  for (size_t i = 0; i < a->size(); ++i) {
    if (!(*a)[i].is_string()) {
      return Bad(fmt::format("{}[{}]", key, i), "not a string");
    }
    out.push_back((*a)[i].get<std::string>());
  }
  return out;
}

Result<const nlohmann::json*> StateJson::Object(const char* key) const {
  DCR_ASSIGN_OR_RETURN(const nlohmann::json* v, Get(key));
  if (!v->is_object()) return Bad(key, "not an object");
  return v;
}

Result<const nlohmann::json*> StateJson::Array(const char* key) const {
  DCR_ASSIGN_OR_RETURN(const nlohmann::json* v, Get(key));
  if (!v->is_array()) return Bad(key, "not an array");
  return v;
}

}  // namespace dcr
