#include "objstore/s3_xml.h"

#include <pugixml.hpp>

#include "fmt/format.h"

namespace dcr::objstore_internal {
namespace {

// Parses `body` into `doc`; false if it is not well-formed XML.
bool Load(pugi::xml_document& doc, std::string_view body) {
  pugi::xml_parse_result r = doc.load_buffer(
      body.data(), body.size(), pugi::parse_default, pugi::encoding_utf8);
  return static_cast<bool>(r);
}

std::string Excerpt(std::string_view body) {
  constexpr size_t kMax = 120;
  std::string out;
  for (char c : body.substr(0, kMax)) {
    out += (c >= 0x20 && c < 0x7f) ? c : '?';
  }
  if (body.size() > kMax) out += "...";
  return out;
}

}  // namespace

S3Error ParseS3Error(std::string_view body) {
  S3Error err;
  pugi::xml_document doc;
  if (!Load(doc, body)) return err;
  pugi::xml_node e = doc.child("Error");
  if (!e) return err;
  err.code = e.child_value("Code");
  err.message = e.child_value("Message");
  return err;
}

bool IsS3ErrorDocument(std::string_view body) {
  pugi::xml_document doc;
  return Load(doc, body) && doc.child("Error");
}

Result<std::string> ParseUploadId(std::string_view body) {
  pugi::xml_document doc;
  pugi::xml_node id;
  if (Load(doc, body)) {
    id = doc.child("InitiateMultipartUploadResult").child("UploadId");
  }
  std::string value = id ? id.child_value() : "";
  if (value.empty()) {
    return Status::Corruption(
        fmt::format("the server's answer to CreateMultipartUpload has no "
                    "UploadId: '{}'",
                    Excerpt(body)));
  }
  return value;
}

Result<S3ListPage> ParseListPage(std::string_view body) {
  pugi::xml_document doc;
  pugi::xml_node root;
  if (Load(doc, body)) root = doc.child("ListBucketResult");
  if (!root) {
    return Status::Corruption(fmt::format(
        "the server's answer to ListObjectsV2 is not a ListBucketResult: '{}'",
        Excerpt(body)));
  }
  S3ListPage page;
  for (pugi::xml_node c : root.children("Contents")) {
    std::string key = c.child_value("Key");
    if (!key.empty()) page.keys.push_back(std::move(key));
  }
  page.truncated = std::string_view(root.child_value("IsTruncated")) == "true";
  page.next_token = root.child_value("NextContinuationToken");
  if (page.truncated && page.next_token.empty()) {
    return Status::Corruption(
        "the server's ListObjectsV2 page is truncated but names no "
        "NextContinuationToken");
  }
  return page;
}

std::string CompleteMultipartBody(const std::vector<std::string>& etags) {
  pugi::xml_document doc;
  pugi::xml_node root = doc.append_child("CompleteMultipartUpload");
  root.append_attribute("xmlns") = "http://s3.amazonaws.com/doc/2006-03-01/";
  for (size_t i = 0; i < etags.size(); ++i) {
    pugi::xml_node part = root.append_child("Part");
    part.append_child("PartNumber")
        .text()
        .set(static_cast<unsigned long long>(i + 1));
    part.append_child("ETag").text().set(etags[i].c_str());
  }
  struct Writer : pugi::xml_writer {
    std::string out;
    void write(const void* data, size_t size) override {
      out.append(static_cast<const char*>(data), size);
    }
  } writer;
  doc.save(writer, "", pugi::format_raw);
  return writer.out;
}

}  // namespace dcr::objstore_internal
