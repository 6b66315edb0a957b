#include "coord/baseline_stream.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <cassert>
#include <map>
#include <set>

#include "common/elapsed.h"
#include "common/failpoint.h"
#include "common/file.h"
#include "dcr/delta.h"

namespace dcr {
namespace {

using Clock = std::chrono::steady_clock;

// The byte range of span `s` of tensor `t` (in elements: first, count).
struct SpanRange {
  uint64_t offset;  // bytes into the tensor
  uint64_t bytes;
};

Result<SpanRange> RangeOf(const Manifest& m, const ChunkId& id,
                          uint64_t span_elems) {
  if (id.tensor >= m.size()) {
    return Status::Corruption(
        fmt::format("chunk names tensor {} of {}", id.tensor, m.size()));
  }
  const uint64_t n = m[id.tensor].NumElements();
  const uint64_t first = uint64_t{id.span} * span_elems;
  if (first >= n) {
    return Status::Corruption(
        fmt::format("chunk names span {} of tensor '{}', past its end", id.span,
                    m[id.tensor].name));
  }
  const size_t es = DTypeSize(m[id.tensor].dtype);
  return SpanRange{first * es, std::min(span_elems, n - first) * es};
}

}  // namespace

// ------------------------------------------------------- BaselineInStream

BaselineInStream::BaselineInStream(Options options) : o_(std::move(options)) {
  if (o_.record == nullptr || !o_.record->active()) active_ = false;
  if (o_.record) synced_at_ = o_.record->bytes();
}

BaselineInStream::~BaselineInStream() { (void)Join(); }

void BaselineInStream::SettleLastInBackground(size_t threads,
                                              std::function<void()> done) {
  assert(!last_.joinable());
  last_done_ = false;
  last_ = std::thread([this, threads, done = std::move(done)] {
    {
      ThreadPool pool(std::max<size_t>(1, threads));
      last_status_ = AfterBatchOn(/*last=*/true, &pool);
    }
    last_done_ = true;
    if (done) done();
  });
}

Status BaselineInStream::Join() {
  if (last_.joinable()) last_.join();
  return last_status_;
}

void BaselineInStream::Changed(const ChunkId& id) {
  if (active_) pending_.push_back(id);
}

Status BaselineInStream::AfterBatch(bool last) {
  return AfterBatchOn(last, o_.pool);
}

Status BaselineInStream::AfterBatchOn(bool last, ThreadPool* pool) {
  if (!active_) return Status::OK();
  if (!o_.record->active()) {
    // The record failed: what is written stays covered by the part of it
    // already synced (it is pinned); the rest waits for the pass after the
    // decision.
    spdlog::warn(
        "root.baseline: no longer updated while streaming (the delta "
        "history stopped); it is updated after the decision");
    active_ = false;
    return Status::OK();
  }
  if (!last && o_.record->bytes() - synced_at_ < o_.sync_bytes) {
    return Status::OK();
  }
  const auto t0 = Clock::now();
  Status s = Settle(pool);
  seconds_ += Seconds(t0, Clock::now());
  if (s.ok() && last && active_) done_ = true;
  return s;
}

Status BaselineInStream::Settle(ThreadPool* pool) {
  if (pending_.empty()) return Status::OK();
  if (!o_.record->Sync()) {
    active_ = false;
    return Status::OK();  // as in AfterBatch: nothing pending was written
  }
  synced_at_ = o_.record->bytes();
  if (!begun_) {
    // Durable before the first write: a crash from here on leaves the
    // baseline flagged, and --resume restores or finishes it.
    o_.record->Pin();
    if (Status s = o_.baseline->BeginRefit(o_.refit, o_.base, o_.to); !s.ok()) {
      spdlog::warn(
          "root.baseline: not updated while streaming ({}); it is updated "
          "after the decision",
          s.ToString());
      active_ = false;
      return Status::OK();
    }
    begun_ = true;
  }
  const Manifest& m = o_.target->manifest();
  std::vector<Status> errors(pending_.size());
  std::vector<uint64_t> bytes(pending_.size(), 0);
  pool->ParallelFor(pending_.size(), [&](size_t i, size_t) {
    const ChunkId& id = pending_[i];
    auto r = RangeOf(m, id, o_.span_elems);
    if (!r.ok()) {
      errors[i] = r.status();
      return;
    }
    DCR_FAILPOINT("coord.baseline_write");
    errors[i] = o_.baseline->WriteTensor(
        id.tensor, r->offset,
        o_.target->TensorData(id.tensor).subspan(r->offset, r->bytes));
    bytes[i] = r->bytes;
    writes_ended_.fetch_add(1, std::memory_order_relaxed);
  });
  for (size_t i = 0; i < pending_.size(); ++i) {
    if (!errors[i].ok()) {
      return errors[i].WithContext("writing root.baseline during the stream");
    }
    written_bytes_ += bytes[i];
  }
  written_spans_ += pending_.size();
  pending_.clear();
  return Status::OK();
}

// ------------------------------------------------------------ RestoreBase

Result<RestoreStats> RestoreBase(const std::string& log,
                                 const Checkpoint& target,
                                 WeightStore* baseline, uint64_t span_elems,
                                 ThreadPool* pool) {
  DCR_ASSIGN_OR_RETURN(auto file,
                       MappedFile::Open(log, MappedFile::Mode::kReadOnly));
  std::span<const std::byte> data = file->data();
  if (data.size() < kDeltaHeaderBytes) {
    return Status::Corruption(log + ": shorter than a delta header");
  }
  // A finished file says what it is; a temporary one (zero header) is
  // this refit's by its name.
  const auto head = data.first(kDeltaHeaderBytes);
  const bool finished = std::any_of(
      head.begin(), head.end(), [](std::byte b) { return b != std::byte{0}; });
  const Manifest& m = target.manifest();
  if (finished) {
    DCR_ASSIGN_OR_RETURN(DeltaHeader h, DecodeDeltaHeader(head));
    if (h.manifest != m.digest() || h.span_elems != span_elems) {
      return Status::InvalidArgument(
          log +
          ": a delta of another manifest or span length than the "
          "target's");
    }
  }
  // The chunks, whole ones only: a crash may have cut the last.
  struct Item {
    std::span<const std::byte> bytes;
    ChunkId id;
  };
  std::vector<Item> items;
  RestoreStats stats;
  uint64_t at = kDeltaHeaderBytes;
  while (at < data.size()) {
    auto h = PeekChunkHeader(data.subspan(at));
    if (!h.ok() || h->total_bytes > data.size() - at) {
      if (finished) {
        return Status::Corruption(log + ": chunk at byte " +
                                  std::to_string(at) + " is cut short" +
                                  (h.ok() ? "" : ": " + h.status().ToString()));
      }
      stats.torn_tail = true;
      break;
    }
    if (h->kind != ChunkKind::kXor) {
      return Status::InvalidArgument(
          log + ": holds an overwrite chunk; only XOR chunks can be undone");
    }
    items.push_back({data.subspan(at, h->total_bytes), h->id});
    at += h->total_bytes;
  }
  std::vector<Status> errors(items.size());
  std::vector<uint64_t> bytes(items.size(), 0);
  std::vector<uint8_t> undecodable(items.size(), 0);
  const size_t workers = pool ? pool->size() : 1;
  std::vector<std::unique_ptr<ChunkDecoder>> dec(workers);
  for (auto& d : dec) {
    DCR_ASSIGN_OR_RETURN(d, ChunkDecoder::Create());
  }
  std::vector<DecodedChunk> chunk(workers);
  std::vector<std::vector<std::byte>> scratch(workers);
  auto restore = [&](size_t i, size_t w) {
    const Item& it = items[i];
    auto r = RangeOf(m, it.id, span_elems);
    if (!r.ok()) {
      errors[i] = r.status();
      return;
    }
    Status s = dec[w]->Decode(it.bytes, &chunk[w]);
    if (!s.ok() && !finished) {
      // An unfinished log past its last sync may hold a chunk the crash
      // cut inside (zeros or stale bytes under a whole header): its span
      // was never written, so it keeps the base. (After a crash the
      // restore is checked by digest.)
      undecodable[i] = 1;
      return;
    }
    if (s.ok()) {
      auto src = target.TensorData(it.id.tensor).subspan(r->offset, r->bytes);
      scratch[w].assign(src.begin(), src.end());
      // target ^ (base ^ target): the base's bits.
      s = ApplyChunk(chunk[w], scratch[w]);
    }
    if (s.ok()) s = baseline->WriteTensor(it.id.tensor, r->offset, scratch[w]);
    errors[i] = std::move(s);
    bytes[i] = r->bytes;
  };
  if (pool) {
    pool->ParallelFor(items.size(), restore);
  } else {
    for (size_t i = 0; i < items.size(); ++i) restore(i, 0);
  }
  for (size_t i = 0; i < items.size(); ++i) {
    DCR_RETURN_IF_ERROR(errors[i].WithContext(log));
    if (undecodable[i]) {
      stats.torn_tail = true;
      continue;
    }
    stats.bytes += bytes[i];
    ++stats.spans;
  }
  return stats;
}

// ------------------------------------------------------------- FileStamps

FileStamps::Stamp FileStamps::Take(const std::string& path) {
  Stamp s;
  s.path = path;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return s;
  s.dev = st.st_dev;
  s.ino = st.st_ino;
  s.size = st.st_size;
  s.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  s.ok = true;
  return s;
}

FileStamps::FileStamps(const Checkpoint& c) {
  std::set<std::string> files;
  for (size_t i = 0; i < c.manifest().size(); ++i) files.insert(c.FileOf(i));
  for (const std::string& f : files) stamps_.push_back(Take(f));
}

std::string FileStamps::Changed() const {
  for (const Stamp& s : stamps_) {
    Stamp now = Take(s.path);
    if (!now.ok || !s.ok || now.dev != s.dev || now.ino != s.ino ||
        now.size != s.size || now.mtime_ns != s.mtime_ns) {
      return s.path;
    }
  }
  return "";
}

}  // namespace dcr
