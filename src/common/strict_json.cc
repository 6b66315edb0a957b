#include "common/strict_json.h"

#include <set>
#include <vector>

#include "common/printable.h"

namespace dcr {
namespace {

struct Rejected {
  std::string message;
};

}  // namespace

Result<nlohmann::json> ParseStrictJson(std::string_view text,
                                       const std::string& what,
                                       const StrictJsonOptions& options) {
  using Json = nlohmann::json;
  std::vector<std::set<std::string>> keys;  // one set per open object
  auto callback = [&](int depth, Json::parse_event_t event,
                      Json& parsed) -> bool {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        if (depth >= options.max_depth) {
          throw Rejected{"JSON nests deeper than " +
                         std::to_string(options.max_depth) + " levels"};
        }
        if (event == Json::parse_event_t::object_start) keys.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case Json::parse_event_t::key: {
        const std::string& key = parsed.get_ref<const std::string&>();
        if (!keys.empty() && !keys.back().insert(key).second) {
          throw Rejected{depth == options.named_depth
                             ? std::string(options.noun) + " '" +
                                   Printable(key) + "' appears twice"
                             : "key '" + Abbreviated(key) +
                                   "' appears twice in one object"};
        }
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), callback,
                       /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const Rejected& e) {
    return Status::Corruption(what + ": " + e.message);
  } catch (const Json::exception& e) {
    return Status::Corruption(what + ": malformed JSON: " + e.what());
  }
}

}  // namespace dcr
