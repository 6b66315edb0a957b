#include <cstdlib>

#include "dcr/objstore.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/temp_dir.h"

namespace dcr {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(S3CredentialsTest, ReadsTheNamedProfile) {
  const char* text =
      "# comment\n"
      "[default]\n"
      "aws_access_key_id = AKIADEFAULT\n"
      "aws_secret_access_key=secret/default\r\n"
      "\n"
      "; another comment\n"
      "[ci]\n"
      "  aws_access_key_id =AKIACI  \n"
      "aws_secret_access_key = s=e=c\n"
      "aws_session_token = tok\n"
      "region = eu-west-1\n";
  auto d = ParseS3Credentials(text, "default");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->access_key_id, "AKIADEFAULT");
  EXPECT_EQ(d->secret_access_key, "secret/default");
  EXPECT_EQ(d->session_token, "");
  auto ci = ParseS3Credentials(text, "ci");
  ASSERT_TRUE(ci.ok()) << ci.status().ToString();
  EXPECT_EQ(ci->access_key_id, "AKIACI");
  EXPECT_EQ(ci->secret_access_key, "s=e=c");
  EXPECT_EQ(ci->session_token, "tok");
}

TEST(S3CredentialsTest, ErrorsNameTheLineNeverTheValue) {
  auto r = ParseS3Credentials(
      "[default]\naws_access_key_id = A\njunk secretvalue\n", "default");
  EXPECT_TRUE(r.status().IsInvalidArgument());
  EXPECT_THAT(r.status().message(), HasSubstr("line 3"));
  EXPECT_THAT(r.status().message(), Not(HasSubstr("secretvalue")));

  r = ParseS3Credentials("[default]\naws_access_key_id = A\n", "default");
  EXPECT_THAT(r.status().message(), HasSubstr("aws_secret_access_key"));
  r = ParseS3Credentials("[default]\naws_access_key_id = A\n", "prod");
  EXPECT_THAT(r.status().message(), HasSubstr("no profile '[prod]'"));
  r = ParseS3Credentials("[default\n", "default");
  EXPECT_THAT(r.status().message(), HasSubstr("line 1"));
  r = ParseS3Credentials(
      "[default]\naws_access_key_id = A\naws_access_key_id = hidden\n",
      "default");
  EXPECT_THAT(r.status().message(), HasSubstr("set twice"));
  EXPECT_THAT(r.status().message(), Not(HasSubstr("hidden")));
}

TEST(S3CredentialsTest, LoadsFromTheEnvironmentOrTheFile) {
  ::setenv("AWS_ACCESS_KEY_ID", "envid", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "envsecret", 1);
  ::setenv("AWS_SESSION_TOKEN", "envtoken", 1);
  S3Config cfg;
  auto r = LoadS3Credentials(cfg);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->access_key_id, "envid");
  EXPECT_EQ(r->session_token, "envtoken");

  testing::TempDir dir;
  cfg.credentials_file = dir.Path("creds");
  r = LoadS3Credentials(cfg);  // the file wins, and it is missing
  EXPECT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("credentials file"));
  FILE* f = std::fopen(cfg.credentials_file.c_str(), "w");
  std::fputs("[default]\naws_access_key_id=fid\naws_secret_access_key=fs\n", f);
  std::fclose(f);
  r = LoadS3Credentials(cfg);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->access_key_id, "fid");

  ::unsetenv("AWS_SECRET_ACCESS_KEY");
  cfg.credentials_file.clear();
  r = LoadS3Credentials(cfg);
  EXPECT_THAT(r.status().message(), HasSubstr("AWS_SECRET_ACCESS_KEY"));
  ::unsetenv("AWS_ACCESS_KEY_ID");
  ::unsetenv("AWS_SESSION_TOKEN");
}

TEST(S3OpenTest, ChecksTheConfiguration) {
  S3Credentials creds{"id", "secret", ""};
  S3Config cfg;
  cfg.endpoint = "http://127.0.0.1:1/";
  cfg.bucket = "b-1";
  cfg.prefix = "dcr/prod/";
  auto ok = OpenS3ObjectStore(cfg, creds);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ((*ok)->describe(), "s3:http://127.0.0.1:1/b-1/dcr/prod/");
  EXPECT_THAT((*ok)->describe(), Not(HasSubstr("secret")));

  auto bad = [&](S3Config c, const char* why) {
    Status s = OpenS3ObjectStore(c, creds).status();
    EXPECT_TRUE(s.IsInvalidArgument()) << why;
    EXPECT_THAT(s.message(), HasSubstr(why));
  };
  S3Config c = cfg;
  c.endpoint = "127.0.0.1:9000";
  bad(c, "http://");
  c = cfg;
  c.bucket = "";
  bad(c, "bucket name");
  c = cfg;
  c.bucket = "a/b";
  bad(c, "bucket name");
  c = cfg;
  c.prefix = "dcr";
  bad(c, "must end in '/'");
  c = cfg;
  c.prefix = "a b/";
  bad(c, "segments");
  c = cfg;
  c.part_size = 0;
  bad(c, "positive");
  EXPECT_FALSE(OpenS3ObjectStore(cfg, S3Credentials{}).ok());
}

TEST(S3OpenTest, AnUnreachableServerFailsAfterItsAttempts) {
  S3Config cfg;
  cfg.endpoint = "http://127.0.0.1:9";  // discard: nothing listens
  cfg.bucket = "b";
  cfg.max_attempts = 3;
  cfg.retry_base = std::chrono::milliseconds(1);
  auto store = OpenS3ObjectStore(cfg, S3Credentials{"id", "secret", ""});
  ASSERT_TRUE(store.ok());
  auto r = (*store)->Get("k");
  EXPECT_EQ(r.status().code(), StatusCode::kIOError) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr("attempt 3 of 3"));
  EXPECT_EQ((*store)->stats().requests, 3u);
  EXPECT_EQ((*store)->stats().retries, 2u);
}

}  // namespace
}  // namespace dcr
