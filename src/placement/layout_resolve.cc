// LayoutSpec -> Layout: expands the {layer} and {expert} families over the
// pipeline stages and expert groups, turns each entry into affine pieces
// by its split kind, and checks that every canonical tensor is tiled
// exactly once and that each rank's shards are declared consistently.
#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/yaml_doc.h"
#include "placement/layout_spec.h"

namespace dcr {
namespace layout_internal {
namespace {

// True iff `s` has more than kMaxElements elements.
bool ElementsOver(const Shape& s) {
  uint64_t n = 1;
  for (uint64_t d : s) {
    if (d != 0 && n > kMaxElements / d) return true;
    n *= d;
  }
  return n > kMaxElements;
}

// The {layer} / {expert} placeholders a name holds.
struct Placeholders {
  bool layer = false;
  bool expert = false;
  friend bool operator==(const Placeholders&, const Placeholders&) = default;
};

// Which placeholders `name` holds, or the text of an unknown one.
Result<Placeholders> FindPlaceholders(const std::string& name) {
  Placeholders out;
  for (size_t i = name.find('{'); i != std::string::npos;
       i = name.find('{', i + 1)) {
    size_t j = name.find('}', i);
    std::string tag =
        name.substr(i, j == std::string::npos ? std::string::npos : j - i + 1);
    if (tag == "{layer}") {
      out.layer = true;
    } else if (tag == "{expert}") {
      out.expert = true;
    } else {
      return Status::InvalidArgument("unknown placeholder '" + tag + "' in '" +
                                     name + "' (known: {layer}, {expert})");
    }
  }
  return out;
}

std::string Substitute(std::string name, uint64_t layer, uint64_t expert) {
  for (auto [tag, v] : {std::pair<std::string_view, uint64_t>{"{layer}", layer},
                        {"{expert}", expert}}) {
    for (size_t i = name.find(tag); i != std::string::npos;
         i = name.find(tag, i)) {
      std::string s = std::to_string(v);
      name.replace(i, tag.size(), s);
      i += s.size();
    }
  }
  return name;
}

// The dtypes a conversion reads and writes (dcr/shard_diff.h).
bool IsFloat(DType d) {
  return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16;
}

// The piece that stores `p`'s box transposed (2-D shards only).
AffinePiece Transposed(AffinePiece p) {
  std::reverse(p.shard_shape.begin(), p.shard_shape.end());
  std::reverse(p.from.begin(), p.from.end());
  std::reverse(p.extent.begin(), p.extent.end());
  p.axis = {1, 0};
  return p;
}

AffinePiece Box(uint32_t rank, const std::string& shard, Shape shard_shape,
                Shape from, Shape extent, Shape to) {
  AffinePiece p;
  p.rank = rank;
  p.shard = shard;
  p.shard_shape = std::move(shard_shape);
  p.from = std::move(from);
  p.extent = std::move(extent);
  p.to = std::move(to);
  p.step.assign(p.to.size(), 1);
  for (uint32_t d = 0; d < p.to.size(); ++d) p.axis.push_back(d);
  return p;
}

class Resolver {
 public:
  explicit Resolver(const LayoutSpec& spec) : spec_(spec) {}

  Result<Layout> Run();

 private:
  Status Err(const EntrySpec& e, std::string_view msg) const {
    return yaml_doc::Error(spec_.source, e.line, e.path, msg);
  }
  Status TensorErr(const EntrySpec& e, const std::string& tensor,
                   std::string_view msg) const {
    return Err(e, "tensor '" + tensor + "': " + std::string(msg));
  }
  uint32_t RankOf(uint32_t t, uint32_t epg, uint32_t stage) const {
    return t + spec_.tp * (epg + spec_.ep * stage);
  }
  Status CheckEntry(const EntrySpec& e, Placeholders* ph) const;
  // Adds the pieces of one instance of `e` (one layer, one expert) to the
  // canonical tensors named `names`, in the order of e.names.
  Status Place(const EntrySpec& e, const std::vector<std::string>& names,
               const std::string& shard, uint32_t stage, uint32_t epg,
               std::vector<LayoutTensor*>& out) const;
  Status AddTensor(const EntrySpec& e, const std::string& name,
                   LayoutTensor** out);
  // The most pieces one instance of `e` makes (over all its names).
  uint64_t PiecesPerInstance(const EntrySpec& e) const {
    switch (e.split) {
      case SplitKind::kReplicated:
        return 1;
      case SplitKind::kColumn:
      case SplitKind::kRow:
      case SplitKind::kVocab:
        return spec_.tp;
      case SplitKind::kGateUp:
        return 2ull * spec_.tp;
      case SplitKind::kQkv:
        return 3 * e.kv_heads;
      case SplitKind::kPieces:
        return e.pieces.size();
    }
    return 0;
  }

  const LayoutSpec& spec_;
  std::vector<uint32_t> stage_first_;  // first layer of each stage
  Layout layout_;
  std::map<std::string, size_t> index_;   // canonical name -> tensors[i]
  std::vector<const EntrySpec*> origin_;  // tensors[i]'s entry
};

Status Resolver::CheckEntry(const EntrySpec& e, Placeholders* ph) const {
  DCR_ASSIGN_OR_RETURN(*ph, [&]() -> Result<Placeholders> {
    auto p = FindPlaceholders(e.names[0]);
    if (!p.ok()) return Err(e, p.status().message());
    for (const std::string& n : e.names) {
      auto q = FindPlaceholders(n);
      if (!q.ok()) return Err(e, q.status().message());
      if (!(*q == *p)) {
        return Err(e, "the names '" + e.names[0] + "' and '" + n +
                          "' hold different placeholders");
      }
    }
    if (e.split == SplitKind::kPieces) {
      if (p->layer || p->expert) {
        return Err(e,
                   "a 'pieces' entry names one tensor: it takes no "
                   "{layer} or {expert} placeholder");
      }
      return *p;
    }
    auto s = FindPlaceholders(e.shard);
    if (!s.ok()) return Err(e, s.status().message());
    if (!(*s == *p)) {
      return Err(e, "the shard name '" + e.shard +
                        "' must hold the same placeholders as '" + e.names[0] +
                        "'");
    }
    return *p;
  }());
  if (ph->layer && spec_.layers == 0) {
    return Err(e, "'" + e.names[0] +
                      "' holds {layer}, but the layout gives "
                      "no 'layers'");
  }
  if (ph->expert && spec_.experts == 0) {
    return Err(e, "'" + e.names[0] +
                      "' holds {expert}, but the layout "
                      "gives no 'experts'");
  }
  if (ph->layer && e.stage) {
    return Err(e,
               "a {layer} family's stage follows its layer: remove "
               "'stage'");
  }
  if (e.stage && !e.stage->last && e.stage->index >= spec_.pp) {
    return Err(e, "stage " + std::to_string(e.stage->index) +
                      " is not below pp " + std::to_string(spec_.pp));
  }
  const DType dtype = e.dtype.value_or(spec_.dtype);
  const DType shard_dtype = e.shard_dtype.value_or(dtype);
  if (e.fp8) {
    if (dtype != DType::kBF16 && dtype != DType::kF16 && dtype != DType::kF32) {
      return Err(e, "an fp8 tensor is quantized from BF16, F16 or F32, not " +
                        std::string(DTypeName(dtype)));
    }
    if (shard_dtype != dtype || e.add != 0 || e.transpose) {
      return Err(e,
                 "an fp8 entry takes no shard_dtype, add or transpose: the "
                 "server quantizes the canonical bits as they are laid out");
    }
    if (!e.fp8->scale_shard.empty()) {
      auto s = FindPlaceholders(e.fp8->scale_shard);
      if (!s.ok()) return Err(e, s.status().message());
      if (!(*s == *ph)) {
        return Err(e, "the scale name '" + e.fp8->scale_shard +
                          "' must hold the same placeholders as '" +
                          e.names[0] + "'");
      }
    }
  }
  if ((shard_dtype != dtype || e.add != 0) &&
      !(IsFloat(shard_dtype) && IsFloat(dtype))) {
    return Err(e, "no conversion from " + std::string(DTypeName(shard_dtype)) +
                      (e.add != 0 ? " with 'add'" : "") + " to " +
                      std::string(DTypeName(dtype)) +
                      " (conversions: F32, BF16 or F16 shards to F32, BF16 "
                      "or F16, computed in F32 and rounded to nearest even)");
  }
  return Status::OK();
}

Status Resolver::AddTensor(const EntrySpec& e, const std::string& name,
                           LayoutTensor** out) {
  auto [it, fresh] = index_.emplace(name, layout_.tensors.size());
  if (!fresh) {
    const EntrySpec& first = *origin_[it->second];
    return TensorErr(e, name,
                     "already declared by " + first.path + " (line " +
                         std::to_string(first.line) + ")");
  }
  if (layout_.tensors.size() >= kMaxTensors) {
    return Err(e, "the layout expands to more than " +
                      std::to_string(kMaxTensors) + " tensors");
  }
  LayoutTensor t;
  t.name = name;
  t.dtype = e.dtype.value_or(spec_.dtype);
  t.conversion.shard_dtype = e.shard_dtype.value_or(t.dtype);
  t.conversion.add = e.add;
  t.line = e.line;
  layout_.tensors.push_back(std::move(t));
  origin_.push_back(&e);
  *out = &layout_.tensors.back();
  return Status::OK();
}

Status Resolver::Place(const EntrySpec& e,
                       const std::vector<std::string>& names,
                       const std::string& shard, uint32_t stage, uint32_t epg,
                       std::vector<LayoutTensor*>& out) const {
  const uint32_t tp = spec_.tp;
  auto add = [&](size_t which, AffinePiece p) {
    out[which]->pieces.push_back(e.transpose ? Transposed(std::move(p))
                                             : std::move(p));
  };
  auto split = [&](uint64_t n, const char* what) -> Result<uint64_t> {
    if (n % tp != 0) {
      return TensorErr(e, names[0],
                       std::to_string(n) + " " + what +
                           " do not split evenly over tp " +
                           std::to_string(tp));
    }
    return n / tp;
  };
  Shape shape = e.shape;
  switch (e.split) {
    case SplitKind::kReplicated:
      out[0]->shape = shape;
      add(0, Box(RankOf(0, epg, stage), shard, shape, Shape(shape.size(), 0),
                 shape, Shape(shape.size(), 0)));
      return Status::OK();
    case SplitKind::kColumn:
    case SplitKind::kVocab: {
      out[0]->shape = shape;
      uint64_t rows;
      if (e.split == SplitKind::kColumn) {
        DCR_ASSIGN_OR_RETURN(rows, split(shape[0], "rows"));
      } else {
        // Megatron pads the vocabulary to a multiple of pad_to x tp.
        uint64_t unit = e.pad_to * tp;
        rows = (shape[0] + unit - 1) / unit * unit / tp;
      }
      for (uint32_t t = 0; t < tp; ++t) {
        uint64_t first = rows * t;
        if (first >= shape[0]) break;  // this rank holds only padding
        Shape ss = shape, extent = shape, to(shape.size(), 0);
        ss[0] = rows;
        extent[0] = std::min(rows, shape[0] - first);
        to[0] = first;
        add(0, Box(RankOf(t, epg, stage), shard, ss, Shape(shape.size(), 0),
                   extent, to));
      }
      return Status::OK();
    }
    case SplitKind::kRow: {
      out[0]->shape = shape;
      if (shape.size() < 2) {
        return TensorErr(e, names[0], "a row split needs 2 or more dimensions");
      }
      DCR_ASSIGN_OR_RETURN(uint64_t cols, split(shape[1], "columns"));
      for (uint32_t t = 0; t < tp; ++t) {
        Shape ss = shape, to(shape.size(), 0);
        ss[1] = cols;
        to[1] = cols * t;
        add(0, Box(RankOf(t, epg, stage), shard, ss, Shape(shape.size(), 0), ss,
                   to));
      }
      return Status::OK();
    }
    case SplitKind::kGateUp: {
      out[0]->shape = out[1]->shape = shape;
      DCR_ASSIGN_OR_RETURN(uint64_t rows, split(shape[0], "rows"));
      for (uint32_t t = 0; t < tp; ++t) {
        Shape ss = shape, extent = shape, to(shape.size(), 0);
        ss[0] = 2 * rows;
        extent[0] = rows;
        to[0] = rows * t;
        Shape from(shape.size(), 0);
        uint32_t rank = RankOf(t, epg, stage);
        add(0, Box(rank, shard, ss, from, extent, to));
        from[0] = rows;
        add(1, Box(rank, shard, ss, from, extent, to));
      }
      return Status::OK();
    }
    case SplitKind::kQkv: {
      // Megatron's fused QKV: per query group, the group's query heads,
      // then its key head, then its value head; tp ranks hold
      // kv_heads / tp whole groups each.
      const uint64_t heads = e.heads, groups = e.kv_heads, d = e.head_dim;
      if (heads % groups != 0) {
        return TensorErr(e, names[0],
                         std::to_string(heads) + " heads do not split into " +
                             std::to_string(groups) + " kv_heads groups");
      }
      DCR_ASSIGN_OR_RETURN(uint64_t local, split(groups, "kv_heads"));
      const uint64_t q = heads / groups * d;  // query rows per group
      const bool bias = !e.columns.has_value();
      auto shape_of = [&](uint64_t rows) {
        return bias ? Shape{rows} : Shape{rows, *e.columns};
      };
      out[0]->shape = shape_of(heads * d);
      out[1]->shape = out[2]->shape = shape_of(groups * d);
      const Shape ss = shape_of(local * (q + 2 * d));
      for (uint32_t t = 0; t < tp; ++t) {
        uint32_t rank = RankOf(t, epg, stage);
        Shape from(ss.size(), 0), to(ss.size(), 0);
        if (e.stacked) {
          // vLLM's QKVParallelLinear: the rank's query rows, then its key
          // rows, then its value rows, each one box.
          from[0] = 0, to[0] = t * local * q;
          add(0, Box(rank, shard, ss, from, shape_of(local * q), to));
          from[0] = local * q, to[0] = t * local * d;
          add(1, Box(rank, shard, ss, from, shape_of(local * d), to));
          from[0] = local * (q + d);
          add(2, Box(rank, shard, ss, from, shape_of(local * d), to));
          continue;
        }
        for (uint64_t i = 0; i < local; ++i) {
          uint64_t g = t * local + i, base = i * (q + 2 * d);
          Shape qx = shape_of(q), kx = shape_of(d);
          from[0] = base, to[0] = g * q;
          add(0, Box(rank, shard, ss, from, qx, to));
          from[0] = base + q, to[0] = g * d;
          add(1, Box(rank, shard, ss, from, kx, to));
          from[0] = base + q + d;
          add(2, Box(rank, shard, ss, from, kx, to));
        }
      }
      return Status::OK();
    }
    case SplitKind::kPieces:
      out[0]->shape = shape;
      for (const AffinePiece& p : e.pieces) {
        if (p.rank >= layout_.ranks()) {
          return TensorErr(e, names[0],
                           "rank " + std::to_string(p.rank) +
                               " is not below the layout's " +
                               std::to_string(layout_.ranks()) + " ranks");
        }
        add(0, p);
      }
      return Status::OK();
  }
  return Status::OK();
}

Result<Layout> Resolver::Run() {
  layout_.source = spec_.source;
  layout_.tp = spec_.tp;
  layout_.pp = spec_.pp;
  layout_.ep = spec_.ep;
  layout_.layers = spec_.layers;
  layout_.experts = spec_.experts;
  auto top = [&](std::string_view path, std::string_view msg) {
    std::string_view key = path.substr(0, path.find('.'));
    auto it = spec_.lines.find(key);
    int line = it == spec_.lines.end() ? 0 : it->second;
    return yaml_doc::Error(spec_.source, line, path, msg);
  };
  if (!spec_.stages.empty() && spec_.layers == 0) {
    return top("stages", "'stages' splits the layers: give 'layers' too");
  }
  if (!spec_.stages.empty()) {
    uint64_t sum = 0;
    for (uint32_t s : spec_.stages) sum += s;
    if (spec_.stages.size() != spec_.pp || sum != spec_.layers) {
      return top("stages", "expected " + std::to_string(spec_.pp) +
                               " stages (pp) whose layers add up to " +
                               std::to_string(spec_.layers) + " (layers)");
    }
    layout_.stages = spec_.stages;
  } else if (spec_.layers > 0) {
    if (spec_.layers % spec_.pp != 0) {
      return top("layers", std::to_string(spec_.layers) +
                               " layers do not split evenly over pp " +
                               std::to_string(spec_.pp) +
                               "; give 'stages' (layers per stage)");
    }
    layout_.stages.assign(spec_.pp, spec_.layers / spec_.pp);
  }
  if (spec_.ep > 1 && spec_.experts == 0) {
    return top("parallel.ep", "expert parallelism needs 'experts'");
  }
  if (spec_.experts % spec_.ep != 0) {
    return top("experts", std::to_string(spec_.experts) +
                              " experts do not split evenly over ep " +
                              std::to_string(spec_.ep));
  }
  uint32_t first = 0;
  for (uint32_t s : layout_.stages) {
    stage_first_.push_back(first);
    first += s;
  }
  std::vector<uint32_t> stage_of(spec_.layers);
  for (uint32_t s = 0; s < layout_.stages.size(); ++s) {
    for (uint32_t l = 0; l < layout_.stages[s]; ++l) {
      stage_of[stage_first_[s] + l] = s;
    }
  }
  const uint32_t per_group = spec_.experts == 0 ? 0 : spec_.experts / spec_.ep;
  uint64_t all_pieces = 0;

  for (const EntrySpec& e : spec_.entries) {
    Placeholders ph;
    DCR_RETURN_IF_ERROR(CheckEntry(e, &ph));
    const uint32_t layers = ph.layer ? spec_.layers : 1;
    const uint32_t experts = ph.expert ? spec_.experts : 1;
    if (uint64_t{layers} * experts * e.names.size() + layout_.tensors.size() >
        kMaxTensors) {
      return Err(e, "the layout expands to more than " +
                        std::to_string(kMaxTensors) + " tensors");
    }
    // Bounded before anything is built: a short file must not expand into
    // billions of pieces.
    const uint64_t per_instance = PiecesPerInstance(e);
    all_pieces += uint64_t{layers} * experts * per_instance;
    if (all_pieces > kMaxAllPieces) {
      return Err(e, "the layout expands to more than " +
                        std::to_string(kMaxAllPieces) + " pieces");
    }
    for (uint32_t l = 0; l < layers; ++l) {
      uint32_t stage = 0;
      if (ph.layer) {
        stage = stage_of[l];
      } else if (e.stage) {
        stage = e.stage->last ? spec_.pp - 1 : e.stage->index;
      }
      uint32_t local_layer = ph.layer ? l - stage_first_[stage] : 0;
      for (uint32_t x = 0; x < experts; ++x) {
        uint32_t epg = ph.expert ? x / per_group : 0;
        uint32_t local_expert = ph.expert ? x - epg * per_group : 0;
        std::vector<std::string> names;
        std::vector<LayoutTensor*> out;
        for (const std::string& n : e.names) {
          names.push_back(Substitute(n, l, x));
          LayoutTensor* t = nullptr;
          DCR_RETURN_IF_ERROR(AddTensor(e, names.back(), &t));
          out.push_back(t);
        }
        // AddTensor may have moved the vector: take the pointers again.
        for (size_t i = 0; i < names.size(); ++i) {
          out[i] = &layout_.tensors[index_.at(names[i])];
        }
        DCR_RETURN_IF_ERROR(
            Place(e, names, Substitute(e.shard, local_layer, local_expert),
                  stage, epg, out));
        for (LayoutTensor* t : out) {
          t->copies_tp = e.split == SplitKind::kReplicated;
          t->copies_ep = !ph.expert && e.split != SplitKind::kPieces;
          if (e.fp8) {
            t->fp8 = e.fp8;
            t->fp8->scale_shard =
                Substitute(e.fp8->scale_shard.empty() ? e.shard + "_scale_inv"
                                                      : e.fp8->scale_shard,
                           local_layer, local_expert);
          }
        }
      }
    }
  }

  // Every canonical tensor: well-formed pieces that tile it, at a bounded
  // cost (the tiling check is quadratic in a tensor's pieces).
  uint64_t work = 0;
  for (size_t i = 0; i < layout_.tensors.size(); ++i) {
    const LayoutTensor& t = layout_.tensors[i];
    const EntrySpec& e = *origin_[i];
    work += uint64_t{t.pieces.size()} * t.pieces.size();
    if (work > kMaxTilingWork) {
      return Err(e,
                 "the layout has too many pieces per tensor to check "
                 "(their pairs add up to more than " +
                     std::to_string(kMaxTilingWork) + ")");
    }
    if (ElementsOver(t.shape)) {
      return TensorErr(e, t.name, "more than 2^56 elements: that is no tensor");
    }
    for (const AffinePiece& p : t.pieces) {
      Status s = CheckPiece(t.name, t.shape, p);
      if (!s.ok()) return Err(e, s.message());
      if (ElementsOver(p.shard_shape)) {
        return TensorErr(e, t.name,
                         "rank " + std::to_string(p.rank) + " shard '" +
                             p.shard + "' has more than 2^56 elements");
      }
    }
    Status s = CheckTiling(t.name, t.shape, t.pieces);
    if (!s.ok()) return Err(e, s.message());
  }

  // A shard read by several canonical tensors (a tied embedding, a fused
  // tensor) must be declared alike by each.
  std::map<std::pair<uint32_t, std::string>,
           std::pair<size_t, const AffinePiece*>>
      shards;
  for (size_t i = 0; i < layout_.tensors.size(); ++i) {
    const LayoutTensor& t = layout_.tensors[i];
    for (const AffinePiece& p : t.pieces) {
      auto [it, fresh] =
          shards.emplace(std::pair(p.rank, p.shard), std::pair(i, &p));
      if (fresh) continue;
      const LayoutTensor& o = layout_.tensors[it->second.first];
      const AffinePiece* q = it->second.second;
      if (q->shard_shape != p.shard_shape ||
          o.conversion.shard_dtype != t.conversion.shard_dtype) {
        return Err(*origin_[i],
                   "rank " + std::to_string(p.rank) + " shard '" + p.shard +
                       "' is declared with another shape or dtype by "
                       "tensor '" +
                       o.name + "' (line " + std::to_string(o.line) + ")");
      }
    }
  }

  std::sort(layout_.tensors.begin(), layout_.tensors.end(),
            [](const LayoutTensor& a, const LayoutTensor& b) {
              return a.name < b.name;
            });
  return std::move(layout_);
}

}  // namespace

Result<Layout> ResolveLayout(const LayoutSpec& spec) {
  return Resolver(spec).Run();
}

}  // namespace layout_internal

}  // namespace dcr
