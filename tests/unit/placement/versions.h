// Canonical versions and a Megatron-style layout, shared by the placement
// tests (shard_diff_test.cc, shard_delta_test.cc).
#ifndef DCR_TESTS_UNIT_PLACEMENT_VERSIONS_H_
#define DCR_TESTS_UNIT_PLACEMENT_VERSIONS_H_

#include <array>
#include <cstddef>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "dcr/layout.h"
#include "dcr/shard_diff.h"
#include "unit/placement/random_tiling.h"

namespace dcr::placement_testing {

using Tensors = std::map<std::string, std::vector<std::byte>>;

inline CanonicalBytes View(const Tensors& t) {
  CanonicalBytes out;
  for (const auto& [name, bytes] : t) out.emplace(name, bytes);
  return out;
}

// Random canonical bits for every tensor of `l`, and a target that changes
// about `rate` of the elements.
inline std::pair<Tensors, Tensors> RandomVersions(const Layout& l, double rate,
                                                  std::mt19937_64& rng) {
  Tensors base, target;
  std::bernoulli_distribution change(rate);
  for (const LayoutTensor& t : l.tensors) {
    const size_t w = DTypeSize(t.dtype);
    auto& b = base[t.name];
    b.resize(Volume(t.shape) * w);
    for (auto& x : b) x = static_cast<std::byte>(rng());
    auto& g = target[t.name];
    g = b;
    for (size_t e = 0; e < Volume(t.shape); ++e) {
      if (change(rng))
        g[e * w] ^= std::byte{static_cast<unsigned char>(1 + rng() % 255)};
    }
  }
  return {base, target};
}

// A layout of 1 to 3 canonical tensors of random shapes and dtypes, each
// tiled at random (RandomTiling) over ranks 0-7.
inline Layout RandomLayout(std::mt19937_64& rng) {
  Layout l;
  l.tp = 8;  // pieces name ranks 0-7
  for (int k = 0; k < 1 + static_cast<int>(rng() % 3); ++k) {
    LayoutTensor t;
    t.name = "t" + std::to_string(k);
    t.shape = RandomShape(rng);
    t.dtype = std::array{DType::kBF16, DType::kF32, DType::kU8}[rng() % 3];
    t.conversion.shard_dtype = t.dtype;
    t.pieces = RandomTiling(t.shape, rng);
    for (AffinePiece& p : t.pieces) p.shard = t.name + "." + p.shard;
    l.tensors.push_back(std::move(t));
  }
  return l;
}

// A small GPT under tp x pp: a padded vocabulary, fused QKV, a row split,
// fused gate/up, a replicated norm and a transposed head (strided runs).
inline std::string Gpt(uint32_t tp, uint32_t pp) {
  return "version: 1\nparallel: {tp: " + std::to_string(tp) +
         ", pp: " + std::to_string(pp) + R"(}
layers: 2
tensors:
  - name: embed
    shard: emb
    split: vocab
    pad_to: 4
    shape: [50, 8]
  - names:
      - l.{layer}.q
      - l.{layer}.k
      - l.{layer}.v
    shard: l.{layer}.qkv
    split: qkv
    heads: 4
    kv_heads: 4
    head_dim: 2
    columns: 8
  - name: l.{layer}.o
    shard: l.{layer}.proj
    split: row
    shape: [8, 8]
  - names: ['l.{layer}.gate', 'l.{layer}.up']
    shard: l.{layer}.fc1
    split: gate_up
    shape: [12, 8]
  - name: l.{layer}.norm
    shard: l.{layer}.norm
    split: replicated
    shape: [8]
  - name: head
    shard: out
    split: column
    shape: [48, 8]
    transpose: true
    stage: last
)";
}

}  // namespace dcr::placement_testing

#endif  // DCR_TESTS_UNIT_PLACEMENT_VERSIONS_H_
