// dcr-traingen: writes consecutive BF16 checkpoints of a transformer-shaped
// model, each one real Adam step after the previous one, and reports how
// much of each step's delta is new information (the entropy floor of
// DESIGN.md §1). It is the source of realistic checkpoint pairs for tests
// and benchmarks.
//
// The model keeps fp32 master weights and fp32 Adam moments (12 bytes per
// parameter) plus a BF16 copy of a fixed random target and two BF16
// checkpoint buffers (6 bytes per parameter): about 2.8 GB for the default
// 154M-parameter model. Nothing else is allocated per step.
//
// Determinism: every random number is a pure function of (--seed, stream,
// tensor, block, element), where a block is a fixed range of kBlockElems
// elements of one tensor, so the output depends on --seed and the model
// options but never on --threads.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/dtype.h"
#include "dcr/entropy.h"
#include "dcr/layout.h"
#include "dcr/receiver_map.h"
#include "dcr/shard_diff.h"
#include "dcr/status.h"
#include "dcr/thread_pool.h"

namespace dcr {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; traingen writes host order");

constexpr char kProgram[] = "dcr-traingen";

// Elements per independently seeded block; also the unit of parallel work.
constexpr size_t kBlockElems = size_t{1} << 16;
// Noise is generated into a stack buffer of this many floats so the Adam
// loop itself has no loop-carried state and can be vectorized.
constexpr size_t kNoiseBatch = 1024;

// Synthetic gradient g = kPull * (w - anchor) + kNoise * N(0, 1).
// With weights and anchors both ~N(0, 0.02), w - anchor has a standard
// deviation of about 0.028, so the pull term is ~0.1 (up to ~0.5) and the
// noise term ~0.3 (bounded by 1.04): gradients are O(1e-2..1), depend on
// the weight, and keep a consistent direction that noise three times as
// large hides step by step, as in real training (gradient noise dominates
// a minibatch gradient). Adam normalizes the gradient scale away; these
// two set the signal-to-noise ratio, hence how steadily an element moves
// one way. With them, --lr 2e-6 changes ~2.7% of the default model's BF16
// elements per step, near the 1-5% of DESIGN.md section 1.
constexpr float kPull = 4.0f;
constexpr float kNoise = 0.3f;
constexpr float kInitStd = 0.02f;  // GPT-2-like init of linear/embeddings
constexpr float kAnchorStd = 0.02f;

constexpr double kBeta1 = 0.9;
constexpr double kBeta2 = 0.999;
constexpr float kEps = 1e-8f;

// Random streams; optimizer step t (1-based) draws from stream
// kStreamStepBase + t.
constexpr uint64_t kStreamInit = 0;
constexpr uint64_t kStreamAnchor = 1;
constexpr uint64_t kStreamStepBase = 2;

// splitmix64's output function applied to x + gamma: a strong 64-bit mix.
inline uint64_t Mix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t BlockSeed(uint64_t seed, uint64_t stream, uint64_t tensor,
                   uint64_t block) {
  return Mix64(Mix64(Mix64(Mix64(seed) ^ stream) ^ tensor) ^ block);
}

// Fills out[0..n) with approximately standard normal values: element i of
// a block is a function of (block seed, i) only (splitmix64 in counter
// mode). The value is an Irwin-Hall sum of the four 16-bit quarters of a
// 64-bit random word, centred and scaled to unit variance: bounded at
// +-3.46 but otherwise close to normal, and far cheaper than Box-Muller.
void FillNoise(uint64_t block_seed, uint64_t first, size_t n, float* out) {
  constexpr int32_t kMean = 2 * 65535;
  const float kScale = std::sqrt(3.0f) / 65536.0f;
  for (size_t i = 0; i < n; ++i) {
    uint64_t x = Mix64(block_seed + (first + i) * 0xD1B54A32D192ED03ull);
    int32_t s = static_cast<int32_t>((x & 0xFFFF) + ((x >> 16) & 0xFFFF) +
                                     ((x >> 32) & 0xFFFF) + (x >> 48)) -
                kMean;
    out[i] = static_cast<float>(s) * kScale;
  }
}

// Round to nearest even; a NaN stays a (quiet) NaN instead of rounding
// into infinity.
inline uint16_t FloatToBf16(float f) {
  uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

inline float Bf16ToFloat(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

struct Options {
  uint64_t hidden = 1024;
  uint64_t layers = 8;
  uint64_t heads = 16;
  uint64_t kv_heads = 4;
  uint64_t intermediate = 0;  // 0: derived from hidden
  uint64_t vocab = 32000;
  double lr = 2e-6;
  double weight_decay = 0.0;
  uint64_t steps = 3;
  uint64_t seed = 1;
  uint64_t warmup = 10;
  std::string out;
  std::string layout;    // empty: no shards
  bool serving = false;  // the layout's ranks are a server's (copies too)
  size_t threads = 0;
  std::string output = "text";
};

enum class Init { kNormal, kOnes };

struct TensorSpec {
  std::string name;
  std::vector<uint64_t> shape;
  Init init = Init::kNormal;
  uint64_t offset = 0;  // first element in the flat parameter arrays
  uint64_t elements = 0;
};

// A block of one tensor: elements [offset, offset + count) of the flat
// arrays, which is block `index` of tensor `tensor`.
struct Block {
  uint32_t tensor;
  uint64_t index;
  uint64_t offset;
  uint32_t count;
};

uint64_t DefaultIntermediate(uint64_t hidden) {
  // Llama's 8/3 * hidden rounded up to a multiple of 256 is ~2.69x for
  // common sizes; 2.6875 = 43/16 and rounding to 64 keeps small models
  // small.
  uint64_t n = (hidden * 43 / 16 + 32) / 64 * 64;
  return std::max<uint64_t>(n, 64);
}

Status Validate(const Options& o) {
  if (o.hidden == 0) return Status::InvalidArgument("--hidden must be > 0");
  if (o.serving && o.layout.empty()) {
    return Status::InvalidArgument("--serving reads --layout: give both");
  }
  if (o.heads == 0 || o.hidden % o.heads != 0) {
    return Status::InvalidArgument(fmt::format(
        "--heads {} must be > 0 and divide --hidden {}", o.heads, o.hidden));
  }
  if (o.kv_heads == 0 || o.heads % o.kv_heads != 0) {
    return Status::InvalidArgument(
        fmt::format("--kv-heads {} must be > 0 and divide --heads {}",
                    o.kv_heads, o.heads));
  }
  if (o.vocab == 0) return Status::InvalidArgument("--vocab must be > 0");
  if (!(o.lr > 0) || !std::isfinite(o.lr)) {
    return Status::InvalidArgument("--lr must be a positive number");
  }
  if (!(o.weight_decay >= 0) || !std::isfinite(o.weight_decay)) {
    return Status::InvalidArgument("--weight-decay must be >= 0");
  }
  // Keeps every product below in range and the tool honest about memory.
  constexpr uint64_t kMaxDim = uint64_t{1} << 24;
  for (uint64_t d : {o.hidden, o.vocab, o.intermediate, o.layers}) {
    if (d > kMaxDim) {
      return Status::InvalidArgument(
          fmt::format("model dimension {} is too large (max {})", d, kMaxDim));
    }
  }
  return Status::OK();
}

Result<std::vector<TensorSpec>> BuildModel(const Options& o) {
  const uint64_t h = o.hidden;
  const uint64_t kv_dim = h / o.heads * o.kv_heads;
  const uint64_t inter = o.intermediate;
  std::vector<TensorSpec> t;
  auto add = [&](std::string name, std::vector<uint64_t> shape, Init init) {
    t.push_back({std::move(name), std::move(shape), init, 0, 0});
  };
  add("model.embed_tokens.weight", {o.vocab, h}, Init::kNormal);
  for (uint64_t i = 0; i < o.layers; ++i) {
    std::string p = fmt::format("model.layers.{}.", i);
    add(p + "input_layernorm.weight", {h}, Init::kOnes);
    add(p + "self_attn.q_proj.weight", {h, h}, Init::kNormal);
    add(p + "self_attn.k_proj.weight", {kv_dim, h}, Init::kNormal);
    add(p + "self_attn.v_proj.weight", {kv_dim, h}, Init::kNormal);
    add(p + "self_attn.o_proj.weight", {h, h}, Init::kNormal);
    add(p + "post_attention_layernorm.weight", {h}, Init::kOnes);
    add(p + "mlp.gate_proj.weight", {inter, h}, Init::kNormal);
    add(p + "mlp.up_proj.weight", {inter, h}, Init::kNormal);
    add(p + "mlp.down_proj.weight", {h, inter}, Init::kNormal);
  }
  add("model.norm.weight", {h}, Init::kOnes);
  add("lm_head.weight", {o.vocab, h}, Init::kNormal);

  constexpr uint64_t kMaxParams = uint64_t{1} << 36;
  uint64_t offset = 0;
  for (TensorSpec& s : t) {
    uint64_t n = 1;
    for (uint64_t d : s.shape) n *= d;
    s.offset = offset;
    s.elements = n;
    offset += n;
    if (offset > kMaxParams) {
      return Status::InvalidArgument(
          fmt::format("model has more than {} parameters", kMaxParams));
    }
  }
  return t;
}

// Per-step figures, for the table and the JSON report.
struct StepReport {
  uint64_t step = 0;
  double change_rate = 0;
  uint64_t changed = 0;
  double floor_bytes = 0;
  double position_bytes = 0;
  double value_bytes = 0;
  uint64_t checkpoint_bytes = 0;
};

// Owns the fp32 optimizer state and the BF16 checkpoint buffers and runs
// Adam steps over them in parallel. Not thread-safe.
class Trainer {
 public:
  static Result<std::unique_ptr<Trainer>> Create(
      std::vector<TensorSpec> tensors, const Options& options,
      ThreadPool* pool);

  uint64_t params() const { return params_; }
  const std::vector<TensorSpec>& tensors() const { return tensors_; }

  // Draws the initial weights and the anchors; zeroes the Adam moments.
  void Init();
  // One Adam step (the t-th, 1-based). Without `out` only the master
  // weights move. With it, writes the new BF16 weights into buffer `out`
  // and accumulates the delta from buffer `prev` into `floors` (one per
  // pool worker).
  void Step(uint64_t t, int prev, int out, std::vector<EntropyFloor>* floors);
  // Writes the BF16 rounding of the master weights into buffer `out`.
  void Snapshot(int out);
  // Writes buffer `buf` as a .safetensors file.
  Status Write(int buf, const std::string& path, uint64_t step) const;
  // Writes buffer `buf` as every rank's shards under `layout`, one
  // .safetensors file per rank in directory `dir`.
  Status WriteShards(int buf, const Layout& layout, const std::string& dir,
                     uint64_t step) const;

 private:
  Trainer(std::vector<TensorSpec> tensors, const Options& options,
          ThreadPool* pool)
      : tensors_(std::move(tensors)), options_(options), pool_(pool) {}

  void StepBlock(const Block& b, uint64_t t, const uint16_t* prev,
                 uint16_t* out, EntropyFloor* floor);

  std::vector<TensorSpec> tensors_;
  Options options_;
  ThreadPool* pool_;
  uint64_t params_ = 0;
  std::vector<Block> blocks_;
  std::unique_ptr<float[]> master_;
  std::unique_ptr<float[]> m_;
  std::unique_ptr<float[]> v_;
  std::unique_ptr<uint16_t[]> anchor_;  // BF16: a target needs no precision
  std::unique_ptr<uint16_t[]> bf16_[2];
};

Result<std::unique_ptr<Trainer>> Trainer::Create(
    std::vector<TensorSpec> tensors, const Options& options, ThreadPool* pool) {
  std::unique_ptr<Trainer> tr(new Trainer(std::move(tensors), options, pool));
  for (size_t i = 0; i < tr->tensors_.size(); ++i) {
    const TensorSpec& s = tr->tensors_[i];
    for (uint64_t b = 0; b * kBlockElems < s.elements; ++b) {
      uint64_t begin = b * kBlockElems;
      uint64_t count = std::min<uint64_t>(kBlockElems, s.elements - begin);
      tr->blocks_.push_back({static_cast<uint32_t>(i), b, s.offset + begin,
                             static_cast<uint32_t>(count)});
    }
    tr->params_ += s.elements;
  }
  const size_t n = tr->params_;
  // Left uninitialized here: Init() touches every page in parallel.
  tr->master_.reset(new (std::nothrow) float[n]);
  tr->m_.reset(new (std::nothrow) float[n]);
  tr->v_.reset(new (std::nothrow) float[n]);
  tr->anchor_.reset(new (std::nothrow) uint16_t[n]);
  tr->bf16_[0].reset(new (std::nothrow) uint16_t[n]);
  tr->bf16_[1].reset(new (std::nothrow) uint16_t[n]);
  if (!tr->master_ || !tr->m_ || !tr->v_ || !tr->anchor_ || !tr->bf16_[0] ||
      !tr->bf16_[1]) {
    return Status::ResourceExhausted(
        fmt::format("cannot allocate {:.2f} GiB for {} parameters",
                    static_cast<double>(n) * 18 / (1ull << 30), n));
  }
  return tr;
}

void Trainer::Init() {
  const uint64_t seed = options_.seed;
  pool_->ParallelFor(blocks_.size(), [&](size_t i, size_t) {
    const Block& b = blocks_[i];
    const TensorSpec& s = tensors_[b.tensor];
    float* w = master_.get() + b.offset;
    uint16_t* anchor = anchor_.get() + b.offset;
    float base = s.init == Init::kOnes ? 1.0f : 0.0f;
    float noise[kNoiseBatch];
    uint64_t w_seed = BlockSeed(seed, kStreamInit, b.tensor, b.index);
    uint64_t a_seed = BlockSeed(seed, kStreamAnchor, b.tensor, b.index);
    for (size_t j = 0; j < b.count; j += kNoiseBatch) {
      size_t n = std::min<size_t>(kNoiseBatch, b.count - j);
      if (s.init == Init::kOnes) {
        std::fill_n(w + j, n, 1.0f);
      } else {
        FillNoise(w_seed, j, n, noise);
        for (size_t k = 0; k < n; ++k) w[j + k] = kInitStd * noise[k];
      }
      FillNoise(a_seed, j, n, noise);
      for (size_t k = 0; k < n; ++k) {
        anchor[j + k] = FloatToBf16(base + kAnchorStd * noise[k]);
      }
    }
    std::fill_n(m_.get() + b.offset, b.count, 0.0f);
    std::fill_n(v_.get() + b.offset, b.count, 0.0f);
    std::fill_n(bf16_[0].get() + b.offset, b.count, uint16_t{0});
    std::fill_n(bf16_[1].get() + b.offset, b.count, uint16_t{0});
  });
}

void Trainer::StepBlock(const Block& b, uint64_t t, const uint16_t* prev,
                        uint16_t* out, EntropyFloor* floor) {
  // Adam with bias correction, in PyTorch's formulation:
  //   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
  //   w -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
  // with decoupled weight decay (AdamW) applied first: w *= 1 - lr * wd.
  const float step_size =
      static_cast<float>(options_.lr / (1 - std::pow(kBeta1, t)));
  const float inv_sqrt_bc2 =
      static_cast<float>(1 / std::sqrt(1 - std::pow(kBeta2, t)));
  const float decay =
      static_cast<float>(1 - options_.lr * options_.weight_decay);
  const float b1 = static_cast<float>(kBeta1);
  const float b2 = static_cast<float>(kBeta2);
  const float one_minus_b1 = static_cast<float>(1 - kBeta1);
  const float one_minus_b2 = static_cast<float>(1 - kBeta2);

  float* __restrict w = master_.get() + b.offset;
  float* __restrict m = m_.get() + b.offset;
  float* __restrict v = v_.get() + b.offset;
  const uint16_t* __restrict anchor = anchor_.get() + b.offset;
  uint16_t* __restrict o = out ? out + b.offset : nullptr;
  const uint64_t noise_seed =
      BlockSeed(options_.seed, kStreamStepBase + t, b.tensor, b.index);
  float noise[kNoiseBatch];
  for (size_t j = 0; j < b.count; j += kNoiseBatch) {
    const size_t n = std::min<size_t>(kNoiseBatch, b.count - j);
    FillNoise(noise_seed, j, n, noise);
    for (size_t k = 0; k < n; ++k) {
      const size_t i = j + k;
      const float g =
          kPull * (w[i] - Bf16ToFloat(anchor[i])) + kNoise * noise[k];
      const float mi = b1 * m[i] + one_minus_b1 * g;
      const float vi = b2 * v[i] + one_minus_b2 * (g * g);
      m[i] = mi;
      v[i] = vi;
      w[i] =
          w[i] * decay - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + kEps);
    }
    if (o != nullptr) {
      for (size_t k = 0; k < n; ++k) o[j + k] = FloatToBf16(w[j + k]);
    }
  }
  if (o != nullptr) {
    auto bytes = [&](const uint16_t* p) {
      return std::as_bytes(std::span<const uint16_t>(p + b.offset, b.count));
    };
    floor->Add(2, bytes(prev), bytes(out));
  }
}

void Trainer::Step(uint64_t t, int prev, int out,
                   std::vector<EntropyFloor>* floors) {
  const uint16_t* prev_buf = out >= 0 ? bf16_[prev].get() : nullptr;
  uint16_t* out_buf = out >= 0 ? bf16_[out].get() : nullptr;
  pool_->ParallelFor(blocks_.size(), [&](size_t i, size_t worker) {
    StepBlock(blocks_[i], t, prev_buf, out_buf,
              floors ? &(*floors)[worker] : nullptr);
  });
}

void Trainer::Snapshot(int out) {
  pool_->ParallelFor(blocks_.size(), [&](size_t i, size_t) {
    const Block& b = blocks_[i];
    const float* w = master_.get() + b.offset;
    uint16_t* o = bf16_[out].get() + b.offset;
    for (size_t k = 0; k < b.count; ++k) o[k] = FloatToBf16(w[k]);
  });
}

Status Trainer::Write(int buf, const std::string& path, uint64_t step) const {
  std::vector<TensorToWrite> out;
  out.reserve(tensors_.size());
  for (const TensorSpec& s : tensors_) {
    out.push_back({TensorInfo{s.name, DType::kBF16, s.shape},
                   std::as_bytes(std::span<const uint16_t>(
                       bf16_[buf].get() + s.offset, s.elements))});
  }
  std::map<std::string, std::string> metadata = {
      {"dcr.step", std::to_string(step)},
      {"format", "pt"},
      {"generator", kProgram}};
  return WriteSafetensors(path, out, metadata);
}

std::string ShardPath(const std::string& dir, uint32_t rank) {
  return (std::filesystem::path(dir) /
          fmt::format("rank-{:05d}.safetensors", rank))
      .string();
}

Status Trainer::WriteShards(int buf, const Layout& layout,
                            const std::string& dir, uint64_t step) const {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return Status::IOError(
        fmt::format("cannot create {}: {}", dir, ec.message()));
  }
  CanonicalBytes canonical;
  for (const TensorSpec& s : tensors_) {
    canonical.emplace(s.name, std::as_bytes(std::span<const uint16_t>(
                                  bf16_[buf].get() + s.offset, s.elements)));
  }
  const std::string fingerprint = layout.Fingerprint().ToHex();
  for (uint32_t r = 0; r < layout.ranks(); ++r) {
    // A server's rank holds copies and FP8 codes, scales and shadows too.
    std::map<std::string, std::vector<std::byte>> shards;
    std::map<std::string, LayoutShard> held;
    if (options_.serving) {
      DCR_ASSIGN_OR_RETURN(ReceiverMap m, ReceiverMap::Create(layout, r));
      DCR_ASSIGN_OR_RETURN(shards, m.Build(canonical));
      held = m.shards();
    } else {
      DCR_ASSIGN_OR_RETURN(shards, BuildShards(layout, r, canonical));
      held = layout.ShardsOf(r);
    }
    std::vector<TensorToWrite> out;
    for (const auto& [name, bytes] : shards) {
      const LayoutShard& info = held.at(name);
      out.push_back({TensorInfo{name, info.dtype, info.shape}, bytes});
    }
    std::map<std::string, std::string> metadata = {
        {"dcr.step", std::to_string(step)},
        {"dcr.rank", std::to_string(r)},
        {"dcr.layout", fingerprint},
        {"format", "pt"},
        {"generator", kProgram}};
    DCR_RETURN_IF_ERROR(WriteSafetensors(ShardPath(dir, r), out, metadata));
  }
  return Status::OK();
}

// The layout must describe exactly the model traingen writes.
Status CheckLayoutMatches(const Layout& layout,
                          const std::vector<TensorSpec>& tensors) {
  std::map<std::string, const LayoutTensor*> by_name;
  for (const LayoutTensor& t : layout.tensors) by_name[t.name] = &t;
  for (const TensorSpec& s : tensors) {
    auto it = by_name.find(s.name);
    if (it == by_name.end()) {
      return Status::InvalidArgument(
          fmt::format("layout {} does not place the model's tensor '{}'",
                      layout.source, s.name));
    }
    const LayoutTensor& t = *it->second;
    if (t.shape != s.shape || t.dtype != DType::kBF16) {
      return Status::InvalidArgument(fmt::format(
          "layout {} gives tensor '{}' shape [{}] of {}, but the model's is "
          "[{}] of BF16 (check --hidden, --layers, --heads, --kv-heads, "
          "--intermediate and --vocab)",
          layout.source, s.name, fmt::join(t.shape, ", "), DTypeName(t.dtype),
          fmt::join(s.shape, ", ")));
    }
    if (!t.conversion.identity(t.dtype)) {
      return Status::InvalidArgument(
          fmt::format("layout {} converts tensor '{}' (shard_dtype or add): "
                      "dcr-traingen writes shards that are bit copies only",
                      layout.source, s.name));
    }
    by_name.erase(it);
  }
  if (!by_name.empty()) {
    return Status::InvalidArgument(fmt::format(
        "layout {} places tensor '{}', which the model does not have",
        layout.source, by_name.begin()->first));
  }
  return Status::OK();
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since)
      .count();
}

Result<uint64_t> FileSize(const std::string& path) {
  std::error_code ec;
  uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) {
    return Status::IOError(fmt::format("{}: {}", path, ec.message()));
  }
  return size;
}

std::string CheckpointPath(const std::string& dir, uint64_t k) {
  return (std::filesystem::path(dir) / fmt::format("v{}.safetensors", k))
      .string();
}

// Where --layout puts version k's shards, and rank r's file in there.
std::string ShardDir(const std::string& dir, uint64_t k) {
  return (std::filesystem::path(dir) / fmt::format("v{}.shards", k)).string();
}

Status PrepareOutDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return Status::IOError(
        fmt::format("cannot create --out directory {}: {}", dir, ec.message()));
  }
  if (!std::filesystem::is_directory(dir, ec)) {
    return Status::IOError(fmt::format("--out {} is not a directory", dir));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return Status::FromErrno(fmt::format("--out directory {}", dir), errno);
  }
  return Status::OK();
}

void PrintRow(const StepReport& r) {
  fmt::print(
      "{:>5} {:>9.4f}% {:>12} {:>12.0f} {:>12.0f} {:>12.0f} {:>14} "
      "{:>10.2f}\n",
      r.step, 100 * r.change_rate, r.changed, r.floor_bytes, r.position_bytes,
      r.value_bytes, r.checkpoint_bytes,
      r.floor_bytes > 0 ? r.checkpoint_bytes / r.floor_bytes : 0.0);
  std::fflush(stdout);
}

Status Run(const Options& options) {
  DCR_RETURN_IF_ERROR(Validate(options));
  DCR_ASSIGN_OR_RETURN(std::vector<TensorSpec> tensors, BuildModel(options));
  std::optional<Layout> layout;
  if (!options.layout.empty()) {
    DCR_ASSIGN_OR_RETURN(layout, LoadLayout(options.layout));
    DCR_RETURN_IF_ERROR(CheckLayoutMatches(*layout, tensors));
  }
  DCR_RETURN_IF_ERROR(PrepareOutDir(options.out));
  ThreadPool pool(options.threads);
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                       Trainer::Create(std::move(tensors), options, &pool));
  const bool json = options.output == "json";
  fmt::print(stderr,
             "{}: {} parameters in {} BF16 tensors ({:.1f} MB per "
             "checkpoint, {:.2f} GiB of optimizer state), {} threads\n",
             kProgram, trainer->params(), trainer->tensors().size(),
             trainer->params() * 2 / 1e6,
             trainer->params() * 18.0 / (1ull << 30), pool.size());

  auto start = std::chrono::steady_clock::now();
  trainer->Init();
  uint64_t t = 0;
  for (; t < options.warmup; ++t) trainer->Step(t + 1, -1, -1, nullptr);
  trainer->Snapshot(0);
  fmt::print(stderr, "{}: init and {} warmup steps in {:.2f} s\n", kProgram,
             options.warmup, Seconds(start));

  start = std::chrono::steady_clock::now();
  std::string path = CheckpointPath(options.out, 0);
  DCR_RETURN_IF_ERROR(trainer->Write(0, path, 0));
  if (layout) {
    DCR_RETURN_IF_ERROR(
        trainer->WriteShards(0, *layout, ShardDir(options.out, 0), 0));
  }
  DCR_ASSIGN_OR_RETURN(uint64_t checkpoint_bytes, FileSize(path));
  fmt::print(stderr, "{}: wrote {} in {:.2f} s\n", kProgram, path,
             Seconds(start));

  if (!json) {
    fmt::print("{:>5} {:>10} {:>12} {:>12} {:>12} {:>12} {:>14} {:>10}\n",
               "step", "change", "changed", "floor_B", "positions_B",
               "values_B", "checkpoint_B", "ckpt/floor");
    std::fflush(stdout);
  }
  std::vector<StepReport> reports;
  reports.reserve(options.steps);
  for (uint64_t k = 1; k <= options.steps; ++k) {
    const int prev = static_cast<int>((k - 1) % 2);
    const int out = static_cast<int>(k % 2);
    std::vector<EntropyFloor> floors(pool.size());
    start = std::chrono::steady_clock::now();
    trainer->Step(++t, prev, out, &floors);
    for (size_t w = 1; w < floors.size(); ++w) floors[0].Merge(floors[w]);
    const double step_s = Seconds(start);

    start = std::chrono::steady_clock::now();
    path = CheckpointPath(options.out, k);
    DCR_RETURN_IF_ERROR(trainer->Write(out, path, k));
    if (layout) {
      DCR_RETURN_IF_ERROR(
          trainer->WriteShards(out, *layout, ShardDir(options.out, k), k));
    }
    StepReport r;
    DCR_ASSIGN_OR_RETURN(r.checkpoint_bytes, FileSize(path));
    const EntropyFloor& f = floors[0];
    r.step = k;
    r.change_rate = f.change_rate();
    r.changed = f.changed();
    r.floor_bytes = f.floor_bytes();
    r.position_bytes = f.position_bytes();
    r.value_bytes = f.value_bytes();
    fmt::print(stderr,
               "{}: step {}/{}: {:.3f}% changed; optimizer {:.2f} s, write "
               "{:.2f} s\n",
               kProgram, k, options.steps, 100 * r.change_rate, step_s,
               Seconds(start));
    if (!json) PrintRow(r);
    reports.push_back(r);
  }

  if (json) {
    nlohmann::json steps = nlohmann::json::array();
    for (const StepReport& r : reports) {
      steps.push_back(
          {{"step", r.step},
           {"change_rate", r.change_rate},
           {"changed", r.changed},
           {"floor_bytes", r.floor_bytes},
           {"position_bytes", r.position_bytes},
           {"value_bytes", r.value_bytes},
           {"checkpoint_bytes", r.checkpoint_bytes},
           {"checkpoint_over_floor",
            r.floor_bytes > 0 ? r.checkpoint_bytes / r.floor_bytes : 0.0}});
    }
    nlohmann::json report = {{"params", trainer->params()},
                             {"checkpoint_bytes", checkpoint_bytes},
                             {"lr", options.lr},
                             {"seed", options.seed},
                             {"warmup", options.warmup},
                             {"steps", std::move(steps)}};
    fmt::print("{}\n", report.dump(2));
  }
  return Status::OK();
}

constexpr char kFooter[] = R"(
Writes OUT/v0.safetensors (the model after --warmup Adam steps) and
OUT/v1..vN.safetensors, each one Adam step after the previous, and reports
for each step the fraction of BF16 elements whose bits changed and the
order-0 entropy floor of the XOR delta (DESIGN.md section 1).

Change rate per step on the default model (154M parameters, --warmup 10,
--seed 1; it drifts down by ~1% relative per step):
  --lr 6e-7  about 1.0%     --lr 1e-6  about 1.5%     --lr 2e-6  about 2.7%
  --lr 2.2e-6 about 3.0%    --lr 3e-6  about 3.8%     --lr 4.2e-6 about 5.1%

Examples:
  dcr-traingen --out /tmp/ckpt --steps 3 --lr 2.2e-6   # ~3% per step
  dcr-traingen --hidden 64 --layers 2 --vocab 256 --out /tmp/tiny -o json
  dcr-traingen --out /tmp/ckpt --layout layouts/traingen-tp2-pp2.yaml

With --layout, each version is also written as a trainer's shards:
OUT/vK.shards/rank-RRRRR.safetensors holds what producer rank R holds under
the layout (docs/PLACEMENT.md), named as the trainer names them. The layout
must place exactly the model's tensors, as bit copies.

Exit status: 0 on success, 2 for bad options, 1 for runtime errors.)";

// CLI11 2.1's numeric validators print their range as a 300-digit double;
// these say what they want in words.
CLI::Validator IntegerValidator(bool positive) {
  return CLI::Validator(
      [positive](std::string& s) -> std::string {
        bool digits = !s.empty() && s.size() <= 19 &&
                      std::all_of(s.begin(), s.end(),
                                  [](char c) { return c >= '0' && c <= '9'; });
        if (!digits) return "'" + s + "' is not a non-negative integer";
        if (positive && s.find_first_not_of('0') == std::string::npos) {
          return "must be at least 1";
        }
        return "";
      },
      "", positive ? "POSITIVE" : "NON_NEGATIVE");
}

CLI::Validator RealValidator(bool positive) {
  return CLI::Validator(
      [positive](std::string& s) -> std::string {
        char* end = nullptr;
        double x = std::strtod(s.c_str(), &end);
        if (s.empty() || *end != '\0' || !std::isfinite(x) ||
            (positive ? !(x > 0) : !(x >= 0))) {
          return "'" + s + "' is not a " +
                 (positive ? "positive" : "non-negative") + " number";
        }
        return "";
      },
      "", positive ? "POSITIVE" : "NON_NEGATIVE");
}

int Main(int argc, char** argv) {
  Options o;
  const CLI::Validator kPositive = IntegerValidator(true);
  const CLI::Validator kNonNegative = IntegerValidator(false);
  CLI::App app(
      "Generates consecutive BF16 checkpoints of a transformer-shaped "
      "model by real Adam steps.",
      kProgram);
  app.footer(kFooter);
  app.add_option("--hidden", o.hidden, "Hidden size")
      ->capture_default_str()
      ->check(kPositive);
  app.add_option("--layers", o.layers, "Number of transformer layers")
      ->capture_default_str()
      ->check(kNonNegative);
  app.add_option("--heads", o.heads, "Attention heads")
      ->capture_default_str()
      ->check(kPositive);
  app.add_option("--kv-heads", o.kv_heads,
                 "Key/value heads (grouped-query attention)")
      ->capture_default_str()
      ->check(kPositive);
  app.add_option("--intermediate", o.intermediate,
                 "MLP size (default: 2.6875 x hidden rounded to 64)")
      ->check(kNonNegative);
  app.add_option("--vocab", o.vocab, "Vocabulary size")
      ->capture_default_str()
      ->check(kPositive);
  app.add_option("--lr", o.lr, "Adam learning rate")
      ->capture_default_str()
      ->check(RealValidator(true));
  app.add_option("--weight-decay", o.weight_decay,
                 "Decoupled (AdamW) weight decay")
      ->capture_default_str()
      ->check(RealValidator(false));
  app.add_option("--steps", o.steps, "Checkpoints to write after v0")
      ->capture_default_str()
      ->check(kNonNegative);
  app.add_option("--seed", o.seed, "Random seed")
      ->capture_default_str()
      ->check(kNonNegative);
  app.add_option("--warmup", o.warmup, "Adam steps taken before v0 is written")
      ->capture_default_str()
      ->check(kNonNegative);
  app.add_option("--layout", o.layout,
                 "Also write each version as the shards of this placement "
                 "layout's ranks");
  app.add_flag("--serving", o.serving,
               "With --layout: the layout's ranks are a server's, and each "
               "also holds copies of replicated tensors");
  app.add_option("--out", o.out, "Output directory (created if missing)")
      ->required();
  app.add_option("--threads", o.threads,
                 "Worker threads (0: one per hardware thread)")
      ->check(kNonNegative)
      ->capture_default_str();
  app.add_option("-o,--output", o.output, "Report format on stdout")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    fmt::print(stderr, "{}: {} (see --help)\n", kProgram, e.what());
    return 2;
  }
  if (o.intermediate == 0) o.intermediate = DefaultIntermediate(o.hidden);

  Status s = Run(o);
  if (!s.ok()) {
    fmt::print(stderr, "{}: {}\n", kProgram, s.ToString());
    return s.IsInvalidArgument() ? 2 : 1;
  }
  return 0;
}

}  // namespace
}  // namespace dcr

int main(int argc, char** argv) { return dcr::Main(argc, argv); }
