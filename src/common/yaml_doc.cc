// Checked YAML documents (common/yaml_doc.h).
#include "common/yaml_doc.h"

#include <yaml-cpp/eventhandler.h>

#include <algorithm>
#include <limits>
#include <sstream>

#include "common/printable.h"

namespace dcr::yaml_doc {
namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// A value from the file, quoted for a message: cut to its first 80 bytes
// (with its length) and escaped (common/printable.h).
std::string Quote(std::string_view s) { return "'" + Abbreviated(s) + "'"; }

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}
}  // namespace

Status Error(std::string_view source, int line, std::string_view path,
             std::string_view msg) {
  std::string out(source);
  if (line > 0) out += ":" + std::to_string(line);
  out += ": ";
  if (!path.empty()) {
    out += path;
    out += ": ";
  }
  out += msg;
  return Status::InvalidArgument(out);
}

std::string CheckText(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    auto c = static_cast<unsigned char>(s[i]);
    if ((c < 0x20 && c != '\t' && c != '\n') || c == 0x7f) {
      return "contains a control character (byte " + std::to_string(c) +
             " at offset " + std::to_string(i) + ")";
    }
    size_t n = c < 0x80           ? 1
               : (c >> 5) == 0x6  ? 2
               : (c >> 4) == 0xe  ? 3
               : (c >> 3) == 0x1e ? 4
                                  : 0;
    bool ok = n != 0 && i + n <= s.size();
    for (size_t k = 1; ok && k < n; ++k) {
      ok = (static_cast<unsigned char>(s[i + k]) >> 6) == 0x2;
    }
    if (ok && n > 1) {  // no overlong forms, surrogates or values > U+10FFFF
      uint32_t cp = c & (0x7f >> n);
      for (size_t k = 1; k < n; ++k) {
        cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
      }
      ok = !(n == 2 && cp < 0x80) && !(n == 3 && cp < 0x800) &&
           !(n == 4 && cp < 0x10000) && !(cp >= 0xd800 && cp <= 0xdfff) &&
           cp <= 0x10ffff;
    }
    if (!ok) return "is not valid UTF-8 (at offset " + std::to_string(i) + ")";
    i += n;
  }
  return "";
}

Result<uint64_t> ParseUint(std::string_view s, uint64_t lo, uint64_t hi) {
  auto bad = [&] {
    return Status::InvalidArgument("expected an integer " + std::to_string(lo) +
                                   "-" + std::to_string(hi) + ", got " +
                                   Quote(s));
  };
  if (s.empty() || s.size() > 20) return bad();
  uint64_t v = 0;
  for (char c : s) {
    if (!IsDigit(c)) return bad();
    uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) return bad();
    v = v * 10 + d;
  }
  if (v < lo || v > hi) return bad();
  return v;
}

std::string ClosestKey(std::string_view key, Keys known) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (std::string_view k : known) {
    size_t d = EditDistance(key, k);
    if (d < best_d) {
      best_d = d;
      best = std::string(k);
    }
  }
  size_t limit = std::max<size_t>(2, best.size() / 3);
  return best_d <= limit ? best : "";
}

std::string JoinKeys(Keys known) {
  std::string out;
  for (std::string_view k : known) {
    if (!out.empty()) out += ", ";
    out += k;
  }
  return out;
}

const char* TypeName(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Null:
      return "nothing";
    case YAML::NodeType::Scalar:
      return "a scalar";
    default:
      return "an undefined value";
  }
}

namespace {

// yaml-cpp's own reading of a document, event by event (it builds no
// node, so aliases cost nothing here): the exact check of what the text
// scan in CheckSafe can only approximate. Keeps the first refusal.
class EventCheck : public YAML::EventHandler {
 public:
  EventCheck(std::string_view source, std::string_view kind, int max_flow)
      : source_(source), kind_(kind), max_flow_(max_flow) {}
  const Status& status() const { return status_; }

  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& m, YAML::anchor_t anchor) override {
    NoAnchor(m, anchor);
  }
  void OnAlias(const YAML::Mark& m, YAML::anchor_t) override { Anchor(m); }
  void OnAnchor(const YAML::Mark& m, const std::string&) override { Anchor(m); }
  void OnScalar(const YAML::Mark& m, const std::string& tag,
                YAML::anchor_t anchor, const std::string&) override {
    Node(m, tag, anchor);
  }
  void OnSequenceStart(const YAML::Mark& m, const std::string& tag,
                       YAML::anchor_t anchor,
                       YAML::EmitterStyle::value style) override {
    Open(m, tag, anchor, style);
  }
  void OnSequenceEnd() override { Close(); }
  void OnMapStart(const YAML::Mark& m, const std::string& tag,
                  YAML::anchor_t anchor,
                  YAML::EmitterStyle::value style) override {
    Open(m, tag, anchor, style);
  }
  void OnMapEnd() override { Close(); }

 private:
  void Refuse(const YAML::Mark& m, const std::string& msg) {
    if (status_.ok()) status_ = Error(source_, m.line + 1, "", msg);
  }
  void Anchor(const YAML::Mark& m) {
    // Aliases make the document a graph whose walk can be exponential in
    // its size ("billion laughs"); a topology never needs them.
    Refuse(m,
           "YAML anchors and aliases (&name, *name) are not allowed in "
           "a " +
               kind_ + "; quote a value that starts with & or *");
  }
  void NoAnchor(const YAML::Mark& m, YAML::anchor_t anchor) {
    if (anchor != YAML::NullAnchor) Anchor(m);
  }
  void Node(const YAML::Mark& m, const std::string& tag,
            YAML::anchor_t anchor) {
    NoAnchor(m, anchor);
    // yaml-cpp reports "?" for a plain node and "!" for a quoted one.
    if (!tag.empty() && tag != "?" && tag != "!") {
      Refuse(m, "YAML tags (!name) are not allowed in a " + kind_ +
                    "; quote a value that starts with !");
    }
  }
  void Open(const YAML::Mark& m, const std::string& tag, YAML::anchor_t anchor,
            YAML::EmitterStyle::value style) {
    Node(m, tag, anchor);
    flow_.push_back(style == YAML::EmitterStyle::Flow);
    if (flow_.back() && ++depth_ > max_flow_) {
      Refuse(m, "collections nested more than 32 deep");
    }
  }
  void Close() {
    if (flow_.empty()) return;
    if (flow_.back()) --depth_;
    flow_.pop_back();
  }

  const std::string source_;
  const std::string kind_;
  const int max_flow_;
  Status status_;
  std::vector<bool> flow_;  // per open collection: a flow one
  int depth_ = 0;
};

}  // namespace

// yaml-cpp parses nested collections recursively: a hostile file of
// "[[[[..." would exhaust the stack, an unclosed one can hang it, and
// aliases can make a small file expand exponentially. Our documents nest a
// few levels and need no aliases, so all are refused before the document
// is loaded, in two passes.
//
// First a scan of the text, for what would hang yaml-cpp or exhaust its
// stack: control characters, deep indentation, and brackets unbalanced or
// nested past 32. It skips quoted strings and comments, and where it
// cannot tell it errs toward counting: a string or a comment taken wrongly
// would hide brackets from it. So it takes a quote only where a node
// starts (after ": ", "- ", a flow collection's "[", "{" or ",", a
// JSON-like key's ':', or first on a line that does not continue the last
// one's plain scalar; never right after '-' as in "-'a'"), reads its
// escapes ('' and \"), and refuses one that runs past its line; it takes
// a comment only after a blank or a token's end, and on a line with a
// quote it did not take, not at all. Every bracket counts toward the
// limits, but only one where a token starts opens a flow collection.
//
// Then yaml-cpp's own parse of the document as events (EventCheck), which
// builds no node: anchors, aliases and tags are refused exactly where
// yaml-cpp sees them, and flow nesting past 32 too.
// tests/fuzz/yaml_check_fuzz.cc checks both against yaml-cpp.
Status CheckSafe(std::string_view text, std::string_view source_name,
                 std::string_view kind) {
  // YAML is text: refuse NUL, other control characters and invalid UTF-8
  // up front (yaml-cpp 0.7 loops forever on some such inputs).
  int text_line = 1;
  for (size_t start = 0; start <= text.size(); ++text_line) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view l = text.substr(start, end - start);
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    if (std::string why = CheckText(l); !why.empty()) {
      return Error(source_name, text_line, "", "the line " + why);
    }
    start = end + 1;
  }
  constexpr int kMaxFlowDepth = 32;
  constexpr size_t kMaxIndent = 256;
  auto blank = [](char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
  };
  int depth = 0;  // brackets open (a bound on the nesting)
  int flow = 0;   // flow collections open (yaml-cpp's flow context)
  int line = 1;
  size_t indent = 0;       // this line's leading spaces, dashes and '?'s
  size_t last_indent = 0;  // that of the last line with content
  bool at_line_start = true;
  bool line_has_content = false;
  // Where yaml-cpp may start a token: a node (node_start: a quote opens a
  // string there), or anything after a token that ended (token_end: a
  // closing quote or bracket, a flow collection's '[', '{' or ','; a '#'
  // right after one starts a comment).
  bool node_start = true;
  bool token_end = false;
  // A quote on this line not taken for a string's start: were it one to
  // yaml-cpp, a '#' after it would be in the string, so none is a comment.
  bool declined = false;
  bool after_key = false;  // the last token was a quoted string or a ']'/'}'
  char quote = 0;
  bool comment = false;
  char prev = '\n';
  int first_open_line = 0;  // of the outermost open collection
  const std::string k(kind);
  // yaml-cpp skips a byte-order mark at the start.
  const size_t bom = text.starts_with("\xEF\xBB\xBF") ? 3 : 0;
  for (size_t i = bom; i < text.size(); ++i) {
    const char c = text[i];
    const char before = prev;
    const char next = i + 1 < text.size() ? text[i + 1] : '\n';
    prev = c;
    if (c == '\n') {
      if (quote) {
        return Error(source_name, line, "",
                     "a quoted string runs past the end of its line; a " + k +
                         " keeps each on one line (write \\n in \"...\" for "
                         "a line break)");
      }
      ++line;
      indent = 0;
      at_line_start = true;
      line_has_content = false;
      comment = false;
      declined = false;
      continue;
    }
    // Indentation: spaces, and "- " and "? " (compact nested collections).
    // "-x", "?'a'" and "---{" start a plain scalar.
    if (at_line_start &&
        (c == ' ' || ((c == '-' || c == '?') && blank(next)))) {
      if (++indent > kMaxIndent) {
        return Error(
            source_name, line, "",
            "indented more than 256 columns; a " + k + " nests a few levels");
      }
      continue;
    }
    at_line_start = false;
    if (comment) continue;
    if (quote) {
      if (quote == '"' && c == '\\' && next != '\n') {
        prev = text[++i];  // an escape: \" does not end the string
      } else if (c == quote && quote == '\'' && next == '\'') {
        ++i;  // '' is a quote in a single-quoted string
      } else if (c == quote) {
        quote = 0;
        node_start = false;
        token_end = true;
        after_key = true;
      }
      continue;
    }
    if (blank(c)) continue;
    if (c == '#' && !declined && (blank(before) || token_end)) {
      comment = true;
      continue;
    }
    if (!line_has_content) {
      // Outside flow collections, a line indented no deeper than the last
      // line with content, or after one that ended a token, does not
      // continue that line's plain scalar: a node or a key starts here.
      line_has_content = true;
      if (flow == 0 && (indent <= last_indent || token_end)) {
        node_start = true;
      }
      last_indent = indent;
    }
    const bool at_token = node_start || token_end;
    // A ':' right after a quoted key or a closing bracket, in a flow
    // collection, is a value indicator even without a blank (JSON).
    const bool json_value = flow > 0 && after_key;
    token_end = false;
    after_key = false;
    if (c == '"' || c == '\'') {
      if (node_start && before != '-') {
        quote = c;
      } else {
        declined = true;  // in a plain scalar ("-'a'", "h\"x")
      }
    } else if (c == '[' || c == '{') {
      // Every bracket counts toward the nesting and balance checks (an
      // unclosed one can hang yaml-cpp), but outside flow collections one
      // opens a collection only where a token starts: "x[y" is a plain
      // scalar, and a ',' or '#' after it is text.
      if (depth == 0) first_open_line = line;
      if (++depth > kMaxFlowDepth) {
        return Error(source_name, line, "",
                     "collections nested more than 32 deep");
      }
      if (flow > 0 || at_token) {
        ++flow;
        node_start = true;
        token_end = true;
        continue;
      }
    } else if (c == ']' || c == '}') {
      if (flow == 0 && at_token) {
        return Error(source_name, line, "",
                     std::string("'") + c + "' closes nothing");
      }
      --depth;
      if (flow > 0) {
        --flow;
        node_start = false;
        token_end = true;
        after_key = true;
        continue;
      }
      if (depth < 0) depth = 0;  // text in a plain scalar: "c]d"
    } else if (c == ',' && flow > 0) {
      node_start = true;
      token_end = true;
      continue;
    } else if (c == ':' && (blank(next) || json_value)) {
      node_start = true;  // a value follows
      token_end = json_value;
      continue;
    } else if ((c == '-' || c == '?') && node_start && blank(next)) {
      continue;  // a block sequence entry or a complex key: a node follows
    }
    node_start = false;
  }
  if (quote) {
    return Error(source_name, line, "", "a quoted string is never closed");
  }
  if (depth != 0) {
    // yaml-cpp 0.7 can loop forever on an unclosed flow collection.
    return Error(source_name, first_open_line, "",
                 "this line opens a '[' or '{' that is never closed");
  }
  // Anchors, aliases, tags and the flow nesting, exactly: as yaml-cpp
  // reads the (first) document.
  std::istringstream in{std::string(text)};
  EventCheck events(source_name, kind, kMaxFlowDepth);
  try {
    YAML::Parser parser(in);
    parser.HandleNextDocument(events);
  } catch (const YAML::Exception&) {
    // A syntax error: the caller's load reports it, with its line.
  }
  return events.status();
}

int CountDocuments(std::string_view text) {
  int markers = 0;             // "---" lines
  bool content_first = false;  // content before the first marker
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view l = text.substr(start, end - start);
    start = end + 1;
    if (l.starts_with("---") &&
        (l.size() == 3 || l[3] == ' ' || l[3] == '\t' || l[3] == '\r')) {
      ++markers;
      continue;
    }
    size_t first = l.find_first_not_of(" \t\r");
    if (markers == 0 && first != std::string_view::npos && l[first] != '#') {
      content_first = true;
    }
  }
  int docs = markers + (content_first ? 1 : 0);
  return docs;
}

Result<Fields> Reader::Map(const YAML::Node& n, int line,
                           const std::string& path, Keys known) const {
  Fields out;
  out.line = LineOf(n, line);
  if (!n.IsMap()) {
    return Err(out.line, path,
               std::string("expected a map, got ") + TypeName(n));
  }
  for (const auto& kv : n) {
    const YAML::Node k = kv.first;
    const YAML::Node v = kv.second;
    int kline = LineOf(k, out.line);
    if (!k.IsScalar()) {
      return Err(kline, path,
                 std::string("expected a key name, got ") + TypeName(k));
    }
    const std::string& key = k.Scalar();
    std::string key_path = path.empty() ? key : path + "." + key;
    bool ok = false;
    for (std::string_view kn : known) ok = ok || kn == key;
    if (!ok) {
      std::string msg = "unknown key";
      std::string near = ClosestKey(key, known);
      if (!near.empty()) {
        msg += " (did you mean '" + near + "'?)";
      } else {
        msg += " (known keys: " + JoinKeys(known) + ")";
      }
      return Err(kline, key_path, msg);
    }
    if (const Field* prev = out.Get(key)) {
      return Err(kline, key_path,
                 "duplicate key (first given at line " +
                     std::to_string(prev->line) + ")");
    }
    out.Add(Field{key, LineOf(v, kline), v});
  }
  return out;
}

Status Reader::Required(const Fields& f, const std::string& path,
                        std::string_view key) const {
  if (f.Get(key) != nullptr) return Status::OK();
  return Err(f.line, path, "missing required key '" + std::string(key) + "'");
}

Result<std::vector<YAML::Node>> Reader::List(const Field& f,
                                             const std::string& path) const {
  std::vector<YAML::Node> out;
  if (f.value.IsNull()) return out;
  if (!f.value.IsSequence()) {
    return Err(f.line, path,
               std::string("expected a list, got ") + TypeName(f.value));
  }
  for (const auto& item : f.value) out.push_back(item);
  return out;
}

Result<std::string> Reader::Scalar(const Field& f,
                                   const std::string& path) const {
  if (!f.value.IsScalar()) {
    return Err(f.line, path,
               std::string("expected a value, got ") + TypeName(f.value));
  }
  const std::string& s = f.value.Scalar();
  if (std::string why = CheckText(s); !why.empty()) {
    return Err(f.line, path, "the value " + why);
  }
  return s;
}

Result<uint64_t> Reader::Uint(const Field& f, const std::string& path,
                              uint64_t lo, uint64_t hi) const {
  DCR_ASSIGN_OR_RETURN(std::string s, Scalar(f, path));
  auto v = ParseUint(s, lo, hi);
  if (!v.ok()) return Err(f.line, path, v.status().message());
  return v;
}

}  // namespace dcr::yaml_doc
