// The split of a relay's memory cap (contract in relay/memory_budget.h).
#include "relay/memory_budget.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <sstream>

#include "common/bytes.h"

namespace dcr {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

uint64_t Reserve(size_t apply_threads) {
  return kReserveBase + kReservePerThread * std::max<size_t>(apply_threads, 1);
}

}  // namespace

uint64_t MemoryBudget::Total() const {
  return reserve + forward_window_bytes + apply_window_bytes +
         resend_buffer_bytes +
         max_inbound_links *
             (uint64_t{max_frame_payload} + inbound_quota_bytes);
}

std::string MemoryBudget::ToString() const {
  return fmt::format(
      "{}: reserve {}, forward window {}, apply window {}, resend buffer {}, "
      "{} inbound links of {} frames + {} queued",
      HumanBytes(limit), HumanBytes(reserve), HumanBytes(forward_window_bytes),
      HumanBytes(apply_window_bytes), HumanBytes(resend_buffer_bytes),
      max_inbound_links, HumanBytes(max_frame_payload),
      HumanBytes(inbound_quota_bytes));
}

uint64_t MinMemoryLimit(size_t apply_threads, uint32_t max_frame_payload) {
  const uint64_t reserve = Reserve(apply_threads);
  const uint64_t floor_frame =
      std::min<uint64_t>(kMinFramePayloadUnderLimit, max_frame_payload);
  // The smallest rest R whose inbound share (3R/8) holds the minimum links
  // of the minimum frame (each link: a frame being read + one queued).
  const uint64_t min_rest = (kMinInboundLinks * 2 * floor_frame * 8 + 2) / 3;
  return (reserve + min_rest + kMiB - 1) / kMiB * kMiB;
}

uint64_t DefaultMemoryLimit(uint64_t machine_bytes, size_t apply_threads,
                            uint32_t max_frame_payload) {
  const uint64_t share =
      machine_bytes / kDefaultMemoryLimitDivisor / kMiB * kMiB;  // whole MiB
  return std::max(std::min(share, kDefaultMemoryLimitMax),
                  MinMemoryLimit(apply_threads, max_frame_payload));
}

std::optional<uint64_t> ParseCgroupMemoryLimit(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) {
    text.remove_suffix(1);
  }
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    return std::nullopt;  // "max", or not a number
  }
  if (v >= (1ull << 60)) return std::nullopt;  // v1's "no limit"
  return v;
}

namespace {

std::optional<uint64_t> ReadCgroupLimit(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  return ParseCgroupMemoryLimit(text.str());
}

}  // namespace

uint64_t MachineMemoryBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  uint64_t bytes = pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : 0;
  auto lower = [&](std::optional<uint64_t> limit) {
    if (limit && *limit > 0 && (bytes == 0 || *limit < bytes)) bytes = *limit;
  };
  std::ifstream cgroups("/proc/self/cgroup");
  std::string line;
  while (std::getline(cgroups, line)) {
    if (line.rfind("0::", 0) == 0) {
      // cgroup v2: this group and each ancestor up to the root.
      std::string path = line.substr(3);
      while (true) {
        lower(ReadCgroupLimit("/sys/fs/cgroup" + path + "/memory.max"));
        if (path.empty() || path == "/") break;
        path.resize(path.rfind('/'));
      }
    } else if (size_t c = line.find(":memory:"); c != std::string::npos) {
      lower(ReadCgroupLimit("/sys/fs/cgroup/memory" + line.substr(c + 8) +
                            "/memory.limit_in_bytes"));
      lower(ReadCgroupLimit("/sys/fs/cgroup/memory/memory.limit_in_bytes"));
    }
  }
  return bytes;
}

Result<MemoryBudget> PlanMemoryBudget(uint64_t limit, size_t apply_threads,
                                      uint32_t max_frame_payload) {
  const uint64_t reserve = Reserve(apply_threads);
  const uint64_t floor_frame =
      std::min<uint64_t>(kMinFramePayloadUnderLimit, max_frame_payload);
  const uint64_t min_limit = MinMemoryLimit(apply_threads, max_frame_payload);
  if (limit < min_limit) {
    return Status::InvalidArgument(fmt::format(
        "a memory limit of {} is too small for a relay with {} apply "
        "thread(s): it needs at least {} ({} for threads and codecs, {} for "
        "{} inbound links of {} frames and the windows)",
        HumanBytes(limit), apply_threads, HumanBytes(min_limit),
        HumanBytes(reserve), HumanBytes(min_limit - reserve), kMinInboundLinks,
        HumanBytes(floor_frame)));
  }
  MemoryBudget b;
  b.limit = limit;
  b.reserve = reserve;
  const uint64_t rest = limit - reserve;
  b.forward_window_bytes = rest / 4;
  b.apply_window_bytes = rest / 4;
  b.resend_buffer_bytes = rest / 8;
  const uint64_t inbound = rest - b.forward_window_bytes -
                           b.apply_window_bytes - b.resend_buffer_bytes;
  uint64_t frame = std::clamp<uint64_t>(
      rest / 64, floor_frame, std::max<uint64_t>(max_frame_payload, 1));
  if (frame >= kMiB) frame = frame / kMiB * kMiB;
  b.max_frame_payload = static_cast<uint32_t>(frame);
  b.inbound_quota_bytes = frame;
  b.max_inbound_links = static_cast<size_t>(std::clamp<uint64_t>(
      inbound / (2 * frame), kMinInboundLinks, kMaxInboundLinks));
  return b;
}

}  // namespace dcr
