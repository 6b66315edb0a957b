// dcr-traingen's model (traingen.cc is the command): a transformer-shaped
// BF16 model with fp32 master weights, trained by real Adam steps against
// a fixed random target, written as checkpoints or as a layout's shards.
//
// The model keeps fp32 master weights and fp32 Adam moments (12 bytes per
// parameter) plus a BF16 copy of a fixed random target and two BF16
// checkpoint buffers (6 bytes per parameter): about 2.8 GB for the default
// 154M-parameter model. Nothing else is allocated per step.
//
// Determinism: every random number is a pure function of (seed, stream,
// tensor, block, element), where a block is a fixed range of elements of
// one tensor (traingen_model.cc kBlockElems), so the output depends on the
// seed and the model options but never on the thread count.
#ifndef DCR_TOOLS_SRC_TRAINGEN_MODEL_H_
#define DCR_TOOLS_SRC_TRAINGEN_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dcr/entropy.h"
#include "dcr/layout.h"
#include "dcr/status.h"
#include "dcr/thread_pool.h"

namespace dcr::traingen {

// The program's name, for messages and the files' "generator" metadata.
inline constexpr char kProgram[] = "dcr-traingen";

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

// Llama's intermediate size for `hidden`, rounded to 64.
uint64_t DefaultIntermediate(uint64_t hidden);
// InvalidArgument naming the option that is out of range.
Status Validate(const Options& o);
// The model's tensors, with their offsets in the flat parameter arrays.
Result<std::vector<TensorSpec>> BuildModel(const Options& o);
// The layout must describe exactly the model traingen writes.
Status CheckLayoutMatches(const Layout& layout,
                          const std::vector<TensorSpec>& tensors);

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

}  // namespace dcr::traingen

#endif  // DCR_TOOLS_SRC_TRAINGEN_MODEL_H_
