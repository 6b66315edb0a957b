// AWS shared-credentials files and the environment (dcr/objstore.h).
#include <cstdlib>
#include <map>
#include <string>

#include "common/file.h"
#include "dcr/objstore.h"
#include "fmt/format.h"

namespace dcr {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) {
    s.remove_prefix(1);
  }
  while (!s.empty() &&
         (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

const char* Env(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

}  // namespace

Result<S3Credentials> ParseS3Credentials(std::string_view text,
                                         std::string_view profile) {
  std::map<std::string, std::string, std::less<>> keys;
  bool in_profile = false;
  bool profile_seen = false;
  size_t line_no = 0;
  while (!text.empty()) {
    size_t eol = text.find('\n');
    std::string_view line =
        Trim(text.substr(0, eol == std::string_view::npos ? text.size() : eol));
    text.remove_prefix(eol == std::string_view::npos ? text.size() : eol + 1);
    ++line_no;
    if (line.empty() || line.front() == '#' || line.front() == ';') continue;
    if (line.front() == '[') {
      if (line.back() != ']' || line.size() < 3) {
        return Status::InvalidArgument(
            fmt::format("line {}: a section header is '[name]'", line_no));
      }
      in_profile = Trim(line.substr(1, line.size() - 2)) == profile;
      profile_seen = profile_seen || in_profile;
      continue;
    }
    size_t eq = line.find('=');
    if (eq == std::string_view::npos) {
      return Status::InvalidArgument(fmt::format(
          "line {}: expected 'name = value' or '[profile]'", line_no));
    }
    std::string_view name = Trim(line.substr(0, eq));
    if (name.empty()) {
      return Status::InvalidArgument(
          fmt::format("line {}: a setting without a name", line_no));
    }
    if (!in_profile) continue;
    if (!keys.emplace(std::string(name), std::string(Trim(line.substr(eq + 1))))
             .second) {
      return Status::InvalidArgument(
          fmt::format("line {}: '{}' is set twice in profile '{}'", line_no,
                      name, profile));
    }
  }
  if (!profile_seen) {
    return Status::InvalidArgument(
        fmt::format("no profile '[{}]' in the credentials", profile));
  }
  S3Credentials c;
  for (auto [field, name] :
       {std::pair{&c.access_key_id, "aws_access_key_id"},
        std::pair{&c.secret_access_key, "aws_secret_access_key"}}) {
    auto it = keys.find(name);
    if (it == keys.end() || it->second.empty()) {
      return Status::InvalidArgument(
          fmt::format("profile '[{}]' sets no {}", profile, name));
    }
    *field = it->second;
  }
  if (auto it = keys.find("aws_session_token"); it != keys.end()) {
    c.session_token = it->second;
  }
  return c;
}

Result<S3Credentials> LoadS3Credentials(const S3Config& config) {
  if (!config.credentials_file.empty()) {
    Result<std::string> text = ReadFileToString(config.credentials_file);
    if (!text.ok()) {
      return text.status().WithContext("reading the S3 credentials file");
    }
    Result<S3Credentials> c = ParseS3Credentials(*text, config.profile);
    if (!c.ok()) return c.status().WithContext(config.credentials_file);
    return c;
  }
  const char* id = Env("AWS_ACCESS_KEY_ID");
  const char* secret = Env("AWS_SECRET_ACCESS_KEY");
  if (id == nullptr || secret == nullptr) {
    return Status::InvalidArgument(
        "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
        "in the environment, or name a credentials_file (AWS "
        "shared-credentials format) in the topology");
  }
  S3Credentials c{id, secret, ""};
  if (const char* token = Env("AWS_SESSION_TOKEN")) c.session_token = token;
  return c;
}

}  // namespace dcr
