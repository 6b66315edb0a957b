// Failpoints: named places in the relay daemon and the coordinator where a
// test makes the process fail on purpose (exit, hang, drop or corrupt what it
// was about to do, cut a link) at an exact moment, instead of racing a kill
// against a sleep. They are compiled into release binaries and cost one
// relaxed atomic load each while nothing is armed. Reference and examples:
// docs/TESTING.md §"Failpoints".
//
// A process arms its failpoints once, at the start of main, from the
// environment (InitFailpointsFromEnv); the library never reads the
// environment anywhere else. Unit tests arm them directly (ArmFailpoints).
//
// Spec grammar (DCR_FAILPOINTS):
//
//   SPEC   := RULE (';' RULE)*     empty rules and spaces around a rule are
//                                  ignored
//   RULE   := POINT '=' ACTION ['@' N]
//   ACTION := 'exit' | 'hang' | 'drop' | 'delay(' MS ')' | 'wait(' PATH ')'
//           | 'corrupt' | 'corrupt(' OFFSET ')' | 'cut(' BYTES ')' | 'forge'
//
// e.g. DCR_FAILPOINTS="relay.apply_chunk=exit@5;relay.forward=drop@3".
// POINT must be a known point (kFailpoints) that takes ACTION. `@N` fires
// the rule at the Nth hit of its point only (counting from 1, all rules of
// a point share one count); without it the rule fires at every hit. When
// several rules of one point match a hit, the first in the spec fires.
//
// Actions:
//   exit        logs, flushes the log and stdio, then _exit(86)
//               (kFailpointExitCode): no destructor, no atexit handler runs,
//               as if the process had been killed.
//   hang        logs, then blocks the hitting thread (sleeping) until the
//               process is killed. A relay whose actor thread hangs does not
//               finish SIGTERM either (its Stop joins that thread): kill -9.
//   delay(MS)   sleeps MS milliseconds and continues as if nothing fired.
//   wait(PATH)  blocks the hitting thread until the file PATH exists (polled
//               every 10 ms; an absolute path without ';', '@' or ')'),
//               then continues as if nothing fired: a window that lasts
//               exactly until the test has done its part. After an hour
//               without the file it logs an error and continues.
//   drop        the caller skips what it was about to do.
//   corrupt     the caller flips one byte (XOR 0xff) of what it was about to
//               send or apply, at OFFSET (default: the middle; an offset past
//               the end takes the last byte).
//   cut(BYTES)  the caller sends the first BYTES bytes of the frame it was
//               about to send, then closes the link.
//   forge       the caller sends a well-formed forgery instead of what it
//               was about to send: valid checksums and frame tag, altered
//               content (what a node holding the frame key could make).
// exit, hang, delay and wait are carried out inside Failpoint(); the caller
// sees only drop, corrupt, cut and forge (FailpointHit).
//
// Thread safety: Failpoint() may be called from any thread. Hits of one point
// are counted exactly: with `@N` exactly one hit fires, whichever thread
// makes it. ArmFailpoints and DisarmFailpoints are meant for startup (or a
// unit test between its threads' lifetimes): a hit racing them sees the old
// or the new rules.
#ifndef DCR_COMMON_FAILPOINT_H_
#define DCR_COMMON_FAILPOINT_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "dcr/status.h"

namespace dcr {

// The exit status of a process stopped by an `exit` failpoint.
inline constexpr int kFailpointExitCode = 86;

enum class FailAction : uint8_t {
  kNone = 0,
  kExit,
  kHang,
  kDrop,
  kDelay,
  kCorrupt,
  kCut,
  kForge,
  kWait,
};

// "exit", "hang", ...; "none" for kNone.
std::string_view FailActionName(FailAction action);

constexpr uint16_t FailActionBit(FailAction a) {
  return static_cast<uint16_t>(1u << static_cast<unsigned>(a));
}

// A known failpoint: its name, the actions that mean something there (a spec
// giving it another one is refused), and where it is.
struct FailpointInfo {
  std::string_view name;
  uint16_t actions;  // FailActionBit()s
  std::string_view where;
};

namespace failpoint_internal {
inline constexpr uint16_t kControl =
    FailActionBit(FailAction::kExit) | FailActionBit(FailAction::kHang) |
    FailActionBit(FailAction::kDelay) | FailActionBit(FailAction::kWait);
inline constexpr uint16_t kDrop = FailActionBit(FailAction::kDrop);
inline constexpr uint16_t kCorrupt = FailActionBit(FailAction::kCorrupt);
inline constexpr uint16_t kCut = FailActionBit(FailAction::kCut);
inline constexpr uint16_t kForge = FailActionBit(FailAction::kForge);
}  // namespace failpoint_internal

// The registry of failpoints. Appending one: add it here, hook it with
// DCR_FAILPOINT("name") and document it in docs/TESTING.md.
inline constexpr std::array<FailpointInfo, 15> kFailpoints = {{
    {"relay.plan", failpoint_internal::kControl | failpoint_internal::kDrop,
     "a relay got a PLAN, before binding it (drop: ignore the PLAN)"},
    {"relay.apply_chunk",
     failpoint_internal::kControl | failpoint_internal::kDrop |
         failpoint_internal::kCorrupt,
     "a relay queues a received CHUNK for applying (drop: do not apply it; "
     "corrupt: apply a damaged copy)"},
    {"relay.forward",
     failpoint_internal::kControl | failpoint_internal::kDrop |
         failpoint_internal::kCorrupt | failpoint_internal::kCut |
         failpoint_internal::kForge,
     "a relay forwards a CHUNK to its children (drop: not this chunk; "
     "corrupt: a damaged copy; cut: part of it, then close the child links; "
     "forge: a well-formed chunk with one value changed)"},
    {"relay.vote", failpoint_internal::kControl | failpoint_internal::kDrop,
     "a relay sends its subtree's VOTE up (drop: never send it)"},
    {"relay.commit", failpoint_internal::kControl | failpoint_internal::kDrop,
     "a relay got COMMIT, before forwarding or acting on it (drop: ignore "
     "it)"},
    {"relay.abort", failpoint_internal::kControl | failpoint_internal::kDrop,
     "a relay got ABORT, before forwarding or acting on it (drop: ignore "
     "it)"},
    {"coord.before_plan", failpoint_internal::kControl,
     "the coordinator persisted its epoch, before it sends any PLAN"},
    {"coord.after_stream", failpoint_internal::kControl,
     "the coordinator sent its last CHUNK, before END"},
    {"coord.before_commit", failpoint_internal::kControl,
     "the commit decision is durable in state_dir/decisions, before COMMIT "
     "is sent"},
    {"coord.after_commit", failpoint_internal::kControl,
     "every COMMIT_REPLY arrived (or timed out) and the baseline advanced, "
     "before the report and last-refit.json are written"},
    {"coord.baseline_write", failpoint_internal::kControl,
     "the root is about to write one span of the target into "
     "root.baseline, its record naming the refit in progress (during the "
     "stream, behind the history's undo log, or in the pass after the "
     "decision)"},
    {"store.data_sync",
     failpoint_internal::kControl | failpoint_internal::kDrop,
     "a file store's background write-back is about to write the committed "
     "data back (delay: hold it; exit: stop with the record still marked "
     "unsynced; drop: fail it, as a write-back error would)"},
    {"coord.upload",
     failpoint_internal::kControl | failpoint_internal::kDrop |
         failpoint_internal::kCorrupt,
     "the coordinator is about to store one CHUNK or END frame as an object "
     "for the clusters that pull from the object store (drop: never store "
     "it; corrupt: store a damaged copy)"},
    {"producer.send_chunk", failpoint_internal::kControl,
     "a trainer rank's producer is about to send one of its chunks to the "
     "coordinator (exit: the rank dies mid-refit)"},
    {"relay.loop", failpoint_internal::kControl,
     "a relay's event loop turns (at least every 200 ms; hang: the loop "
     "stops, as a hung relay's would, and a watchdog sees it)"},
}};

// An index into kFailpoints.
enum class FailpointId : uint8_t {};

// The id of a known failpoint. Evaluated at compile time: an unknown name
// does not compile.
consteval FailpointId FailpointIdOf(std::string_view name) {
  for (size_t i = 0; i < kFailpoints.size(); ++i) {
    if (kFailpoints[i].name == name) return static_cast<FailpointId>(i);
  }
  throw "unknown failpoint name: add it to kFailpoints in common/failpoint.h";
}

// What the caller of a failpoint must do. kNone: carry on.
struct FailpointHit {
  // kNone, kDrop, kCorrupt, kCut or kForge
  FailAction action = FailAction::kNone;
  // kCorrupt: the offset of the byte to flip (kCorruptMiddle: the middle);
  // kCut: how many bytes of the frame to send before closing.
  uint64_t arg = 0;

  static constexpr uint64_t kCorruptMiddle = ~uint64_t{0};

  bool drop() const { return action == FailAction::kDrop; }
  bool corrupt() const { return action == FailAction::kCorrupt; }
  bool cut() const { return action == FailAction::kCut; }
  bool forge() const { return action == FailAction::kForge; }
  // For kCorrupt: flips (XOR 0xff) the byte of `bytes` the rule names.
  // Does nothing for other actions or an empty span.
  void Corrupt(std::span<std::byte> bytes) const;
};

namespace failpoint_internal {
// True while any rule is armed. A process-wide switch by nature (the spec
// comes from the process's environment); a namespace-scope atomic rather
// than a function-local static so that the disarmed path is one relaxed
// load with no initialisation guard.
inline constinit std::atomic<bool> armed{false};
// The armed path: counts the hit, carries out exit/hang/delay/wait.
FailpointHit Hit(FailpointId id);
}  // namespace failpoint_internal

// Hits failpoint `id`. While nothing is armed: one relaxed atomic load.
inline FailpointHit Failpoint(FailpointId id) {
  if (!failpoint_internal::armed.load(std::memory_order_relaxed)) [[likely]] {
    return {};
  }
  return failpoint_internal::Hit(id);
}

// DCR_FAILPOINT("relay.forward"): hits the named failpoint (a string literal
// checked at compile time) and returns its FailpointHit.
#define DCR_FAILPOINT(name) ::dcr::Failpoint(::dcr::FailpointIdOf(name))

// Arms the rules of DCR_FAILPOINTS (nothing when unset or empty). Call once
// at the start of main, before any thread starts. A malformed spec is an
// InvalidArgument whose one-line message quotes the variable and names the
// rule and what is wrong with it:
//   DCR_FAILPOINTS="relay.vote=explode": unknown action 'explode' in
//   'relay.vote=explode' (actions: exit, hang, drop, delay(MS), wait(PATH),
//   corrupt, cut(BYTES), forge)
Status InitFailpointsFromEnv();

// Replaces every armed rule with those of `spec` and resets the hit counts
// ("" disarms). On error nothing changes; the message starts with
// `failpoints "SPEC": `.
Status ArmFailpoints(std::string_view spec);
// Disarms every rule and resets the hit counts.
void DisarmFailpoints();

// How many times `id` was hit since it was last armed (counted only while
// some rule is armed).
uint64_t TEST_FailpointHits(FailpointId id);

}  // namespace dcr

#endif  // DCR_COMMON_FAILPOINT_H_
