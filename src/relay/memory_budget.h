// How a relay splits a memory cap (dcr-relay --memory-limit) between the
// places that hold frames, so that its resident memory outside the store's
// mapping stays under the cap whatever its peers send and whatever the
// plan asks for (DESIGN invariant 7).
//
// A relay holds frames in five places. Each gets a bound from the cap:
//
//   reserve        code, threads, codec contexts, decode scratch and the
//                  span buffer (MappedFile::Modify's) per apply thread,
//                  allocator slack: kReserveBase plus kReservePerThread
//                  per apply thread;
//   forward        frames queued to children: the relay stops reading from
//                  its parent when a child's queue passes this, whatever
//                  window the plan names (the smaller wins);
//   apply          frames received and not yet applied (apply_window_bytes);
//   resend         recent frames kept for adopted children;
//   inbound        frames read from peers and not yet handled, per link:
//                  one frame being read (at most max_frame_payload) plus up
//                  to inbound_quota_bytes of whole frames waiting for the
//                  relay's thread, after which the link is paused. At most
//                  max_inbound_links links are open at once; more are
//                  closed at once.
//
// The frames are shared buffers, so one frame can sit in the forward,
// apply and resend bounds at once; counting it in each makes the sum a
// safe upper bound:
//
//   reserve + forward + apply + resend
//     + max_inbound_links * (max_frame_payload + inbound_quota_bytes)
//   <= limit
//
// What the cap does not cover: the store itself (a file or shm store is a
// mapping, counted by the kernel as RssFile or RssShmem, not RssAnon; a
// memory: store, for tests, is its size on the heap, as is its undo log).
// Kernel socket buffers are not the process's memory either.
#ifndef DCR_RELAY_MEMORY_BUDGET_H_
#define DCR_RELAY_MEMORY_BUDGET_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "dcr/status.h"

namespace dcr {

struct MemoryBudget {
  uint64_t limit = 0;
  uint64_t reserve = 0;
  uint64_t forward_window_bytes = 0;
  uint64_t apply_window_bytes = 0;
  uint64_t resend_buffer_bytes = 0;
  uint32_t max_frame_payload = 0;
  uint64_t inbound_quota_bytes = 0;
  size_t max_inbound_links = 0;

  // The bound the sum above gives; <= limit.
  uint64_t Total() const;
  // One line for the log: "512 MiB: forward 112 MiB, apply 112 MiB, ...".
  std::string ToString() const;
};

inline constexpr uint64_t kReserveBase = 32ull << 20;
// 8 MiB of decode scratch and up to kModifyBufferBytes (common/file.h) of
// span buffer.
inline constexpr uint64_t kReservePerThread = 12ull << 20;
// Chunk frames are at most a span's dense overwrite (4 MiB for 1 Mi FP32
// elements) plus its tables; PLAN frames carry the manifest (about 120
// bytes per tensor: 8 MiB holds about 70,000 tensors; above a cap of
// about 560 MiB the bound grows with the cap, 16 MiB at about 1.1 GiB).
inline constexpr uint32_t kMinFramePayloadUnderLimit = 8u << 20;
// With fewer links a relay could not hold its parent, a second parent
// adopting it, the root catching it up and a `dcr status` at once.
inline constexpr size_t kMinInboundLinks = 4;
inline constexpr size_t kMaxInboundLinks = 64;

// The split of `limit` bytes for a relay with `apply_threads` apply
// threads, whose frames may otherwise be up to `max_frame_payload` bytes:
//   the rest R = limit - reserve is shared: forward R/4, apply R/4,
//   resend R/8, inbound 3R/8;
//   max_frame_payload = clamp(R/64, kMinFramePayloadUnderLimit,
//   the given max), rounded down to a MiB; quota = one such frame;
//   links = inbound / (2 * frame), clamped to [kMinInboundLinks,
//   kMaxInboundLinks].
// InvalidArgument, naming the smallest cap that works, when `limit` is too
// small for that (the minimum links at the minimum frame size).
Result<MemoryBudget> PlanMemoryBudget(uint64_t limit, size_t apply_threads,
                                      uint32_t max_frame_payload);

// The smallest cap PlanMemoryBudget accepts for these arguments.
uint64_t MinMemoryLimit(size_t apply_threads, uint32_t max_frame_payload);

// The cap a relay takes when --memory-limit is not given: a quarter of the
// machine's memory (`machine_bytes`, MachineMemoryBytes()), at most
// kDefaultMemoryLimitMax, at least MinMemoryLimit. 2 GiB keeps the
// windows near their defaults (a 64 MiB apply window; a resend buffer of
// 250 MiB, about 4 default windows) and bounds frames to 31 MiB (a PLAN of
// about 270,000 tensors) and inbound links to 12, with 2 apply threads.
inline constexpr uint64_t kDefaultMemoryLimitMax = 2ull << 30;
inline constexpr uint64_t kDefaultMemoryLimitDivisor = 4;
uint64_t DefaultMemoryLimit(uint64_t machine_bytes, size_t apply_threads,
                            uint32_t max_frame_payload);

// The limit a cgroup file states: cgroup v2 memory.max ("max": none) or
// v1 memory.limit_in_bytes (a value of 2^60 or more: none). Nullopt also
// for text that is not a number.
std::optional<uint64_t> ParseCgroupMemoryLimit(std::string_view text);

// The memory this process may use: physical memory, or less where the
// process's cgroup (v2: its own and every ancestor's memory.max; v1:
// memory.limit_in_bytes) says so. 0 when unknown.
uint64_t MachineMemoryBytes();

}  // namespace dcr

#endif  // DCR_RELAY_MEMORY_BUDGET_H_
