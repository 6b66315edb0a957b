// Codec figures on one checkpoint pair (DESIGN.md §6, issue 16):
//   codec_bench sizes --base B --target T    sizes of the context-coded XOR
//                                            chunks (EncodeDiffInContext)
//                                            vs the order-0 and conditional
//                                            entropy floors, vs the plain
//                                            (base-independent) chunks and
//                                            vs dense XOR through zstd -1;
//                                            checks every chunk round-trips
//   codec_bench speed --base B --target T [--benchmark_* flags]
//                                            diff+encode and decode+apply
//                                            throughput of context-coded
//                                            chunks, 1 and 2 threads, and
//                                            of plain chunks, 1 thread
//   codec_bench journal --base B --target T [--journal-dir D]
//                                            decode+apply on one thread
//                                            with and without the relay
//                                            journal's write-ahead records
//   --as F16|F32|F8_E4M3                     sees the BF16 pair as that
//                                            dtype (ConvertBf16 below)
// bench/codec_figures.py runs both on traingen pairs and prints the table.
#include <benchmark/benchmark.h>
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/bytes.h"
#include "dcr/checkpoint.h"
#include "dcr/codec.h"
#include "dcr/dtype.h"
#include "dcr/entropy.h"
#include "dcr/fp8.h"
#include "dcr/shard_diff.h"
#include "dcr/thread_pool.h"
#include "session/journal.h"

namespace dcr {
namespace {

struct Span {
  ChunkId id;
  size_t w;
  ExponentField field;  // of the tensor's dtype; empty for integers
  std::span<const std::byte> base, target;
  std::span<std::byte> work;
};

struct Pair {
  std::vector<std::vector<std::byte>> base, target, work;
  std::vector<Span> spans;
  uint64_t bytes = 0;
};

Pair* g_pair = nullptr;
EncodeOptions g_encode;
uint64_t g_span_elems = kDefaultSpanElems;

// --as: a BF16 pair seen as another floating dtype, for the figures of
// dtypes traingen does not write. The same elements change as in the
// BF16 pair (F32 keeps the BF16 bits in its high half, below them a fixed
// pattern both versions share), or fewer where the dtype is coarser
// (F16 and F8_E4M3 round each value; E4M3 with one scale per tensor, the
// base's amax over 448, as a serving FP8 copy would).
float Bf16Value(const std::byte* p) {
  const uint32_t bits = uint32_t{LoadLE<uint16_t>(p)} << 16;
  return std::bit_cast<float>(bits);
}

std::vector<std::byte> ConvertBf16(std::span<const std::byte> in, DType to,
                                   float scale) {
  const size_t n = in.size() / 2;
  std::vector<std::byte> out(n * DTypeSize(to));
  for (size_t i = 0; i < n; ++i) {
    const std::byte* p = in.data() + 2 * i;
    if (to == DType::kF32) {
      const uint32_t low =
          static_cast<uint32_t>(i * 0x9E3779B97F4A7C15ull >> 48);
      StoreLE<uint32_t>(out.data() + 4 * i,
                        uint32_t{LoadLE<uint16_t>(p)} << 16 | low);
    } else if (to == DType::kF16) {
      StoreLE<uint16_t>(out.data() + 2 * i, FloatToHalf(Bf16Value(p)));
    } else {
      out[i] = std::byte{Fp8E4M3FromF32(Bf16Value(p) / scale)};
    }
  }
  return out;
}

float E4M3Scale(std::span<const std::byte> bf16) {
  float amax = 0;
  for (size_t i = 0; i < bf16.size() / 2; ++i) {
    amax = std::max(amax, std::fabs(Bf16Value(bf16.data() + 2 * i)));
  }
  return amax > 0 ? amax / kFp8E4M3Max : 1.0f;
}

// Copies both checkpoints into memory so timings exclude page faults;
// with `as` other than BF16, BF16 tensors are converted to it.
Pair* LoadPair(const std::string& base_path, const std::string& target_path,
               uint64_t span_elems, DType as) {
  auto b = Checkpoint::Open(base_path, Checkpoint::Mode::kReadOnly);
  auto t = Checkpoint::Open(target_path, Checkpoint::Mode::kReadOnly);
  if (!b.ok() || !t.ok()) {
    std::fprintf(stderr, "codec_bench: %s\n",
                 (!b.ok() ? b.status() : t.status()).ToString().c_str());
    std::exit(2);
  }
  if (!Manifest::Difference((*b)->manifest(), (*t)->manifest()).empty()) {
    std::fprintf(stderr, "codec_bench: checkpoints hold different tensors\n");
    std::exit(2);
  }
  auto* p = new Pair();
  const Manifest& m = (*b)->manifest();
  std::vector<DType> dtypes;
  for (size_t i = 0; i < m.size(); ++i) {
    auto bd = (*b)->TensorData(i);
    auto td = (*t)->TensorData(i);
    if (m[i].dtype == DType::kBF16 && as != DType::kBF16) {
      const float scale = as == DType::kF8E4M3 ? E4M3Scale(bd) : 1.0f;
      p->base.push_back(ConvertBf16(bd, as, scale));
      p->target.push_back(ConvertBf16(td, as, scale));
      dtypes.push_back(as);
    } else {
      p->base.emplace_back(bd.begin(), bd.end());
      p->target.emplace_back(td.begin(), td.end());
      dtypes.push_back(m[i].dtype);
    }
    p->work.push_back(p->base.back());
    p->bytes += p->base.back().size();
  }
  for (size_t i = 0; i < m.size(); ++i) {
    size_t w = DTypeSize(dtypes[i]);
    ExponentField field = ExponentFieldOf(dtypes[i]);
    uint64_t n = m[i].NumElements();
    for (uint64_t s = 0; s < SpanCount(n, span_elems); ++s) {
      uint64_t off = s * span_elems * w;
      uint64_t len = std::min(span_elems, n - s * span_elems) * w;
      p->spans.push_back(
          Span{ChunkId{static_cast<uint32_t>(i), static_cast<uint32_t>(s)}, w,
               field, std::span<const std::byte>(p->base[i]).subspan(off, len),
               std::span<const std::byte>(p->target[i]).subspan(off, len),
               std::span<std::byte>(p->work[i]).subspan(off, len)});
    }
  }
  return p;
}

uint64_t DenseXorZstd1(const Pair& p) {
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, 1);
  std::vector<std::byte> x(1 << 20);
  std::vector<char> out(ZSTD_CStreamOutSize());
  uint64_t total = 0;
  auto feed = [&](const void* data, size_t n, ZSTD_EndDirective end) {
    ZSTD_inBuffer in{data, n, 0};
    bool done = false;
    while (!done) {
      ZSTD_outBuffer o{out.data(), out.size(), 0};
      size_t r = ZSTD_compressStream2(c, &o, &in, end);
      total += o.pos;
      done = end == ZSTD_e_end ? r == 0 : in.pos == in.size;
    }
  };
  for (size_t t = 0; t < p.base.size(); ++t) {
    for (size_t off = 0; off < p.base[t].size(); off += x.size()) {
      size_t n = std::min(x.size(), p.base[t].size() - off);
      for (size_t i = 0; i < n; ++i)
        x[i] = p.base[t][off + i] ^ p.target[t][off + i];
      feed(x.data(), n, ZSTD_e_continue);
    }
  }
  feed(nullptr, 0, ZSTD_e_end);
  ZSTD_freeCCtx(c);
  return total;
}

// Encodes one span's XOR chunk, context-coded where the encoder's
// estimate says it pays (`context`) or base-independent.
Result<bool> EncodeXor(ChunkEncoder& enc, const Span& s, bool context,
                       std::vector<std::byte>* out,
                       ChunkSizes* sizes = nullptr) {
  if (!context) {
    return enc.EncodeDiff(ChunkKind::kXor, s.id, s.w, s.base, s.target, out,
                          sizes);
  }
  return enc.EncodeDiffInContext(ChunkKind::kXor, s.id, s.w, s.field, s.base,
                                 s.target, out, sizes,
                                 /*base_independent=*/nullptr);
}

// The XOR chunks of every span that changed, and the span each is for.
struct Chunks {
  std::vector<std::vector<std::byte>> bytes;
  std::vector<size_t> span_of;
};

// `reverse`: the chunks from the target back to the base.
Chunks EncodeAll(const Pair& p, bool context, bool reverse = false) {
  auto enc = std::move(*ChunkEncoder::Create(g_encode));
  Chunks c;
  for (size_t i = 0; i < p.spans.size(); ++i) {
    std::vector<std::byte> out;
    Span s = p.spans[i];
    if (reverse) std::swap(s.base, s.target);
    auto r = EncodeXor(*enc, s, context, &out);
    if (!r.ok()) {
      std::fprintf(stderr, "codec_bench: %s\n", r.status().ToString().c_str());
      std::exit(3);
    }
    if (*r) {
      c.bytes.push_back(std::move(out));
      c.span_of.push_back(i);
    }
  }
  return c;
}

int RunSizes(const Pair& p) {
  EntropyFloor floor;
  for (const auto& s : p.spans) floor.Add(s.w, s.field, s.base, s.target);
  auto enc = ChunkEncoder::Create(g_encode);
  auto dec = ChunkDecoder::Create();
  if (!enc.ok() || !dec.ok()) return 2;
  ChunkSizes xs, plain, os;
  uint64_t chunks = 0, context_chunks = 0, context_bytes = 0;
  std::vector<std::byte> out, work;
  DecodedChunk decoded;
  for (const auto& s : p.spans) {
    out.clear();
    auto r = EncodeXor(**enc, s, /*context=*/true, &out, &xs);
    if (!r.ok()) {
      std::fprintf(stderr, "codec_bench: %s\n", r.status().ToString().c_str());
      return 3;
    }
    if (*r) {
      ++chunks;
      auto h = PeekChunkHeader(out);
      if (h.ok() && h->encoding == ChunkEncoding::kContext) {
        ++context_chunks;
        context_bytes += out.size();
      }
      // Every chunk must rebuild the target from the base it was coded
      // against; a figure for a chunk that does not is no figure.
      work.assign(s.base.begin(), s.base.end());
      Status st = (*dec)->Decode(out, &decoded, nullptr, s.base);
      if (st.ok()) st = ApplyChunk(decoded, work);
      if (!st.ok() || !std::equal(work.begin(), work.end(), s.target.begin())) {
        std::fprintf(stderr,
                     "codec_bench: chunk of tensor %u span %u does not "
                     "round-trip: %s\n",
                     s.id.tensor, s.id.span, st.ToString().c_str());
        return 3;
      }
    }
    out.clear();
    (void)EncodeXor(**enc, s, /*context=*/false, &out, &plain);
    out.clear();
    (void)(*enc)->EncodeDiff(ChunkKind::kOverwrite, s.id, s.w, s.base, s.target,
                             &out, &os);
  }
  const double payload = static_cast<double>(xs.total());
  nlohmann::ordered_json j{
      {"checkpoint_bytes", p.bytes},
      {"elements", floor.elements()},
      {"changed", floor.changed()},
      {"change_rate", floor.change_rate()},
      {"floor_bytes", floor.floor_bytes()},
      {"floor_position_bytes", floor.position_bytes()},
      {"floor_value_bytes", floor.value_bytes()},
      {"conditional_floor_bytes", floor.conditional_floor_bytes()},
      {"conditional_position_bytes", floor.conditional_position_bytes()},
      {"conditional_value_bytes", floor.conditional_value_bytes()},
      {"chunks", chunks},
      {"context_chunks", context_chunks},
      {"payload_bytes", xs.total()},
      {"payload_position_bytes", xs.positions},
      {"payload_value_bytes", xs.values},
      {"payload_header_bytes", xs.header},
      {"context_payload_bytes", context_bytes},
      {"context_payload_fraction", payload > 0 ? context_bytes / payload : 0.0},
      {"plain_payload_bytes", plain.total()},
      {"plain_payload_position_bytes", plain.positions},
      {"plain_payload_value_bytes", plain.values},
      {"payload_over_floor", payload / floor.floor_bytes()},
      {"payload_over_conditional", payload / floor.conditional_floor_bytes()},
      {"plain_over_floor", plain.total() / floor.floor_bytes()},
      {"payload_over_plain", payload / static_cast<double>(plain.total())},
      {"overwrite_payload_bytes", os.total()},
      {"dense_xor_zstd1_bytes", DenseXorZstd1(p)},
      {"zstd_level", g_encode.zstd_level},
      {"roundtrip_verified", true}};
  std::printf("%s\n", j.dump(2).c_str());
  return 0;
}

// Diff + encode of every span; `context`: EncodeDiffInContext with no
// base-independent copy (a relay's first application), else EncodeDiff.
void Encode(benchmark::State& state, bool context) {
  const Pair& p = *g_pair;
  ThreadPool pool(static_cast<size_t>(state.range(0)));
  std::vector<std::unique_ptr<ChunkEncoder>> enc;
  std::vector<std::vector<std::byte>> out(pool.size());
  for (size_t i = 0; i < pool.size(); ++i) {
    enc.push_back(std::move(*ChunkEncoder::Create(g_encode)));
  }
  uint64_t payload = 0;
  std::atomic<uint64_t> failed{0};
  for (auto _ : state) {
    std::atomic<uint64_t> bytes{0};
    pool.ParallelFor(p.spans.size(), [&](size_t i, size_t w) {
      out[w].clear();
      if (!EncodeXor(*enc[w], p.spans[i], context, &out[w]).ok()) ++failed;
      bytes += out[w].size();
    });
    payload = bytes;
  }
  if (failed > 0) state.SkipWithError("encoding failed");
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * p.bytes));
  state.counters["payload_bytes"] = static_cast<double>(payload);
}

// Decode + apply of every chunk, in place, as a relay applies a span it
// holds: a context-coded chunk is decoded against the work copy (the
// decoder rebuilds the contexts from it: that scan is timed) and applied to
// it. Iterations alternate between the chunks from base to target and
// those from target back to base, so each decodes against the bits it was
// coded for and every iteration does the same work.
void DecodeApply(benchmark::State& state, bool context) {
  Pair& p = *g_pair;
  ThreadPool pool(static_cast<size_t>(state.range(0)));
  const Chunks chunks[2] = {EncodeAll(p, context),
                            EncodeAll(p, context, /*reverse=*/true)};
  for (size_t t = 0; t < p.base.size(); ++t) {
    std::copy(p.base[t].begin(), p.base[t].end(), p.work[t].begin());
  }
  std::vector<std::unique_ptr<ChunkDecoder>> dec;
  std::vector<DecodedChunk> scratch(pool.size());
  for (size_t i = 0; i < pool.size(); ++i) {
    dec.push_back(std::move(*ChunkDecoder::Create()));
  }
  std::atomic<uint64_t> failed{0};
  size_t dir = 0;
  for (auto _ : state) {
    const Chunks& c = chunks[dir];
    pool.ParallelFor(c.bytes.size(), [&](size_t i, size_t w) {
      const Span& s = p.spans[c.span_of[i]];
      if (!dec[w]->Decode(c.bytes[i], &scratch[w], nullptr, s.work).ok() ||
          !ApplyChunk(scratch[w], s.work).ok()) {
        ++failed;
      }
    });
    dir ^= 1;
  }
  if (failed > 0) state.SkipWithError("decode or apply failed");
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * p.bytes));
}

void BM_Encode(benchmark::State& state) { Encode(state, true); }
void BM_EncodePlain(benchmark::State& state) { Encode(state, false); }
void BM_DecodeApply(benchmark::State& state) { DecodeApply(state, true); }
void BM_DecodeApplyPlain(benchmark::State& state) { DecodeApply(state, false); }

// The cost of a relay's journal (session/journal.h) on its apply path: every
// XOR chunk decoded and applied on one thread, as a relay's apply worker
// does, without and then with the write-ahead record (positions and old
// values, appended to a file in `dir`) before each apply. Runs alternate,
// 5 of each; the medians are compared. Then the fdatasync that a yes vote
// costs on that journal.
int RunJournal(Pair& p, const std::string& dir) {
  const Chunks encoded = EncodeAll(p, /*context=*/false);
  const auto& chunks = encoded.bytes;
  const auto& span_of = encoded.span_of;
  uint64_t payload = 0;
  for (const auto& c : chunks) payload += c.size();
  auto dec = std::move(*ChunkDecoder::Create());
  DecodedChunk c;
  const std::string path = dir + "/codec_bench.dcr-journal";
  uint64_t journal_bytes = 0;
  std::vector<double> plain, journaled, syncs;
  using Clock = std::chrono::steady_clock;
  auto run = [&](bool with_journal) {
    std::unique_ptr<Journal> j;
    if (with_journal) {
      auto created = Journal::Create(path, JournalHeader{});
      if (!created.ok()) {
        std::fprintf(stderr, "codec_bench: %s\n",
                     created.status().ToString().c_str());
        std::exit(2);
      }
      j = *std::move(created);
    }
    const auto t0 = Clock::now();
    for (size_t i = 0; i < chunks.size(); ++i) {
      const Span& s = p.spans[span_of[i]];
      if (!dec->Decode(chunks[i], &c).ok()) std::exit(3);
      if (j &&
          !j->AppendApply(c, uint64_t{s.id.span} * g_span_elems * s.w, s.work)
               .ok()) {
        std::exit(4);
      }
      (void)ApplyChunk(c, s.work);
    }
    const double secs =
        std::chrono::duration<double>(Clock::now() - t0).count();
    (with_journal ? journaled : plain).push_back(secs);
    if (j) {
      journal_bytes = j->bytes();
      const auto s0 = Clock::now();
      if (!j->AppendVotedYes(Digest128{}).ok()) std::exit(5);
      syncs.push_back(std::chrono::duration<double>(Clock::now() - s0).count());
      (void)j->Remove();
    }
  };
  for (int rep = 0; rep < 5; ++rep) {
    run(false);
    run(true);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double a = median(plain), b = median(journaled);
  nlohmann::ordered_json j{
      {"checkpoint_bytes", p.bytes},
      {"chunks", chunks.size()},
      {"payload_bytes", payload},
      {"journal_bytes", journal_bytes},
      {"journal_over_payload", double(journal_bytes) / double(payload)},
      {"decode_apply_gbps_1t", double(p.bytes) / a / 1e9},
      {"decode_journal_apply_gbps_1t", double(p.bytes) / b / 1e9},
      {"journal_time_ratio", b / a},
      {"vote_fdatasync_ms", median(syncs) * 1e3},
      {"journal_dir", dir}};
  std::printf("%s\n", j.dump(2).c_str());
  return 0;
}

BENCHMARK(BM_Encode)->Arg(1)->Arg(2)->UseRealTime()->Unit(
    benchmark::kMillisecond);
BENCHMARK(BM_DecodeApply)
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
// The base-independent encoding, for reference (what history files,
// retries and partial receivers get).
BENCHMARK(BM_EncodePlain)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DecodeApplyPlain)
    ->Arg(1)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace dcr

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  std::string base, target, journal_dir = "/tmp";
  uint64_t span = dcr::kDefaultSpanElems;
  dcr::DType as = dcr::DType::kBF16;
  std::vector<char*> rest = {argv[0]};
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* flag) -> const char* {
      if (a == flag && i + 1 < argc) return argv[++i];
      return nullptr;
    };
    if (const char* v = value("--base")) {
      base = v;
    } else if (const char* v2 = value("--target")) {
      target = v2;
    } else if (const char* v3 = value("--span-elems")) {
      span = std::stoull(v3);
    } else if (const char* v4 = value("--level")) {
      dcr::g_encode.zstd_level = std::stoi(v4);
    } else if (const char* v5 = value("--journal-dir")) {
      journal_dir = v5;
    } else if (const char* v6 = value("--as")) {
      auto d = dcr::ParseDType(v6);
      if (!d.ok() || (*d != dcr::DType::kBF16 && *d != dcr::DType::kF16 &&
                      *d != dcr::DType::kF32 && *d != dcr::DType::kF8E4M3)) {
        std::fprintf(stderr,
                     "codec_bench: --as takes BF16, F16, F32 or F8_E4M3\n");
        return 2;
      }
      as = *d;
    } else {
      rest.push_back(argv[i]);
    }
  }
  if ((mode != "sizes" && mode != "speed" && mode != "journal") ||
      base.empty() || target.empty()) {
    std::fprintf(stderr,
                 "usage: codec_bench sizes|speed|journal --base B --target T "
                 "[--span-elems N] [--level L] [--journal-dir D] "
                 "[--as F16|F32|F8_E4M3] [--benchmark_* flags]\n"
                 "see bench/README.md; bench/codec_figures.py runs it on "
                 "traingen pairs\n");
    return 2;
  }
  dcr::g_pair = dcr::LoadPair(base, target, span, as);
  dcr::g_span_elems = span;
  if (mode == "sizes") return dcr::RunSizes(*dcr::g_pair);
  if (mode == "journal") return dcr::RunJournal(*dcr::g_pair, journal_dir);
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
