// A trainer rank's side of a refit without gathering: diff the rank's
// shards against its baseline shards and project the changes through the
// layout's pieces into canonical coordinates (docs/PLACEMENT.md
// §Producers). Also the inverse, for test data and tools: build a rank's
// shards from canonical tensors.
//
// Only the rank's own shards are read, each once per version: a rank never
// sees another rank's data or a whole canonical tensor it does not hold.
//
// Thread safety: the functions touch only their arguments; distinct calls
// may run concurrently.
#ifndef DCR_SHARD_DIFF_H_
#define DCR_SHARD_DIFF_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/digest.h"
#include "dcr/layout.h"
#include "dcr/status.h"

namespace dcr {

// A rank's shard tensors by name: their raw bytes, row-major, in the
// layout's shard dtype.
using ShardBytes =
    std::map<std::string, std::span<const std::byte>, std::less<>>;

// The changes one rank produces for one canonical tensor.
struct CanonicalChanges {
  size_t tensor = 0;                // index into Layout::tensors
  std::vector<uint64_t> positions;  // canonical flat positions, ascending
  // The canonical bits before and after at each position:
  // positions.size() * DTypeSize(tensor dtype) bytes each.
  std::vector<std::byte> base;
  std::vector<std::byte> target;
};

// The elements of one shard whose bits differ between a base and a
// target, in the shard's own coordinates (found where the shards live: a
// GPU's memory, dcr/shard_memory.h).
struct ShardChanges {
  std::vector<uint64_t> positions;  // flat element indices, ascending
  // The base's and the target's bits at each position:
  // positions.size() * the shard dtype's size bytes each.
  std::vector<std::byte> base;
  std::vector<std::byte> target;
};

struct ShardDiffStats {
  // Of base and target together, read by this process (none where the
  // shards were diffed elsewhere: ProjectShardChanges).
  uint64_t shard_bytes_read = 0;
  uint64_t compared = 0;  // shard elements compared (in pieces)
  uint64_t changed = 0;   // canonical elements whose bits changed
};

// Diffs rank `rank`'s `base` shards against its `target` shards and
// projects every changed element of the rank's pieces into canonical
// coordinates, converted to the canonical dtype (Conversion). An element
// whose shard bits changed but whose canonical bits did not (an FP32
// master that rounds to the same BF16) is not a change. One entry per
// canonical tensor with a change, in Layout::tensors order.
//
// Errors name the rank and the shard: a shard the layout gives the rank
// but `base` or `target` lacks is NotFound; one whose size is not the
// layout's shape x dtype is InvalidArgument (a trainer step that changed a
// tensor's shape is refused here). Shards the layout does not name are
// ignored (optimizer state, buffers).
Result<std::vector<CanonicalChanges>> DiffShards(
    const Layout& layout, uint32_t rank, const ShardBytes& base,
    const ShardBytes& target, ShardDiffStats* stats = nullptr);
// Whether `shards` holds every shard the layout gives rank `rank`, each of
// its size: the errors DiffShards gives, without reading the bits.
Status CheckShards(const Layout& layout, uint32_t rank,
                   const ShardBytes& shards);
// The shard elements a diff found changed, in the shards' own
// coordinates, kept so that a copy of the base shards can be moved to the
// target and back without another pass over them (a producer's step,
// dcr/shard_delta.h ShardProducer): per shard, each changed element's
// index and its base and target bits (8 bytes per BF16 element).
//
// It keeps them in blocks, never moved once written (the first of a shard
// small, then doubling up to kBlockElems), and keeps its blocks when
// cleared, for the next step's diff: a log grown afresh each step cost a
// producer more than its scan for changes (zeroed memory, copies as it
// grew, and a page fault per 4 KiB). What it allocates stays within
// `limit` bytes, each step's whichever shards change (blocks a shard kept
// and this diff has not filled go to one that needs them); an element
// past that, or at an index past 2^32, turns it
// overflowed(), and it keeps nothing more (what it kept stays until
// Clear). An element a diff visits twice (a shard that two canonical
// tensors read, a tied embedding) is kept twice: moving it is idempotent.
class ShardChangeLog {
 public:
  static constexpr size_t kBlockElems = size_t{1} << 16;
  explicit ShardChangeLog(uint64_t limit = 0) : limit_(limit) {}
  ShardChangeLog(ShardChangeLog&&) = default;
  ShardChangeLog& operator=(ShardChangeLog&&) = default;

  struct Block {
    size_t capacity = 0;  // elements
    std::unique_ptr<uint32_t[]> index;
    std::unique_ptr<std::byte[]> base, target;  // capacity * elem_size
  };
  struct Shard {
    size_t elem_size = 0;
    uint64_t count = 0;  // elements kept
    // They fill blocks[0..at], the last up to `used`; `room` more fit in
    // the blocks held.
    std::vector<Block> blocks;
    size_t at = 0, used = 0;
    uint64_t room = 0;
  };
  // The entry of shard `name` (elements of `elem_size` bytes).
  Shard* For(const std::string& name, size_t elem_size);
  // Room for `k` more elements of `shard`; false, turning it overflowed(),
  // where the limit leaves none. Call before Add, once per batch of
  // elements (a scan's block): Add itself does not check the room.
  bool Reserve(Shard* shard, size_t k) {
    if (overflowed_) return false;
    if (k <= shard->room) return true;
    if (Grow(shard, k)) return true;
    overflowed_ = true;
    return false;
  }
  // Keeps element `index`'s base and target bits (elem_size bytes each),
  // within the room Reserve made; nothing once overflowed().
  void Add(Shard* shard, uint64_t index, const std::byte* base,
           const std::byte* target) {
    if (overflowed_ || index > UINT32_MAX) {
      overflowed_ = true;
      return;
    }
    if (shard->used == shard->blocks[shard->at].capacity) {
      ++shard->at;  // Reserve made it
      shard->used = 0;
    }
    Block& b = shard->blocks[shard->at];
    const size_t n = shard->used++;
    ++shard->count;
    --shard->room;
    b.index[n] = static_cast<uint32_t>(index);
    const size_t w = shard->elem_size;
    // Fixed sizes the compiler inlines (a memcpy of a runtime size is a
    // call: most of the cost per element).
    switch (w) {
      case 2:
        std::memcpy(&b.base[n * 2], base, 2);
        std::memcpy(&b.target[n * 2], target, 2);
        break;
      case 4:
        std::memcpy(&b.base[n * 4], base, 4);
        std::memcpy(&b.target[n * 4], target, 4);
        break;
      case 1:
        b.base[n] = *base;
        b.target[n] = *target;
        break;
      default:
        std::memcpy(&b.base[n * w], base, w);
        std::memcpy(&b.target[n * w], target, w);
    }
  }
  bool overflowed() const { return overflowed_; }
  // What its blocks allocate (kept from step to step until Free).
  uint64_t bytes() const { return bytes_; }
  // Writes each kept element's target bits (Forward) or base bits (Back)
  // into the shard of its name in `shards`. InvalidArgument, writing
  // nothing, for a shard missing there or too short.
  using Buffers = std::map<std::string, std::vector<std::byte>, std::less<>>;
  Status Forward(Buffers* shards) const { return Write(shards, true); }
  Status Back(Buffers* shards) const { return Write(shards, false); }
  // Keeps nothing (no longer overflowed), its blocks for the next diff;
  // with a new `limit`, blocks past it are freed.
  void Clear();
  void Clear(uint64_t limit);
  // Keeps nothing and frees every block.
  void Free();

 private:
  Status Write(Buffers* shards, bool forward) const;
  // Makes room for at least `k` more elements of `shard`: new blocks
  // within the limit, the last cut to what is left of it, after freeing
  // the blocks other shards kept and this diff has not filled (Reclaim);
  // false when the limit leaves too little.
  bool Grow(Shard* shard, size_t k);
  void Reclaim(const Shard* keep);
  uint64_t limit_;
  uint64_t bytes_ = 0;
  bool overflowed_ = false;
  std::map<std::string, Shard, std::less<>> shards_;
};

// The same, one canonical tensor at a time: `each` gets a tensor's changes
// (tensors ascending, those without a change skipped) as soon as they are
// found, so only one tensor's changes are held at once. An error from
// `each` stops the diff and is returned. With `log`, every changed shard
// element goes there too (whether or not its canonical bits changed).
Status DiffShardsEach(const Layout& layout, uint32_t rank,
                      const ShardBytes& base, const ShardBytes& target,
                      const std::function<Status(CanonicalChanges&&)>& each,
                      ShardDiffStats* stats = nullptr,
                      ShardChangeLog* log = nullptr);

// DiffShardsEach for shards diffed where they live (a GPU's memory:
// dcr/shard_memory.h), from each shard's changed elements: `fetch(shard,
// &changes)` fills `changes` (empty, perhaps with the capacity of a shard
// done with) with those of one of the rank's shards, and is called once
// per shard, when the first canonical tensor reading it comes; they are
// kept until the last tensor reading it is done (tensors come in name
// order, so a fused shard's changes, QKV's, stay while the tensors
// sorting between its own are done: two shards' at a time for the parsed
// Megatron layouts). `each` gets what DiffShardsEach gives for the same
// bits. Changed elements no piece of the rank maps (padding) are ignored.
// The shards' sizes are the caller's to check (CheckShards); changes that
// do not fit their shard (positions out of order or past its end, values
// of another size) are Internal. An error from `fetch` or `each` stops it.
using ShardChangesFetch =
    std::function<Status(const std::string& shard, ShardChanges* out)>;
Status ProjectShardChanges(
    const Layout& layout, uint32_t rank, const ShardChangesFetch& fetch,
    const std::function<Status(CanonicalChanges&&)>& each,
    ShardDiffStats* stats = nullptr);

// Per canonical tensor (Layout::tensors order), the linear digest of the
// canonical bits rank `rank` holds in `shards` (after conversion), each
// region hashed at its canonical byte offset (LinearHash, dcr/digest.h).
// XOR the ranks' parts and FinishTensorDigest with the tensor's byte count
// to get its TensorDigest: every element is held by exactly one rank, so
// no process sees a whole tensor. One pass over the rank's shards; runs
// the layout maps contiguously hash at LinearHash's speed, strided ones
// (transposes) element by element. Errors as DiffShards'.
Result<std::vector<LinearDigest>> HashShardRegions(const Layout& layout,
                                                   uint32_t rank,
                                                   const ShardBytes& shards);

// HashShardRegions one shard at a time: XORs the regions of `shard` (one
// of rank `rank`'s, `bytes` its bits) into `sums` (resized to the layout's
// tensors), so that a caller holding one shard in memory at a time gets
// HashShardRegions' parts once every shard was added. NotFound for a shard
// the rank does not hold; InvalidArgument for the wrong size.
Status AddShardRegions(const Layout& layout, uint32_t rank,
                       std::string_view shard, std::span<const std::byte> bytes,
                       std::vector<LinearDigest>* sums);

// Canonical tensors by name (bytes in the canonical dtype), for BuildShards.
using CanonicalBytes =
    std::map<std::string, std::span<const std::byte>, std::less<>>;

// Builds the shards rank `rank` holds from canonical tensors: each element
// a piece maps is the canonical element's bits; elements no piece of the
// rank maps (vocabulary padding, another rank's replica) are zero.
// Every tensor the rank holds must have an identity conversion (the shard
// value of a converted tensor is not determined by its canonical bits);
// otherwise InvalidArgument naming the tensor.
Result<std::map<std::string, std::vector<std::byte>>> BuildShards(
    const Layout& layout, uint32_t rank, const CanonicalBytes& canonical);
// The same, one shard at a time: `each` gets every shard of the rank (in
// name order) as soon as it is built, so that a caller sending a rank its
// shards holds one at a time. Every check is made before the first shard
// is built; an error from `each` stops it.
Status BuildShardsEach(
    const Layout& layout, uint32_t rank, const CanonicalBytes& canonical,
    const std::function<Status(const std::string&, std::vector<std::byte>&&)>&
        each);
// What HashShardRegions gives for the shards BuildShards builds from
// `canonical`, without building them: the canonical bits of the rank's
// regions hashed where they lie. A shard where two tensors' regions
// overlap (a tied head reading its embedding's) is built, that one alone,
// and hashed: there it holds one tensor's bits. Errors as BuildShards' (a rank
// holding a converted tensor cannot be rebuilt, so it is refused here too).
Result<std::vector<LinearDigest>> HashCanonicalRegions(
    const Layout& layout, uint32_t rank, const CanonicalBytes& canonical);

// Where a rank's shard disagrees with the canonical tensor it holds.
struct ShardMismatch {
  std::string shard;  // the shard's name
  uint64_t shard_element = 0;
  std::string tensor;     // the canonical tensor
  uint64_t element = 0;   // its element there
  std::string shard_hex;  // the shard's bits, converted (hex, little end)
  std::string canonical_hex;
  uint64_t differing = 0;  // elements of this shard that differ
};

// Checks that rank `rank`'s `shards` hold the canonical bits of every
// element the layout maps (after conversion): what tells whether a layout
// describes a trainer, given one rank's shards and an export. Elements no
// piece maps (padding) are not compared. One entry per differing shard,
// for its first differing element; empty when all agree. A shard missing
// or of the wrong size is an error, as in DiffShards.
Result<std::vector<ShardMismatch>> CompareShards(
    const Layout& layout, uint32_t rank, const ShardBytes& shards,
    const CanonicalBytes& canonical);

// The canonical bits of one element converted from shard bits `shard`
// under `c` (docs/PLACEMENT.md §Residual conversion): the value is widened
// to F32, `add` is added in F32, and the sum rounded to nearest even in
// `canonical`. Writes DTypeSize(canonical) bytes to `out`.
void ConvertElement(const Conversion& c, DType canonical,
                    const std::byte* shard, std::byte* out);

// IEEE binary16 <-> binary32: exact one way, rounded to nearest even the
// other. FloatToHalf turns every NaN into sign | 0x7E00 (as PyTorch's
// c10::Half does); HalfToFloat keeps a NaN's payload.
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float v);

}  // namespace dcr

#endif  // DCR_SHARD_DIFF_H_
