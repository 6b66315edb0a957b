#include "traingen_model.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <filesystem>
#include <map>
#include <new>
#include <span>

#include "dcr/checkpoint.h"
#include "dcr/dtype.h"
#include "dcr/receiver_map.h"
#include "dcr/shard_diff.h"

namespace dcr::traingen {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; traingen writes host order");

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

}  // namespace

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

}  // namespace dcr::traingen
