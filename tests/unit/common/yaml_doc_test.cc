// The loader's safety check (yaml_doc::CheckSafe): what it refuses before
// yaml-cpp sees a file, and that nothing it takes for a quoted string or a
// comment can hide an anchor, an alias or deep nesting from it.
#include "common/yaml_doc.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace dcr::yaml_doc {
namespace {

using ::testing::HasSubstr;

Status Check(const std::string& text) {
  return CheckSafe(text, "t.yaml", "topology");
}

std::string Deep(int n) { return std::string(n, '[') + std::string(n, ']'); }

TEST(CheckSafeTest, TakesQuotedStringsWithTheirEscapes) {
  for (const char* ok : {
           "a: \"x &y\"\n",
           "a: 'x &y [ {'\n",
           "a: \"x \\\" &y [\"\n",    // \" does not end it
           "a: 'it''s &y {'\n",       // nor does ''
           "a: \"x\\\\\"\nb: c\n",    // \\ then the closing quote
           "- \"a &b\"\n- 'c *d'\n",  // sequence entries
           "a: [\"x]\", 'y}', {k: \"*z\"}]\n",
           "a:\n  \"k &x\": v\n",     // a quoted key on its own line
           "a: b # c \" & [\n",       // a comment
           "a: [x, # c & [\n  y]\n",  // a comment in a flow collection
           "a: b\"c\n",               // a quote inside a plain scalar
           "a: http://h:1/p\n",
       }) {
    EXPECT_TRUE(Check(ok).ok()) << ok << ": " << Check(ok).ToString();
  }
}

TEST(CheckSafeTest, RefusesAnchorsAliasesAndDeepNesting) {
  EXPECT_THAT(Check("a: &x [1]\nb: *x\n").ToString(),
              HasSubstr("t.yaml:1: YAML anchors and aliases"));
  EXPECT_THAT(Check("a: " + Deep(33) + "\n").ToString(),
              HasSubstr("t.yaml:1: collections nested more than 32 deep"));
  EXPECT_TRUE(Check("a: " + Deep(32) + "\n").ok());
  EXPECT_THAT(Check("a: [x\n").ToString(), HasSubstr("never closed"));
  EXPECT_THAT(Check("a: x]\n").ToString(), HasSubstr("']' closes nothing"));
}

// A quote that does not start a node is part of a plain scalar: taking it
// for a string's start hid every line after it from the check.
TEST(CheckSafeTest, AQuoteInsideAPlainScalarHidesNothing) {
  EXPECT_THAT(Check("a: h \"x\nb: &y [1]\nc: *y\n").ToString(),
              HasSubstr("t.yaml:2: YAML anchors and aliases"));
  EXPECT_THAT(Check("a: h 'x\nb: " + Deep(40) + "\nc: '\n").ToString(),
              HasSubstr("t.yaml:2: collections nested more than 32 deep"));
  // "-'x" is a plain scalar, and so is its text up to ": ".
  EXPECT_THAT(Check("-\"x: &a [1] \"\n").ToString(),
              HasSubstr("anchors and aliases"));
  // A line indented past the last one continues its plain scalar.
  EXPECT_THAT(Check("a: b\n  \"c &x\"\n").ToString(),
              HasSubstr("t.yaml:2: YAML anchors and aliases"));
}

// '#' starts a comment only after a blank (or in a flow collection after
// "[", "{" or ","): "k-#" is a key, and what follows it is a value.
TEST(CheckSafeTest, AHashInsideAPlainScalarHidesNothing) {
  EXPECT_THAT(Check("k-#: &a [1]\n").ToString(),
              HasSubstr("anchors and aliases"));
  EXPECT_THAT(Check("k:#: " + Deep(40) + "\n").ToString(),
              HasSubstr("nested more than 32 deep"));
}

TEST(CheckSafeTest, AQuotedStringEndsOnItsLine) {
  EXPECT_THAT(Check("a: \"x\n  y\"\n").ToString(),
              HasSubstr("t.yaml:1: a quoted string runs past the end of its "
                        "line"));
  EXPECT_THAT(Check("a: 'x").ToString(), HasSubstr("never closed"));
  // An escaped line break is a string over two lines too.
  EXPECT_THAT(Check("a: \"x\\\ny\"\n").ToString(), HasSubstr("runs past"));
}

}  // namespace
}  // namespace dcr::yaml_doc
