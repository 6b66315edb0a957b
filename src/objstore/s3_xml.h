// The XML of S3's responses that dcr reads, and the one body it writes
// (CompleteMultipartUpload). Pure functions of bytes, fuzzed
// (tests/fuzz/objstore_fuzz.cc); not part of the public API.
#ifndef DCR_OBJSTORE_S3_XML_H_
#define DCR_OBJSTORE_S3_XML_H_

#include <string>
#include <string_view>
#include <vector>

#include "dcr/status.h"

namespace dcr::objstore_internal {

// An <Error> document's <Code> and <Message>.
struct S3Error {
  std::string code;     // e.g. "SlowDown", "NoSuchKey"; empty if absent
  std::string message;  // the server's sentence; empty if absent
};

// Reads an <Error> document. A body that is not one (empty, HTML from a
// proxy, another root element) gives an S3Error with empty fields; this
// never fails, because the HTTP status alone still says what happened.
S3Error ParseS3Error(std::string_view body);

// Whether `body` is an <Error> document (CompleteMultipartUpload may answer
// 200 with one).
bool IsS3ErrorDocument(std::string_view body);

// The <UploadId> of an InitiateMultipartUploadResult.
Result<std::string> ParseUploadId(std::string_view body);

// One page of a ListObjectsV2 answer.
struct S3ListPage {
  std::vector<std::string> keys;  // full keys, prefix included
  bool truncated = false;
  std::string next_token;  // NextContinuationToken when truncated
};
Result<S3ListPage> ParseListPage(std::string_view body);

// The CompleteMultipartUpload body for parts 1..etags.size() in order.
std::string CompleteMultipartBody(const std::vector<std::string>& etags);

}  // namespace dcr::objstore_internal

#endif  // DCR_OBJSTORE_S3_XML_H_
