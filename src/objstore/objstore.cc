// Object keys (dcr/objstore.h).
#include "dcr/objstore.h"

#include "fmt/format.h"

namespace dcr {

Status ValidateObjectKey(std::string_view key) {
  auto bad = [&](std::string_view why) {
    return Status::InvalidArgument(
        fmt::format("object key '{}' {}", key.substr(0, 200), why));
  };
  if (key.empty()) return bad("is empty");
  if (key.size() > 512) return bad("is longer than 512 bytes");
  size_t start = 0;
  while (start <= key.size()) {
    size_t slash = key.find('/', start);
    std::string_view seg = key.substr(start, slash == std::string_view::npos
                                                 ? std::string_view::npos
                                                 : slash - start);
    if (seg.empty())
      return bad("has an empty segment ('//' or a '/' at an end)");
    if (seg == "." || seg == "..") return bad("has a '.' or '..' segment");
    for (char c : seg) {
      bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
      if (!ok) return bad("may hold only [A-Za-z0-9._-] and '/'");
    }
    if (seg.find(".dcr-tmp-") != std::string_view::npos) {
      return bad(
          "contains '.dcr-tmp-', which names the directory backend's "
          "temporary files");
    }
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return Status::OK();
}

}  // namespace dcr
