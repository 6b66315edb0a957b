#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>

#include "common/bytes.h"
#include "common/mutex.h"
#include "dcr/delta.h"
#include "dcr/thread_pool.h"

namespace dcr {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Location of one span inside a checkpoint.
struct SpanRef {
  ChunkId id;
  uint64_t offset;  // byte offset inside the tensor
  uint64_t bytes;
  size_t elem_size;
};

std::vector<SpanRef> EnumerateSpans(const Manifest& m, uint64_t span_elems) {
  std::vector<SpanRef> spans;
  for (size_t t = 0; t < m.size(); ++t) {
    size_t w = DTypeSize(m[t].dtype);
    uint64_t n = m[t].NumElements();
    for (uint64_t s = 0; s < SpanCount(n, span_elems); ++s) {
      uint64_t first = s * span_elems;
      uint64_t len = std::min(span_elems, n - first);
      spans.push_back(
          SpanRef{ChunkId{static_cast<uint32_t>(t), static_cast<uint32_t>(s)},
                  first * w, len * w, w});
    }
  }
  return spans;
}

// Collects the first error reported by parallel workers.
class FirstError {
 public:
  void Set(Status s) {
    if (s.ok()) return;
    MutexLock lock(&mu_);
    if (status_.ok()) status_ = std::move(s);
    failed_.store(true, std::memory_order_relaxed);
  }
  bool failed() const { return failed_.load(std::memory_order_relaxed); }
  Status Take() {
    MutexLock lock(&mu_);
    return std::move(status_);
  }

 private:
  Mutex mu_;
  Status status_ DCR_GUARDED_BY(mu_);
  std::atomic<bool> failed_{false};
};

template <typename T>
Result<std::vector<std::unique_ptr<T>>> MakePerWorker(size_t n,
                                                      const auto& make) {
  std::vector<std::unique_ptr<T>> v;
  for (size_t i = 0; i < n; ++i) {
    DCR_ASSIGN_OR_RETURN(auto x, make());
    v.push_back(std::move(x));
  }
  return v;
}

std::string ElementHex(std::span<const std::byte> data, uint64_t i, size_t w) {
  uint64_t v = 0;
  std::memcpy(&v, data.data() + i * w, w);
  return fmt::format("0x{:0{}x}", v, 2 * w);
}

}  // namespace

Result<DeltaStats> WriteDelta(const Checkpoint& base, const Checkpoint& target,
                              const std::string& path,
                              const DiffOptions& options, ThreadPool* pool) {
  auto start = Clock::now();
  std::string diff = Manifest::Difference(base.manifest(), target.manifest());
  if (!diff.empty()) {
    return Status::InvalidArgument("'" + base.path() + "' and '" +
                                   target.path() +
                                   "' hold different tensors: " + diff);
  }
  if (options.span_elems == 0 || options.span_elems > kMaxSpanElems) {
    return Status::InvalidArgument(
        fmt::format("span length must be between 1 and {} elements, got {}",
                    kMaxSpanElems, options.span_elems));
  }
  std::optional<ThreadPool> local;
  if (pool == nullptr) pool = &local.emplace(1);

  const Manifest& m = target.manifest();
  CheckpointDigests bd = base.ComputeDigests(pool);
  CheckpointDigests td = target.ComputeDigests(pool);

  DCR_ASSIGN_OR_RETURN(auto encoders,
                       MakePerWorker<ChunkEncoder>(pool->size(), [&] {
                         return ChunkEncoder::Create(options.encode);
                       }));
  DCR_ASSIGN_OR_RETURN(auto writer, DeltaWriter::Create(path));

  if (m.size() > UINT32_MAX) {
    return Status::InvalidArgument("too many tensors for 32-bit chunk ids");
  }
  for (const TensorInfo& t : m.tensors()) {
    if (SpanCount(t.NumElements(), options.span_elems) > UINT32_MAX) {
      return Status::InvalidArgument(fmt::format(
          "tensor '{}' would have more than 2^32 spans; use a larger "
          "--span-elems",
          t.name));
    }
  }
  std::vector<SpanRef> spans = EnumerateSpans(m, options.span_elems);
  DeltaStats stats;
  stats.checkpoint_bytes = m.TotalBytes();
  // Spans are encoded in parallel batches and written in order, so memory
  // stays bounded by the batch.
  const size_t batch = pool->size() * 8;
  std::vector<std::vector<std::byte>> out(batch);
  std::vector<ChunkSizes> sizes(batch);
  std::vector<uint8_t> wrote(batch);
  FirstError error;
  for (size_t first = 0; first < spans.size(); first += batch) {
    size_t count = std::min(batch, spans.size() - first);
    pool->ParallelFor(count, [&](size_t i, size_t worker) {
      if (error.failed()) return;
      const SpanRef& s = spans[first + i];
      out[i].clear();
      sizes[i] = ChunkSizes();
      auto b = base.TensorData(s.id.tensor).subspan(s.offset, s.bytes);
      auto t = target.TensorData(s.id.tensor).subspan(s.offset, s.bytes);
      auto r = encoders[worker]->EncodeDiff(options.kind, s.id, s.elem_size, b,
                                            t, &out[i], &sizes[i]);
      if (!r.ok()) {
        error.Set(r.status());
        return;
      }
      wrote[i] = *r ? 1 : 0;
      if (options.progress) options.progress(s.bytes);
    });
    if (error.failed()) return error.Take();
    for (size_t i = 0; i < count; ++i) {
      if (!wrote[i]) continue;
      DCR_RETURN_IF_ERROR(writer->Append(out[i]));
      ++stats.chunks;
      stats.sizes += sizes[i];
      auto h = PeekChunkHeader(out[i]);
      if (h.ok() && h->encoding == ChunkEncoding::kDense) {
        ++stats.dense_chunks;
      } else {
        ++stats.sparse_chunks;
      }
    }
  }
  DeltaHeader& h = stats.header;
  h.base = Version{options.base_step, bd.version};
  h.target = Version{options.target_step, td.version};
  h.manifest = m.digest();
  h.span_elems = options.span_elems;
  h.chunk_count = stats.chunks;
  h.tensor_count = m.size();
  h.total_elements = m.TotalElements();
  h.total_bytes = m.TotalBytes();
  h.changed_elements = stats.sizes.changed;
  h.all_overwrite = options.kind == ChunkKind::kOverwrite;
  DCR_RETURN_IF_ERROR(writer->Finish(h));
  stats.file_bytes = writer->bytes_written();
  stats.seconds = SecondsSince(start);
  return stats;
}

namespace {

// A chunk's bytes in the mapped delta, with the header and checksum seen
// when it was validated. The apply pass uses these, not a second reading
// of the file, to decide where to write: a file changed during the apply
// cannot steer a write outside the checked span.
struct IndexedChunk {
  std::span<const std::byte> bytes;
  ChunkHeader header;
  uint64_t checksum = 0;  // the chunk's XXH3-64 trailer
};

// True iff `bytes` still read as the chunk that was validated.
bool Unchanged(const IndexedChunk& c, const ChunkHeader& decoded) {
  return decoded.id == c.header.id && decoded.kind == c.header.kind &&
         decoded.encoding == c.header.encoding &&
         decoded.elem_size == c.header.elem_size &&
         decoded.span_elems == c.header.span_elems &&
         decoded.changed == c.header.changed &&
         decoded.total_bytes == c.header.total_bytes &&
         LoadLE<uint64_t>(c.bytes.data() + c.bytes.size() - 8) == c.checksum;
}

// Reads every chunk's framing and checks it: ids strictly ascending, spans
// no longer than the header's span length and, with a manifest, inside
// their tensors with widths matching dtypes.
Result<std::vector<IndexedChunk>> IndexChunks(DeltaReader* reader,
                                              const Manifest* m) {
  const DeltaHeader& h = reader->header();
  std::vector<IndexedChunk> chunks;
  chunks.reserve(h.chunk_count);
  std::optional<ChunkId> prev;
  while (true) {
    std::span<const std::byte> c;
    DCR_ASSIGN_OR_RETURN(bool more, reader->Next(&c));
    if (!more) break;
    DCR_ASSIGN_OR_RETURN(ChunkHeader ch, PeekChunkHeader(c));
    std::string where = fmt::format("{}: chunk {} ({})", reader->path(),
                                    chunks.size(), ChunkIdText(ch.id));
    if (prev && !(*prev < ch.id)) {
      return Status::Corruption(where + " is out of order or repeated");
    }
    // Parts of a span are disjoint; the whole span overlaps them all.
    if (prev && SameSpan(*prev, ch.id) && prev->part == 0) {
      return Status::Corruption(where + " is a part of a span the delta " +
                                "also carries whole");
    }
    prev = ch.id;
    if (ch.id.tensor >= h.tensor_count) {
      return Status::Corruption(where + " names a tensor past the manifest");
    }
    if (ch.span_elems > h.span_elems) {
      return Status::Corruption(where + " is longer than the delta's spans");
    }
    if (m != nullptr) {
      const TensorInfo& t = (*m)[ch.id.tensor];
      uint64_t n = t.NumElements();
      uint64_t spans = SpanCount(n, h.span_elems);
      if (ch.id.span >= spans ||
          ch.span_elems !=
              std::min<uint64_t>(h.span_elems, n - ch.id.span * h.span_elems) ||
          ch.elem_size != DTypeSize(t.dtype)) {
        return Status::Corruption(where + " does not fit tensor '" + t.name +
                                  "'");
      }
    }
    if (h.all_overwrite && ch.kind != ChunkKind::kOverwrite) {
      return Status::Corruption(where + " is XOR in an overwrite-only delta");
    }
    chunks.push_back(
        IndexedChunk{c, ch, LoadLE<uint64_t>(c.data() + c.size() - 8)});
  }
  return chunks;
}

Status DecodeAll(const std::vector<IndexedChunk>& chunks, ThreadPool* pool,
                 const std::string& path, std::vector<ChunkSizes>* sizes) {
  DCR_ASSIGN_OR_RETURN(
      auto decoders, MakePerWorker<ChunkDecoder>(
                         pool->size(), [] { return ChunkDecoder::Create(); }));
  std::vector<DecodedChunk> scratch(pool->size());
  std::vector<ChunkSizes> per_worker(pool->size());
  FirstError error;
  pool->ParallelFor(chunks.size(), [&](size_t i, size_t w) {
    if (error.failed()) return;
    Status s =
        decoders[w]->Decode(chunks[i].bytes, &scratch[w], &per_worker[w]);
    if (!s.ok())
      error.Set(s.WithContext(path + ": chunk " + std::to_string(i)));
  });
  if (sizes != nullptr) *sizes = std::move(per_worker);
  return error.Take();
}

}  // namespace

Result<DeltaStats> InspectDelta(const std::string& delta_path,
                                ThreadPool* pool) {
  auto start = Clock::now();
  std::optional<ThreadPool> local;
  if (pool == nullptr) pool = &local.emplace(1);
  DCR_ASSIGN_OR_RETURN(auto reader, DeltaReader::Open(delta_path));
  DCR_ASSIGN_OR_RETURN(auto chunks, IndexChunks(reader.get(), nullptr));
  std::vector<ChunkSizes> sizes;
  DCR_RETURN_IF_ERROR(DecodeAll(chunks, pool, delta_path, &sizes));
  DeltaStats stats;
  stats.header = reader->header();
  stats.checkpoint_bytes = stats.header.total_bytes;
  stats.chunks = chunks.size();
  for (const auto& s : sizes) stats.sizes += s;
  stats.sizes.changed = stats.header.changed_elements;
  for (const auto& c : chunks) {
    if (c.header.encoding == ChunkEncoding::kDense) {
      ++stats.dense_chunks;
    } else {
      ++stats.sparse_chunks;
    }
  }
  stats.file_bytes = reader->file_bytes();
  stats.seconds = SecondsSince(start);
  return stats;
}

Result<DeltaStats> ApplyDelta(const std::string& delta_path, Checkpoint* target,
                              ThreadPool* pool,
                              std::function<void(uint64_t)> progress) {
  auto start = Clock::now();
  if (target->mode() != Checkpoint::Mode::kReadWrite) {
    return Status::InvalidArgument("apply needs the target opened read-write");
  }
  std::optional<ThreadPool> local;
  if (pool == nullptr) pool = &local.emplace(1);
  DCR_ASSIGN_OR_RETURN(auto reader, DeltaReader::Open(delta_path));
  const DeltaHeader& h = reader->header();
  const Manifest& m = target->manifest();
  if (h.manifest != m.digest() || h.tensor_count != m.size()) {
    return Status::BaseMismatch(fmt::format(
        "'{}' was made for a checkpoint with other tensors (manifest {}); "
        "'{}' has manifest {}",
        delta_path, h.manifest.ShortHex(), target->path(),
        m.digest().ShortHex()));
  }
  CheckpointDigests digests = target->ComputeDigests(pool);
  bool repair = false;
  if (digests.version != h.base.digest) {
    if (digests.version == h.target.digest) {
      return Status::BaseMismatch(fmt::format(
          "'{}' already holds the delta's target version (step {}, {}); "
          "the delta was applied already",
          target->path(), h.target.step, h.target.digest.ShortHex()));
    }
    if (!h.all_overwrite) {
      return Status::BaseMismatch(fmt::format(
          "'{}' applies to base step {} ({}) but '{}' holds version {}",
          delta_path, h.base.step, h.base.digest.ShortHex(), target->path(),
          digests.version.ShortHex()));
    }
    // Overwrites are idempotent: applying them to a target left between
    // base and target (an apply that crashed) repairs it. The digest check
    // below decides; on a mismatch the target's bits are restored.
    repair = true;
    spdlog::warn(
        "'{}' is not at the delta's base; applying the overwrite delta as a "
        "repair and verifying the result",
        target->path());
  }
  // Validate everything before the first write.
  DCR_ASSIGN_OR_RETURN(auto chunks, IndexChunks(reader.get(), &m));
  DCR_RETURN_IF_ERROR(DecodeAll(chunks, pool, delta_path, nullptr));

  DCR_ASSIGN_OR_RETURN(
      auto decoders, MakePerWorker<ChunkDecoder>(
                         pool->size(), [] { return ChunkDecoder::Create(); }));
  std::vector<DecodedChunk> scratch(pool->size());
  // Overwrite chunks keep the values they replace until the result is
  // verified; XOR chunks undo by being applied again.
  std::vector<std::vector<std::byte>> undo(chunks.size());
  std::vector<uint8_t> applied(chunks.size(), 0);
  // Where chunk i writes: from its validated header only.
  auto span_of = [&](size_t i) {
    const ChunkHeader& ch = chunks[i].header;
    uint64_t w = ch.elem_size;
    return target->MutableTensorData(ch.id.tensor)
        .subspan(static_cast<uint64_t>(ch.id.span) * h.span_elems * w,
                 static_cast<uint64_t>(ch.span_elems) * w);
  };
  // Decodes chunk i again and checks it is still the chunk validated
  // before the first write (the file could have changed under the map).
  auto redecode = [&](size_t i, size_t w) -> Status {
    DCR_RETURN_IF_ERROR(decoders[w]->Decode(chunks[i].bytes, &scratch[w]));
    if (!Unchanged(chunks[i], scratch[w].header)) {
      return Status::Aborted(delta_path + " changed while it was applied");
    }
    return Status::OK();
  };
  auto rollback = [&]() -> Status {
    FirstError err;
    pool->ParallelFor(chunks.size(), [&](size_t i, size_t w) {
      if (!applied[i]) return;
      Status s = redecode(i, w);
      if (s.ok()) s = UndoChunk(scratch[w], undo[i], span_of(i));
      err.Set(s);
    });
    return err.Take();
  };
  FirstError error;
  pool->ParallelFor(chunks.size(), [&](size_t i, size_t w) {
    if (error.failed()) return;
    Status s = redecode(i, w);
    const DecodedChunk& c = scratch[w];
    if (s.ok()) {
      bool keep = c.header.kind == ChunkKind::kOverwrite;
      s = ApplyChunk(c, span_of(i), keep ? &undo[i] : nullptr);
    }
    if (!s.ok()) {
      error.Set(s.WithContext(delta_path + ": chunk " + std::to_string(i)));
      return;
    }
    applied[i] = 1;
    if (progress) {
      progress(static_cast<uint64_t>(c.header.span_elems) * c.header.elem_size);
    }
  });
  if (error.failed()) {
    Status undo_status = rollback();
    Status s = error.Take();
    if (!undo_status.ok()) {
      return Status::Internal(s.ToString() + "; restoring the base failed: " +
                              undo_status.ToString());
    }
    return s.WithContext("nothing changed");
  }
  // Verify: only tensors that chunks touched need rehashing.
  std::vector<uint8_t> touched(m.size(), 0);
  for (const auto& c : chunks) touched[c.header.id.tensor] = 1;
  std::vector<size_t> rehash;
  for (size_t t = 0; t < m.size(); ++t) {
    if (touched[t]) rehash.push_back(t);
  }
  pool->ParallelFor(rehash.size(), [&](size_t i, size_t) {
    digests.tensors[rehash[i]] = TensorDigest(target->TensorData(rehash[i]));
  });
  Digest128 result = VersionDigest(m.digest(), digests.tensors);
  if (result != h.target.digest) {
    Status undo_status = rollback();
    std::string what =
        fmt::format("after applying '{}' the target digest is {}, expected {}",
                    delta_path, result.ShortHex(), h.target.digest.ShortHex());
    if (!undo_status.ok()) {
      return Status::Internal(
          what + "; restoring the base failed: " + undo_status.ToString());
    }
    return Status::Corruption(what + (repair
                                          ? "; the target's bits were restored"
                                          : "; the base bits were restored"));
  }
  DCR_RETURN_IF_ERROR(target->Flush());
  DeltaStats stats;
  stats.header = h;
  stats.checkpoint_bytes = m.TotalBytes();
  stats.chunks = chunks.size();
  stats.file_bytes = reader->file_bytes();
  stats.sizes.changed = h.changed_elements;
  stats.seconds = SecondsSince(start);
  return stats;
}

std::vector<Mismatch> CompareCheckpoints(const Checkpoint& a,
                                         const Checkpoint& b,
                                         ThreadPool* pool) {
  std::vector<Mismatch> out;
  std::string diff = Manifest::Difference(a.manifest(), b.manifest());
  if (!diff.empty()) {
    Mismatch mm;
    mm.manifest_difference = diff;
    out.push_back(mm);
    return out;
  }
  std::optional<ThreadPool> local;
  if (pool == nullptr) pool = &local.emplace(1);
  const Manifest& m = a.manifest();
  std::vector<std::optional<Mismatch>> per(m.size());
  pool->ParallelFor(m.size(), [&](size_t t, size_t) {
    auto da = a.TensorData(t);
    auto db = b.TensorData(t);
    if (da.empty() || std::memcmp(da.data(), db.data(), da.size()) == 0) {
      return;
    }
    size_t w = DTypeSize(m[t].dtype);
    uint64_t n = m[t].NumElements();
    Mismatch mm;
    mm.tensor = m[t].name;
    bool first = true;
    for (uint64_t i = 0; i < n; ++i) {
      if (std::memcmp(da.data() + i * w, db.data() + i * w, w) == 0) continue;
      if (first) {
        mm.element = i;
        mm.a_hex = ElementHex(da, i, w);
        mm.b_hex = ElementHex(db, i, w);
        first = false;
      }
      ++mm.differing_elements;
    }
    per[t] = mm;
  });
  for (auto& p : per) {
    if (p) out.push_back(std::move(*p));
  }
  return out;
}

}  // namespace dcr
