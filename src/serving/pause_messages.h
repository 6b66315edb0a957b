// The pause protocol's messages (docs/PROTOCOL.md §"The pause protocol"):
// one JSON object per line on the relay's Unix socket, between a relay and
// the serving process attached to it.
//
//   server -> relay  hello    {"op":"hello","pid":N,"image":I|null
//                              [,"cuda_ipc":PATH]}
//                    ready    {"op":"ready","refit":"<32 hex>"}
//                    paused   {"op":"paused","refit":"<32 hex>"}
//                    flipped  {"op":"flipped","image":I,"step":N}
//   relay -> server  live     {"op":"live","image":I,"step":N,
//                              "digest":"<32 hex>","flips":F[,"cuda":B]}
//                    prepare  {"op":"prepare","refit":"<32 hex>","step":N}
//                    pause    {"op":"pause","refit":"<32 hex>"}
//                    commit   {"op":"commit","refit":"<32 hex>","image":I,
//                              "step":N,"digest":"<32 hex>","flips":F}
//                    abort    {"op":"abort","refit":"<32 hex>"}
//                    error    {"op":"error","detail":"..."}
//
// A server computing on GPU buffers it exported over CUDA IPC names the
// Unix socket serving its manifest in hello (`cuda_ipc`, an absolute path
// of at most kMaxSocketPath bytes); the relay answers live with
// `"cuda":true` once it attached them, and brackets each commit with
// pause/paused (docs/PROTOCOL.md §"GPU servers").
//
// Keys a message does not name are ignored (a later version may add some);
// a missing or mistyped key it names is an error. The optional keys above
// are written only when set (`cuda` only when true).
#ifndef DCR_SERVING_PAUSE_MESSAGES_H_
#define DCR_SERVING_PAUSE_MESSAGES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "dcr/status.h"
#include "dcr/version.h"

namespace dcr {

// The longest line either side sends or accepts, newline included.
inline constexpr size_t kMaxPauseLine = 4096;
// The longest `cuda_ipc` path: what a Unix socket address holds
// (sockaddr_un's sun_path, less its terminating zero).
inline constexpr size_t kMaxSocketPath = 107;

struct PauseMsg {
  enum class Op {
    kHello,
    kReady,
    kFlipped,
    kLive,
    kPrepare,
    kCommit,
    kAbort,
    kError,
    kPause,
    kPaused
  };
  Op op = Op::kHello;
  uint64_t pid = 0;               // hello
  std::optional<uint32_t> image;  // hello (nullopt: none), flipped, live,
                                  // commit
  std::string cuda_ipc;           // hello: "" when none
  RefitId refit;                  // ready, prepare, commit, abort, pause,
                                  // paused
  Version version;                // live, commit (step only: prepare,
                                  // flipped)
  uint64_t flips = 0;             // live, commit
  bool cuda = false;              // live
  std::string detail;             // error
  friend bool operator==(const PauseMsg&, const PauseMsg&) = default;
};

const char* PauseOpName(PauseMsg::Op op);

// One line, newline-terminated, at most kMaxPauseLine bytes.
std::string EncodePauseMsg(const PauseMsg& msg);
// `line` without its newline; InvalidArgument naming what is wrong.
Result<PauseMsg> DecodePauseMsg(std::string_view line);

}  // namespace dcr

#endif  // DCR_SERVING_PAUSE_MESSAGES_H_
