#include "serving/pause_messages.h"

#include <nlohmann/json.hpp>

namespace dcr {
namespace {

using json = nlohmann::json;
using Op = PauseMsg::Op;

constexpr struct {
  Op op;
  const char* name;
} kOps[] = {{Op::kHello, "hello"},     {Op::kReady, "ready"},
            {Op::kFlipped, "flipped"}, {Op::kLive, "live"},
            {Op::kPrepare, "prepare"}, {Op::kCommit, "commit"},
            {Op::kAbort, "abort"},     {Op::kError, "error"},
            {Op::kPause, "pause"},     {Op::kPaused, "paused"}};

Status Bad(const std::string& why) {
  return Status::InvalidArgument("pause message: " + why);
}

Result<uint64_t> U64(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_unsigned()) {
    return Bad(std::string("\"") + key + "\" must be a non-negative integer");
  }
  return it->get<uint64_t>();
}

Result<uint32_t> Image(const json& j) {
  DCR_ASSIGN_OR_RETURN(uint64_t v, U64(j, "image"));
  if (v > 1) return Bad("\"image\" must be 0 or 1");
  return static_cast<uint32_t>(v);
}

Result<std::string> Str(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) {
    return Bad(std::string("\"") + key + "\" must be a string");
  }
  return it->get<std::string>();
}

Result<RefitId> Refit(const json& j) {
  DCR_ASSIGN_OR_RETURN(std::string hex, Str(j, "refit"));
  auto id = RefitId::FromHex(hex);
  if (!id.ok()) return Bad("\"refit\" must be 32 hex digits");
  return *id;
}

Result<Digest128> DigestOf(const json& j) {
  DCR_ASSIGN_OR_RETURN(std::string hex, Str(j, "digest"));
  auto d = Digest128::FromHex(hex);
  if (!d.ok()) return Bad("\"digest\" must be 32 hex digits");
  return *d;
}

}  // namespace

const char* PauseOpName(PauseMsg::Op op) {
  for (const auto& o : kOps) {
    if (o.op == op) return o.name;
  }
  return "?";
}

std::string EncodePauseMsg(const PauseMsg& m) {
  json j;
  j["op"] = PauseOpName(m.op);
  switch (m.op) {
    case Op::kHello:
      j["pid"] = m.pid;
      j["image"] = m.image ? json(*m.image) : json(nullptr);
      if (!m.cuda_ipc.empty()) j["cuda_ipc"] = m.cuda_ipc;
      break;
    case Op::kReady:
    case Op::kAbort:
    case Op::kPause:
    case Op::kPaused:
      j["refit"] = m.refit.ToHex();
      break;
    case Op::kFlipped:
      j["image"] = m.image.value_or(0);
      j["step"] = m.version.step;
      break;
    case Op::kPrepare:
      j["refit"] = m.refit.ToHex();
      j["step"] = m.version.step;
      break;
    case Op::kCommit:
      j["refit"] = m.refit.ToHex();
      [[fallthrough]];
    case Op::kLive:
      j["image"] = m.image.value_or(0);
      j["step"] = m.version.step;
      j["digest"] = m.version.digest.ToHex();
      j["flips"] = m.flips;
      if (m.op == Op::kLive && m.cuda) j["cuda"] = true;
      break;
    case Op::kError:
      // Bounded so that the line fits kMaxPauseLine even with every
      // byte escaped (\u00XX: 6 bytes).
      j["detail"] = m.detail.substr(0, 600);
      break;
  }
  // A detail cut inside a UTF-8 sequence is replaced, not thrown over.
  return j.dump(-1, ' ', /*ensure_ascii=*/true,
                json::error_handler_t::replace) +
         "\n";
}

Result<PauseMsg> DecodePauseMsg(std::string_view line) {
  if (line.size() >= kMaxPauseLine) {
    return Bad("longer than " + std::to_string(kMaxPauseLine - 1) + " bytes");
  }
  json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Bad("not a JSON object");
  DCR_ASSIGN_OR_RETURN(std::string name, Str(j, "op"));
  PauseMsg m;
  bool known = false;
  for (const auto& o : kOps) {
    if (name == o.name) {
      m.op = o.op;
      known = true;
    }
  }
  if (!known) return Bad("unknown op \"" + name.substr(0, 32) + "\"");
  switch (m.op) {
    case Op::kHello: {
      DCR_ASSIGN_OR_RETURN(m.pid, U64(j, "pid"));
      auto it = j.find("image");
      if (it == j.end()) return Bad("\"image\" is missing");
      if (!it->is_null()) {
        DCR_ASSIGN_OR_RETURN(uint32_t image, Image(j));
        m.image = image;
      }
      if (j.contains("cuda_ipc")) {
        DCR_ASSIGN_OR_RETURN(m.cuda_ipc, Str(j, "cuda_ipc"));
        if (m.cuda_ipc.empty() || m.cuda_ipc.front() != '/' ||
            m.cuda_ipc.size() > kMaxSocketPath ||
            m.cuda_ipc.find('\0') != std::string::npos) {
          return Bad(
              "\"cuda_ipc\" must be an absolute socket path of at most " +
              std::to_string(kMaxSocketPath) + " bytes");
        }
      }
      break;
    }
    case Op::kReady:
    case Op::kAbort:
    case Op::kPause:
    case Op::kPaused: {
      DCR_ASSIGN_OR_RETURN(m.refit, Refit(j));
      break;
    }
    case Op::kFlipped: {
      DCR_ASSIGN_OR_RETURN(uint32_t image, Image(j));
      m.image = image;
      DCR_ASSIGN_OR_RETURN(m.version.step, U64(j, "step"));
      break;
    }
    case Op::kPrepare: {
      DCR_ASSIGN_OR_RETURN(m.refit, Refit(j));
      DCR_ASSIGN_OR_RETURN(m.version.step, U64(j, "step"));
      break;
    }
    case Op::kCommit:
    case Op::kLive: {
      if (m.op == Op::kCommit) {
        DCR_ASSIGN_OR_RETURN(m.refit, Refit(j));
      }
      DCR_ASSIGN_OR_RETURN(uint32_t image, Image(j));
      m.image = image;
      DCR_ASSIGN_OR_RETURN(m.version.step, U64(j, "step"));
      DCR_ASSIGN_OR_RETURN(m.version.digest, DigestOf(j));
      DCR_ASSIGN_OR_RETURN(m.flips, U64(j, "flips"));
      if (m.op == Op::kLive && j.contains("cuda")) {
        const json& c = j["cuda"];
        if (!c.is_boolean()) return Bad("\"cuda\" must be true or false");
        m.cuda = c.get<bool>();
      }
      break;
    }
    case Op::kError: {
      DCR_ASSIGN_OR_RETURN(m.detail, Str(j, "detail"));
      break;
    }
  }
  return m;
}

}  // namespace dcr
