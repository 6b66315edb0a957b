// Fuzzes what the object store reads from outside: S3's XML answers (an
// error, a multipart upload id, a list page) and AWS shared-credentials
// files. The first byte picks the parser; the rest is its input. Never a
// crash; a parsed list page is consistent (a truncated page has a token).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "dcr/objstore.h"
#include "objstore/s3_xml.h"

namespace oi = dcr::objstore_internal;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > 64 * 1024) return 0;
  std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 4) {
    case 0: {
      oi::S3Error e = oi::ParseS3Error(text);
      if (!e.code.empty() && !oi::IsS3ErrorDocument(text)) std::abort();
      break;
    }
    case 1: {
      auto id = oi::ParseUploadId(text);
      if (id.ok() && id->empty()) std::abort();
      break;
    }
    case 2: {
      auto page = oi::ParseListPage(text);
      if (page.ok() && page->truncated && page->next_token.empty())
        std::abort();
      break;
    }
    case 3: {
      auto c = dcr::ParseS3Credentials(text, "default");
      if (c.ok() &&
          (c->access_key_id.empty() || c->secret_access_key.empty())) {
        std::abort();
      }
      break;
    }
  }
  return 0;
}
