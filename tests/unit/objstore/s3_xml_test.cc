#include "objstore/s3_xml.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "objstore/s3_http.h"

namespace dcr::objstore_internal {
namespace {

using ::testing::ElementsAre;

TEST(S3XmlTest, ReadsErrors) {
  S3Error e = ParseS3Error(
      "<?xml version=\"1.0\"?><Error><Code>SlowDown</Code><Message>Reduce "
      "&amp; retry</Message><RequestId>1</RequestId></Error>");
  EXPECT_EQ(e.code, "SlowDown");
  EXPECT_EQ(e.message, "Reduce & retry");
  EXPECT_TRUE(IsS3ErrorDocument("<Error><Code>X</Code></Error>"));
  for (const char* junk :
       {"", "<html>bad gateway</html>", "<Error>", "\xff\xfe"}) {
    EXPECT_TRUE(ParseS3Error(junk).code.empty()) << junk;
    EXPECT_FALSE(IsS3ErrorDocument(junk)) << junk;
  }
  EXPECT_FALSE(
      IsS3ErrorDocument("<CompleteMultipartUploadResult><ETag>x</ETag>"
                        "</CompleteMultipartUploadResult>"));
}

TEST(S3XmlTest, ReadsUploadIds) {
  auto id = ParseUploadId(
      "<InitiateMultipartUploadResult xmlns=\"http://s3.amazonaws.com/doc/"
      "2006-03-01/\"><Bucket>b</Bucket><Key>k</Key><UploadId>a+b/c=</UploadId>"
      "</InitiateMultipartUploadResult>");
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(*id, "a+b/c=");
  EXPECT_TRUE(ParseUploadId("<InitiateMultipartUploadResult/>")
                  .status()
                  .IsCorruption());
  EXPECT_TRUE(ParseUploadId("not xml").status().IsCorruption());
}

TEST(S3XmlTest, ReadsListPages) {
  auto page = ParseListPage(
      "<ListBucketResult><Name>b</Name><KeyCount>2</KeyCount>"
      "<Contents><Key>dcr/a</Key><Size>1</Size></Contents>"
      "<Contents><Key>dcr/b&amp;c</Key></Contents>"
      "<IsTruncated>true</IsTruncated>"
      "<NextContinuationToken>tok/+=</NextContinuationToken>"
      "</ListBucketResult>");
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  EXPECT_THAT(page->keys, ElementsAre("dcr/a", "dcr/b&c"));
  EXPECT_TRUE(page->truncated);
  EXPECT_EQ(page->next_token, "tok/+=");

  auto last = ParseListPage(
      "<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>");
  ASSERT_TRUE(last.ok());
  EXPECT_TRUE(last->keys.empty());
  EXPECT_FALSE(last->truncated);
  // Truncated without a token would loop forever: refused.
  EXPECT_TRUE(ParseListPage("<ListBucketResult><IsTruncated>true</IsTruncated>"
                            "</ListBucketResult>")
                  .status()
                  .IsCorruption());
  EXPECT_TRUE(ParseListPage("<Error/>").status().IsCorruption());
}

TEST(S3XmlTest, WritesTheCompleteBody) {
  std::string body = CompleteMultipartBody({"\"e1\"", "\"e&2\""});
  EXPECT_EQ(body,
            "<?xml version=\"1.0\"?><CompleteMultipartUpload "
            "xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Part>"
            "<PartNumber>1</PartNumber><ETag>\"e1\"</ETag></Part><Part>"
            "<PartNumber>2</PartNumber><ETag>\"e&amp;2\"</ETag></Part>"
            "</CompleteMultipartUpload>");
}

// SigV4's canonical encoding (the query is sent, and signed, as built).
TEST(S3HttpTest, EncodesAsSigV4Canonicalizes) {
  EXPECT_EQ(AwsUriEncode("AZaz09-_.~", false), "AZaz09-_.~");
  EXPECT_EQ(AwsUriEncode("dcr/refits/a b", false), "dcr%2Frefits%2Fa%20b");
  EXPECT_EQ(AwsUriEncode("dcr/refits/a b", true), "dcr/refits/a%20b");
  EXPECT_EQ(AwsUriEncode("+=&%\xff", false), "%2B%3D%26%25%FF");
  EXPECT_EQ(Sha256Hex({}),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const char abc[] = "abc";
  EXPECT_EQ(Sha256Hex(std::as_bytes(std::span(abc, 3))),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

}  // namespace
}  // namespace dcr::objstore_internal
