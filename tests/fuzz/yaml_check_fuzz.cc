// Fuzzes the YAML safety check against yaml-cpp itself: whatever text
// yaml_doc::CheckSafe lets through, yaml-cpp must parse, without hanging
// (libFuzzer's -timeout), without an anchor or an alias and without flow
// collections nested deeper than the check's limit. The check refuses
// anchors and aliases through yaml-cpp's own event parse, so here that
// part guards against a change to it; what this target mostly tests is
// the text scan that runs before yaml-cpp is trusted with the text: that
// nothing it skips as a quoted string or a comment hides an unclosed or a
// deep bracket from it.
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "common/yaml_doc.h"

namespace {

// Aborts on any anchor or alias; counts flow collections' nesting.
class Oracle : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t anchor) override {
    NoAnchor(anchor);
  }
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override { std::abort(); }
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t anchor,
                const std::string&) override {
    NoAnchor(anchor);
  }
  void OnSequenceStart(const YAML::Mark&, const std::string&,
                       YAML::anchor_t anchor,
                       YAML::EmitterStyle::value style) override {
    Open(anchor, style);
  }
  void OnSequenceEnd() override { Close(); }
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value style) override {
    Open(anchor, style);
  }
  void OnMapEnd() override { Close(); }
  void OnAnchor(const YAML::Mark&, const std::string&) override {
    std::abort();
  }

 private:
  static void NoAnchor(YAML::anchor_t anchor) {
    if (anchor != YAML::NullAnchor) std::abort();
  }
  void Open(YAML::anchor_t anchor, YAML::EmitterStyle::value style) {
    NoAnchor(anchor);
    flow_.push_back(style == YAML::EmitterStyle::Flow);
    if (flow_.back() && ++flow_depth_ > 32) std::abort();
  }
  void Close() {
    if (flow_.empty()) return;
    if (flow_.back()) --flow_depth_;
    flow_.pop_back();
  }
  std::vector<bool> flow_;  // per open collection: whether it is a flow one
  int flow_depth_ = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return 0;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  if (!dcr::yaml_doc::CheckSafe(text, "fuzz.yaml", "topology").ok()) return 0;
  // One document, as the loaders take (more are refused by their count).
  if (dcr::yaml_doc::CountDocuments(text) > 1) return 0;
  std::istringstream in{std::string(text)};
  Oracle oracle;
  try {
    YAML::Parser parser(in);
    parser.HandleNextDocument(oracle);
  } catch (const YAML::Exception&) {
    // A syntax error: the loaders report it; nothing was hidden.
  }
  return 0;
}
