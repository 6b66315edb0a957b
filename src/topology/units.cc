// Units, scalar parsers, environment expansion and error formatting.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "common/printable.h"
#include "common/yaml_doc.h"
#include "dcr/topology.h"
#include "topology/internal.h"

namespace dcr {
namespace {

using yaml_doc::ParseUint;

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Splits "2.5Gbps" into the number (2.5) and the unit ("Gbps"). One space
// may separate them. `integral` is set when the number has no fraction.
struct Quantity {
  long double value = 0;
  uint64_t integer = 0;
  bool integral = true;
  std::string_view unit;
};

std::optional<Quantity> SplitQuantity(std::string_view s) {
  Quantity q;
  size_t i = 0;
  bool any = false;
  while (i < s.size() && IsDigit(s[i])) {
    int d = s[i] - '0';
    if (q.integer > (std::numeric_limits<uint64_t>::max() - d) / 10) {
      return std::nullopt;
    }
    q.integer = q.integer * 10 + static_cast<uint64_t>(d);
    any = true;
    ++i;
  }
  q.value = static_cast<long double>(q.integer);
  if (i < s.size() && s[i] == '.') {
    q.integral = false;
    ++i;
    long double scale = 0.1L;
    bool frac = false;
    while (i < s.size() && IsDigit(s[i])) {
      q.value += scale * (s[i] - '0');
      scale /= 10;
      frac = true;
      ++i;
    }
    if (!frac) return std::nullopt;
  }
  if (!any) return std::nullopt;
  if (i < s.size() && s[i] == ' ') ++i;
  q.unit = s.substr(i);
  if (q.unit.empty() && i != s.size()) return std::nullopt;
  return q;
}

// Multiplies q by `mult`; nullopt on overflow or a non-integral result
// that rounds to zero.
std::optional<uint64_t> Scale(const Quantity& q, uint64_t mult) {
  if (q.integral) {
    if (mult != 0 && q.integer > std::numeric_limits<uint64_t>::max() / mult)
      return std::nullopt;
    return q.integer * mult;
  }
  long double v = q.value * static_cast<long double>(mult);
  if (!std::isfinite(v) || v >= 9.2e18L) return std::nullopt;
  return static_cast<uint64_t>(std::llround(v));
}

// Decimal (k, M, G, T) or binary (Ki, Mi, Gi, Ti) prefix at the start of
// `u`; consumes it. Returns 1 when there is none.
uint64_t TakePrefix(std::string_view* u) {
  if (u->empty()) return 1;
  uint64_t dec = 0, bin = 0;
  switch ((*u)[0]) {
    case 'k':
    case 'K':
      dec = 1000ull, bin = 1ull << 10;
      break;
    case 'M':
    case 'm':
      dec = 1000000ull, bin = 1ull << 20;
      break;
    case 'G':
    case 'g':
      dec = 1000000000ull, bin = 1ull << 30;
      break;
    case 'T':
    case 't':
      dec = 1000000000000ull, bin = 1ull << 40;
      break;
    default:
      return 1;
  }
  u->remove_prefix(1);
  if (!u->empty() && (*u)[0] == 'i') {
    u->remove_prefix(1);
    return bin;
  }
  return dec;
}

// A value from the file or the environment, quoted for a message: cut to
// its first 80 bytes (with its length) and escaped (common/printable.h).
std::string Quote(std::string_view s) { return "'" + Abbreviated(s) + "'"; }

}  // namespace

Result<uint64_t> ParseBandwidth(std::string_view s) {
  auto bad = [&] {
    return Status::InvalidArgument(
        "expected a bandwidth like 25Gbps, 200Mbit/s or 100MB/s, got " +
        Quote(s));
  };
  auto q = SplitQuantity(s);
  if (!q) return bad();
  std::string_view u = q->unit;
  uint64_t mult = 1;
  if (!u.empty()) {
    mult = TakePrefix(&u);
    if (u == "bps" || u == "bit/s" || u == "bits/s" || u == "b/s") {
      // bits
    } else if (u == "Bps" || u == "B/s") {
      mult *= 8;
    } else {
      return bad();
    }
  }
  auto v = Scale(*q, mult);
  if (!v) return bad();
  if (*v == 0) {
    return Status::InvalidArgument("bandwidth must be positive, got " +
                                   Quote(s));
  }
  return *v;
}

Result<uint64_t> ParseSize(std::string_view s) {
  auto bad = [&] {
    return Status::InvalidArgument(
        "expected a size like 64MiB, 1GB or 4096 (bytes), got " + Quote(s));
  };
  auto q = SplitQuantity(s);
  if (!q) return bad();
  std::string_view u = q->unit;
  uint64_t mult = TakePrefix(&u);
  if (!u.empty() && u != "B") return bad();
  if (mult == 1 && !q->integral) return bad();
  auto v = Scale(*q, mult);
  if (!v) return bad();
  return *v;
}

Result<uint64_t> ParseDurationNs(std::string_view s) {
  auto bad = [&] {
    return Status::InvalidArgument(
        "expected a duration like 70ms, 1s, 10min or 250us, got " + Quote(s));
  };
  auto q = SplitQuantity(s);
  if (!q) return bad();
  uint64_t mult = 0;
  if (q->unit == "ns") {
    mult = 1;
  } else if (q->unit == "us" || q->unit == "\xc2\xb5s") {
    mult = 1000;
  } else if (q->unit == "ms") {
    mult = 1000000;
  } else if (q->unit == "s") {
    mult = 1000000000;
  } else if (q->unit == "min") {
    mult = 60000000000;
  } else if (q->unit == "h") {
    mult = 3600000000000;
  } else if (q->unit.empty() && q->integral && q->integer == 0) {
    return uint64_t{0};
  } else {
    return bad();
  }
  auto v = Scale(*q, mult);
  if (!v) return bad();
  return *v;
}

namespace {
struct Unit {
  uint64_t mult;
  const char* name;
};
std::string FormatExact(uint64_t v, std::initializer_list<Unit> units,
                        const char* base) {
  if (v == 0) return "0";
  for (const Unit& u : units) {
    if (v % u.mult == 0) return std::to_string(v / u.mult) + u.name;
  }
  return std::to_string(v) + base;
}
}  // namespace

std::string FormatBandwidth(uint64_t bps) {
  return FormatExact(bps,
                     {{1000000000000ull, "Tbps"},
                      {1000000000ull, "Gbps"},
                      {1000000ull, "Mbps"},
                      {1000ull, "Kbps"}},
                     "bps");
}

std::string FormatSize(uint64_t bytes) {
  return FormatExact(bytes,
                     {{1ull << 40, "TiB"},
                      {1ull << 30, "GiB"},
                      {1ull << 20, "MiB"},
                      {1ull << 10, "KiB"},
                      {1000000000000ull, "TB"},
                      {1000000000ull, "GB"},
                      {1000000ull, "MB"},
                      {1000ull, "KB"}},
                     "");
}

std::string FormatDuration(uint64_t ns) {
  return FormatExact(
      ns, {{1000000000ull, "s"}, {1000000ull, "ms"}, {1000ull, "us"}}, "ns");
}

Result<std::string> ExpandEnv(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c != '$' || i + 1 == s.size()) {
      out += c;
      continue;
    }
    if (s[i + 1] == '$') {
      out += '$';
      ++i;
      continue;
    }
    if (s[i + 1] != '{') {
      out += c;
      continue;
    }
    size_t close = s.find('}', i + 2);
    if (close == std::string_view::npos) {
      return Status::InvalidArgument("unterminated ${ in " + Quote(s));
    }
    std::string_view body = s.substr(i + 2, close - i - 2);
    std::string_view name = body;
    std::optional<std::string_view> fallback;
    if (size_t d = body.find(":-"); d != std::string_view::npos) {
      name = body.substr(0, d);
      fallback = body.substr(d + 2);
    }
    bool name_ok = !name.empty() && !IsDigit(name[0]);
    for (char n : name) {
      if (!(IsDigit(n) || n == '_' || (n >= 'A' && n <= 'Z') ||
            (n >= 'a' && n <= 'z'))) {
        name_ok = false;
      }
    }
    if (!name_ok) {
      return Status::InvalidArgument("bad variable reference ${" +
                                     Abbreviated(body) + "} in " + Quote(s) +
                                     " (expected ${NAME} or ${NAME:-default})");
    }
    const char* value = std::getenv(std::string(name).c_str());
    if (value != nullptr && *value != '\0') {
      out += value;
    } else if (fallback) {
      out += *fallback;
    } else if (value != nullptr) {
      // Set but empty, no default: empty, as in the shell.
    } else {
      return Status::InvalidArgument(
          "environment variable " + Abbreviated(name) +
          " is not set (write ${" + Abbreviated(name) +
          ":-default} to give a default)");
    }
    i = close;
  }
  return out;
}

std::string_view ChunkSourceName(ChunkSource s) {
  return s == ChunkSource::kObjstore ? "objstore" : "relay";
}

std::string_view ObjectStoreKindName(ObjectStoreKind k) {
  return k == ObjectStoreKind::kS3 ? "s3" : "dir";
}

std::string_view TransportKindName(TransportKind k) {
  return k == TransportKind::kUcx ? "ucx" : "tcp";
}

std::string_view StoreKindName(StoreKind k) {
  switch (k) {
    case StoreKind::kFile:
      return "file";
    case StoreKind::kShm:
      return "shm";
    case StoreKind::kMemory:
      break;
  }
  return "memory";
}

std::string_view LinkClassName(LinkClass c) {
  switch (c) {
    case LinkClass::kLan:
      return "lan";
    case LinkClass::kWan:
      return "wan";
    case LinkClass::kNone:
      break;
  }
  return "none";
}

namespace topology_internal {

Status Error(std::string_view source, int line, std::string_view path,
             std::string_view msg) {
  return yaml_doc::Error(source.empty() ? "<topology>" : source, line, path,
                         msg);
}

std::string CheckName(std::string_view name) {
  if (name.empty()) return "must not be empty";
  if (name.size() > 64) return "is longer than 64 characters";
  auto alnum = [](char c) {
    return IsDigit(c) || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
  };
  if (!alnum(name[0])) {
    return "must start with a letter or digit, got " + Quote(name);
  }
  for (char c : name) {
    if (!alnum(c) && c != '-' && c != '_') {
      return "may hold only letters, digits, '-' and '_', got " + Quote(name);
    }
  }
  return "";
}

std::string CheckHost(std::string_view host) {
  if (host.empty()) return "must not be empty";
  if (host.size() > 253) return "is longer than 253 characters";
  for (char c : host) {
    bool ok = IsDigit(c) || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
              c == '.' || c == '-' || c == ':' || c == '_' || c == '%';
    if (!ok) {
      return "expected a host name or IP address, got " + Quote(host);
    }
  }
  return "";
}

Result<TransportKind> ParseTransport(std::string_view s) {
  if (s == "tcp") return TransportKind::kTcp;
  if (s == "ucx") return TransportKind::kUcx;
  return Status::InvalidArgument("expected tcp or ucx, got " + Quote(s));
}

Result<ChunkSource> ParseChunkSource(std::string_view s) {
  if (s == "relay") return ChunkSource::kRelay;
  if (s == "objstore") return ChunkSource::kObjstore;
  return Status::InvalidArgument("expected relay or objstore, got " + Quote(s));
}

Result<ObjectStoreKind> ParseObjectStoreKind(std::string_view s) {
  if (s == "dir") return ObjectStoreKind::kDir;
  if (s == "s3") return ObjectStoreKind::kS3;
  return Status::InvalidArgument("expected dir or s3, got " + Quote(s));
}

Result<StoreKind> ParseStoreKind(std::string_view s) {
  if (s == "memory") return StoreKind::kMemory;
  if (s == "file") return StoreKind::kFile;
  if (s == "shm") return StoreKind::kShm;
  return Status::InvalidArgument("expected memory, file or shm, got " +
                                 Quote(s));
}

Result<StoreLocation> ParseStoreSpec(std::string_view s) {
  size_t colon = s.find(':');
  StoreLocation spec;
  DCR_ASSIGN_OR_RETURN(spec.kind, ParseStoreKind(s.substr(0, colon)));
  if (colon != std::string_view::npos) spec.path = s.substr(colon + 1);
  return spec;
}

Result<uint16_t> ParsePort(std::string_view s) {
  DCR_ASSIGN_OR_RETURN(uint64_t v, ParseUint(s, 1, 65535));
  return static_cast<uint16_t>(v);
}

Result<bool> ParseBool(std::string_view s) {
  if (s == "true") return true;
  if (s == "false") return false;
  return Status::InvalidArgument("expected true or false, got " + Quote(s));
}

Result<uint32_t> ParseMinCommit(std::string_view s) {
  if (s == "all") return uint32_t{0};
  auto v = ParseUint(s, 1, 1000000);
  if (!v.ok()) {
    return Status::InvalidArgument("expected \"all\" or an integer >= 1, got " +
                                   Quote(s));
  }
  return static_cast<uint32_t>(*v);
}

Result<uint32_t> ParseApplyThreads(std::string_view s) {
  if (s.empty()) return uint32_t{0};
  DCR_ASSIGN_OR_RETURN(uint64_t v, ParseUint(s, 1, kMaxApplyThreads));
  return static_cast<uint32_t>(v);
}

std::string EscapeEnv(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    out += s[i];
    if (s[i] == '$' && i + 1 < s.size() && (s[i + 1] == '$' || s[i + 1] == '{'))
      out += '$';
  }
  return out;
}

}  // namespace topology_internal
}  // namespace dcr
