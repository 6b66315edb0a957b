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
  EXPECT_THAT(Check("a: [x]]\n").ToString(), HasSubstr("']' closes nothing"));
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
  // A line indented past the last one continues its plain scalar, where
  // "&x" is text.
  EXPECT_TRUE(Check("a: b\n  \"c &x\"\n").ok());
}

// '#' starts a comment only after a blank (or in a flow collection after
// "[", "{" or ","): "k-#" is a key, and what follows it is a value.
TEST(CheckSafeTest, AHashInsideAPlainScalarHidesNothing) {
  EXPECT_THAT(Check("k-#: &a [1]\n").ToString(),
              HasSubstr("anchors and aliases"));
  EXPECT_THAT(Check("k:#: " + Deep(40) + "\n").ToString(),
              HasSubstr("nested more than 32 deep"));
}

// yaml-cpp starts a string where a token starts: after a tag, and in a
// flow collection after a ':' right behind a quoted key (JSON). A quote
// the check did not take there hid the rest of its line behind a '#'
// (found by review).
TEST(CheckSafeTest, AQuoteTheCheckDoesNotTakeHidesNothing) {
  EXPECT_THAT(Check("root: {\"s\":\"/s #\", h: &h 1,\n  }\n").ToString(),
              HasSubstr("t.yaml:1: YAML anchors and aliases"));
  EXPECT_TRUE(Check("{\"a\":\"/a &b #c\",\"d\":[\"e\"]}\n").ok());
  EXPECT_THAT(Check("a: !!str \"k #\"\n").ToString(),
              HasSubstr("t.yaml:1: YAML tags (!name) are not allowed"));
  EXPECT_THAT(Check("! \"k #\": {p: &a 1, q: *a}\n").ToString(),
              HasSubstr("anchors and aliases"));
  // Past a quote not taken, no '#' on its line is a comment: the bracket
  // after it counts.
  EXPECT_THAT(Check("a: b\"c #d: [1\n").ToString(), HasSubstr("never closed"));
  // yaml-cpp reads "# R & D" as a comment, and so does the check.
  EXPECT_TRUE(Check("region: l'ocal  # R & D\n").ok());
  EXPECT_TRUE(Check("a: hello! # x\n").ok());
}

// A bracket inside a plain scalar outside flow collections opens none:
// counting it made a '#' after it a comment (found by review).
TEST(CheckSafeTest, ABracketInsideAPlainScalarOpensNothing) {
  EXPECT_THAT(Check("x[#y: {p: &a 1, q: *a}\nz: a]\n").ToString(),
              HasSubstr("t.yaml:1: YAML anchors and aliases"));
  EXPECT_TRUE(Check("a: x[y\nb: c]d}\n").ok());
  EXPECT_THAT(Check("a: ]\n").ToString(), HasSubstr("closes nothing"));
  // After a quoted value yaml-cpp takes '#' for a comment, and so does the
  // check: the '}' is in it, and the map is never closed.
  EXPECT_THAT(Check("{a: \"b\"#}\n").ToString(), HasSubstr("never closed"));
}

// Found by a second review: "?'a" and "-[" start plain scalars, not
// nodes; a JSON ':' follows only a quoted key or a bracket; a byte-order
// mark hid an anchor from the scan. What yaml-cpp reads decides.
TEST(CheckSafeTest, YamlCppsReadingDecides) {
  for (const char* bad : {
           "?'a: &x 1'\n?'b: *x #'\n",
           "-[#: &a x\n  y]\n",
           "---{#k: &a x\n",
           "{:\"k: &a 1, b: *a #\"\n}\n",
           "[x,:\"k: &a 1 #\"\n]\n",
           "a:\n    b\n  [c\nd:\n- x,'k: &y v #'\n- x,'k: *y #'\n- c]\n",
           "\xEF\xBB\xBF&v version: 1\n",
           "\xEF\xBB\xBF[x,\"]\"\n",
       }) {
    EXPECT_FALSE(Check(bad).ok()) << bad;
  }
  EXPECT_THAT(Check("a: [" + Deep(33) + "]\n").ToString(),
              HasSubstr("nested more than 32 deep"));
}

// "? " nests block maps as "- " nests sequences: both count as indentation.
TEST(CheckSafeTest, ComplexKeysCountAsIndentation) {
  std::string keys = "x:\n  ";
  for (int i = 0; i < 200; ++i) keys += "? ";
  EXPECT_THAT(Check(keys + "a\n").ToString(),
              HasSubstr("indented more than 256 columns"));
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
