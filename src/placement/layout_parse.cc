// Layout YAML -> LayoutSpec: keys, types and ranges, each error located by
// file, line and key path. What needs the whole file (families, tiling,
// stages) is the resolver's (layout_resolve.cc).
#include <charconv>
#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common/file.h"
#include "common/yaml_doc.h"
#include "placement/layout_spec.h"

namespace dcr {
namespace layout_internal {
namespace {

using yaml_doc::Field;
using yaml_doc::Fields;

constexpr std::string_view kTopKeys[] = {
    "version", "parallel", "layers", "stages", "experts", "dtype", "tensors"};
constexpr std::string_view kParallelKeys[] = {"tp", "pp", "ep"};
constexpr std::string_view kEntryKeys[] = {
    "name",     "names",    "shard",   "shape",       "split",     "pad_to",
    "stage",    "dtype",    "add",     "shard_dtype", "transpose", "heads",
    "kv_heads", "head_dim", "columns", "order",       "pieces",    "fp8"};
constexpr std::string_view kFp8Keys[] = {"block", "scale"};
constexpr std::string_view kPieceKeys[] = {
    "rank", "shard", "shard_shape", "from", "extent", "to", "axis", "step"};
constexpr std::string_view kSplitNames[] = {
    "replicated", "column", "row", "vocab", "qkv", "gate_up", "pieces"};

class Parser : private yaml_doc::Reader {
 public:
  explicit Parser(std::string_view source) : Reader(source) {}

  Result<LayoutSpec> Parse(std::string_view text);

 private:
  Result<uint32_t> U32(const Field& f, const std::string& path, uint32_t lo,
                       uint32_t hi) const {
    DCR_ASSIGN_OR_RETURN(uint64_t v, Uint(f, path, lo, hi));
    return static_cast<uint32_t>(v);
  }
  Result<std::vector<uint64_t>> Uints(const Field& f, const std::string& path,
                                      uint64_t lo, uint64_t hi) const;
  Result<Shape> ShapeOf(const Field& f, const std::string& path) const {
    DCR_ASSIGN_OR_RETURN(Shape s, Uints(f, path, 1, kMaxDim));
    if (s.empty() || s.size() > kMaxDims) {
      return Err(f.line, path,
                 "expected 1 to " + std::to_string(kMaxDims) +
                     " dimensions, got " + std::to_string(s.size()));
    }
    return s;
  }
  Result<DType> DTypeOf(const Field& f, const std::string& path) const;
  Result<std::string> TensorName(const Field& f, const std::string& path) const;
  Status ParseEntry(const YAML::Node& n, int line, const std::string& path,
                    EntrySpec* e) const;
  Status ParsePiece(const YAML::Node& n, int line, const std::string& path,
                    AffinePiece* p) const;
};

Result<std::vector<uint64_t>> Parser::Uints(const Field& f,
                                            const std::string& path,
                                            uint64_t lo, uint64_t hi) const {
  DCR_ASSIGN_OR_RETURN(std::vector<YAML::Node> items, List(f, path));
  std::vector<uint64_t> out;
  for (size_t i = 0; i < items.size(); ++i) {
    std::string p = path + "[" + std::to_string(i) + "]";
    Field item{f.key, LineOf(items[i], f.line), items[i]};
    DCR_ASSIGN_OR_RETURN(uint64_t v, Uint(item, p, lo, hi));
    out.push_back(v);
  }
  return out;
}

Result<DType> Parser::DTypeOf(const Field& f, const std::string& path) const {
  DCR_ASSIGN_OR_RETURN(std::string s, Scalar(f, path));
  auto d = ParseDType(s);
  if (!d.ok()) return Err(f.line, path, d.status().message());
  return d;
}

// A tensor name: what safetensors allows, with {layer} and {expert}
// placeholders checked by the resolver.
Result<std::string> Parser::TensorName(const Field& f,
                                       const std::string& path) const {
  DCR_ASSIGN_OR_RETURN(std::string s, Scalar(f, path));
  if (s.empty() || s.size() > 1024) {
    return Err(f.line, path, "expected a tensor name of 1 to 1024 bytes");
  }
  return s;
}

Status Parser::ParsePiece(const YAML::Node& n, int line,
                          const std::string& path, AffinePiece* p) const {
  DCR_ASSIGN_OR_RETURN(Fields f, Map(n, line, path, kPieceKeys));
  for (std::string_view k : {"rank", "shard", "shard_shape", "to"}) {
    DCR_RETURN_IF_ERROR(Required(f, path, k));
  }
  for (const Field& x : f.all()) {
    std::string kp = path + "." + x.key;
    if (x.key == "rank") {
      DCR_ASSIGN_OR_RETURN(p->rank, U32(x, kp, 0, kMaxRanks - 1));
    } else if (x.key == "shard") {
      DCR_ASSIGN_OR_RETURN(p->shard, TensorName(x, kp));
    } else if (x.key == "shard_shape") {
      DCR_ASSIGN_OR_RETURN(p->shard_shape, ShapeOf(x, kp));
    } else if (x.key == "from") {
      DCR_ASSIGN_OR_RETURN(p->from, Uints(x, kp, 0, kMaxDim));
    } else if (x.key == "extent") {
      DCR_ASSIGN_OR_RETURN(p->extent, Uints(x, kp, 1, kMaxDim));
    } else if (x.key == "to") {
      DCR_ASSIGN_OR_RETURN(p->to, Uints(x, kp, 0, kMaxDim));
    } else if (x.key == "axis") {
      DCR_ASSIGN_OR_RETURN(std::vector<uint64_t> a,
                           Uints(x, kp, 0, kMaxDims - 1));
      p->axis.assign(a.begin(), a.end());
    } else if (x.key == "step") {
      DCR_ASSIGN_OR_RETURN(p->step, Uints(x, kp, 1, kMaxDim));
    }
  }
  // Defaults: the whole shard, placed as it is.
  const size_t dims = p->shard_shape.size();
  if (f.Get("from") == nullptr) p->from.assign(dims, 0);
  if (f.Get("extent") == nullptr) p->extent = p->shard_shape;
  if (f.Get("step") == nullptr) p->step.assign(dims, 1);
  if (f.Get("axis") == nullptr) {
    for (size_t d = 0; d < dims; ++d) p->axis.push_back(uint32_t(d));
  }
  return Status::OK();
}

Status Parser::ParseEntry(const YAML::Node& n, int line,
                          const std::string& path, EntrySpec* e) const {
  DCR_ASSIGN_OR_RETURN(Fields f, Map(n, line, path, kEntryKeys));
  e->line = f.line;
  e->path = path;
  DCR_RETURN_IF_ERROR(Required(f, path, "split"));
  {
    const Field& sf = *f.Get("split");
    DCR_ASSIGN_OR_RETURN(std::string s, Scalar(sf, path + ".split"));
    size_t k = 0;
    while (k < std::size(kSplitNames) && kSplitNames[k] != s) ++k;
    if (k == std::size(kSplitNames)) {
      return Err(sf.line, path + ".split",
                 "expected one of " + yaml_doc::JoinKeys(kSplitNames) +
                     ", got '" + s + "'");
    }
    e->split = static_cast<SplitKind>(k);
  }
  const SplitKind kind = e->split;
  const bool fused = kind == SplitKind::kQkv || kind == SplitKind::kGateUp;
  // Which keys each kind takes; a key for another kind is a likely
  // mistake, so it is refused rather than ignored.
  auto takes = [&](std::string_view key) {
    if (key == "name") return !fused;
    if (key == "names") return fused;
    if (key == "shard") return kind != SplitKind::kPieces;
    if (key == "shape") return kind != SplitKind::kQkv;
    if (key == "pad_to") return kind == SplitKind::kVocab;
    if (key == "heads" || key == "kv_heads" || key == "head_dim" ||
        key == "columns" || key == "order") {
      return kind == SplitKind::kQkv;
    }
    if (key == "pieces") return kind == SplitKind::kPieces;
    if (key == "fp8") return kind != SplitKind::kPieces;
    if (key == "transpose") return !fused && kind != SplitKind::kPieces;
    if (key == "stage") return kind != SplitKind::kPieces;
    return true;
  };
  for (const Field& x : f.all()) {
    if (!takes(x.key)) {
      return Err(x.line, path + "." + x.key,
                 "a '" + std::string(SplitKindName(kind)) +
                     "' entry takes no " + x.key);
    }
  }
  std::vector<std::string_view> required;
  required.push_back(fused ? "names" : "name");
  if (kind != SplitKind::kPieces) required.push_back("shard");
  if (kind == SplitKind::kQkv) {
    for (std::string_view k : {"heads", "kv_heads", "head_dim"}) {
      required.push_back(k);
    }
  } else {
    required.push_back("shape");
  }
  if (kind == SplitKind::kPieces) required.push_back("pieces");
  for (std::string_view k : required) {
    DCR_RETURN_IF_ERROR(Required(f, path, k));
  }

  for (const Field& x : f.all()) {
    std::string kp = path + "." + x.key;
    if (x.key == "name") {
      DCR_ASSIGN_OR_RETURN(std::string s, TensorName(x, kp));
      e->names.push_back(std::move(s));
    } else if (x.key == "names") {
      DCR_ASSIGN_OR_RETURN(std::vector<YAML::Node> items, List(x, kp));
      size_t want = kind == SplitKind::kQkv ? 3 : 2;
      if (items.size() != want) {
        return Err(x.line, kp,
                   kind == SplitKind::kQkv
                       ? "expected 3 names: the q, k and v tensors"
                       : "expected 2 names: the gate and up tensors");
      }
      for (size_t i = 0; i < items.size(); ++i) {
        Field item{x.key, LineOf(items[i], x.line), items[i]};
        DCR_ASSIGN_OR_RETURN(
            std::string s,
            TensorName(item, kp + "[" + std::to_string(i) + "]"));
        e->names.push_back(std::move(s));
      }
    } else if (x.key == "shard") {
      DCR_ASSIGN_OR_RETURN(e->shard, TensorName(x, kp));
    } else if (x.key == "shape") {
      DCR_ASSIGN_OR_RETURN(e->shape, ShapeOf(x, kp));
    } else if (x.key == "pad_to") {
      DCR_ASSIGN_OR_RETURN(e->pad_to, Uint(x, kp, 1, 1u << 20));
    } else if (x.key == "stage") {
      DCR_ASSIGN_OR_RETURN(std::string s, Scalar(x, kp));
      StageSpec st;
      if (s == "last") {
        st.last = true;
      } else if (s != "first") {
        auto v = yaml_doc::ParseUint(s, 0, kMaxParallel - 1);
        if (!v.ok()) {
          return Err(x.line, kp,
                     "expected first, last or a stage index, got '" + s + "'");
        }
        st.index = static_cast<uint32_t>(*v);
      }
      e->stage = st;
    } else if (x.key == "dtype") {
      DCR_ASSIGN_OR_RETURN(e->dtype, DTypeOf(x, kp));
    } else if (x.key == "shard_dtype") {
      DCR_ASSIGN_OR_RETURN(e->shard_dtype, DTypeOf(x, kp));
    } else if (x.key == "add") {
      DCR_ASSIGN_OR_RETURN(std::string s, Scalar(x, kp));
      double v = 0;
      auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      if (ec != std::errc() || end != s.data() + s.size() ||
          !(std::fabs(v) <= std::numeric_limits<float>::max())) {
        return Err(x.line, kp,
                   "expected a number that F32 holds, got '" + s + "'");
      }
      e->add = v == 0 ? 0.0 : v;  // -0 adds nothing, as 0 does
    } else if (x.key == "transpose") {
      DCR_ASSIGN_OR_RETURN(std::string s, Scalar(x, kp));
      if (s != "true" && s != "false") {
        return Err(x.line, kp, "expected true or false, got '" + s + "'");
      }
      e->transpose = s == "true";
    } else if (x.key == "heads") {
      DCR_ASSIGN_OR_RETURN(e->heads, Uint(x, kp, 1, kMaxHeads));
    } else if (x.key == "kv_heads") {
      DCR_ASSIGN_OR_RETURN(e->kv_heads, Uint(x, kp, 1, kMaxHeads));
    } else if (x.key == "head_dim") {
      DCR_ASSIGN_OR_RETURN(e->head_dim, Uint(x, kp, 1, kMaxHeads));
    } else if (x.key == "columns") {
      DCR_ASSIGN_OR_RETURN(e->columns, Uint(x, kp, 1, kMaxDim));
    } else if (x.key == "fp8") {
      DCR_ASSIGN_OR_RETURN(Fields ff, Map(x.value, x.line, kp, kFp8Keys));
      DCR_RETURN_IF_ERROR(Required(ff, kp, "block"));
      Fp8Serving fp8;
      for (const Field& y : ff.all()) {
        const std::string yp = kp + "." + y.key;
        if (y.key == "block" && y.value.IsScalar()) {
          // One scale for the whole canonical tensor.
          DCR_ASSIGN_OR_RETURN(std::string b, Scalar(y, yp));
          if (b != "tensor") {
            return Err(y.line, yp,
                       "expected [rows, columns] of a block, e.g. [128, 128], "
                       "or 'tensor' for one scale per tensor; got '" +
                           b + "'");
          }
          fp8.block_rows = fp8.block_cols = 0;
        } else if (y.key == "block") {
          DCR_ASSIGN_OR_RETURN(Shape b, Uints(y, yp, 1, 1u << 20));
          if (b.size() != 2) {
            return Err(y.line, yp,
                       "expected [rows, columns] of a block, e.g. [128, 128], "
                       "or 'tensor'");
          }
          fp8.block_rows = static_cast<uint32_t>(b[0]);
          fp8.block_cols = static_cast<uint32_t>(b[1]);
        } else {
          DCR_ASSIGN_OR_RETURN(fp8.scale_shard, TensorName(y, yp));
        }
      }
      e->fp8 = std::move(fp8);
    } else if (x.key == "order") {
      DCR_ASSIGN_OR_RETURN(std::string s, Scalar(x, kp));
      if (s != "grouped" && s != "stacked") {
        return Err(x.line, kp,
                   "expected grouped (Megatron) or stacked (vLLM, SGLang), "
                   "got '" +
                       s + "'");
      }
      e->stacked = s == "stacked";
    } else if (x.key == "pieces") {
      DCR_ASSIGN_OR_RETURN(std::vector<YAML::Node> items, List(x, kp));
      if (items.empty() || items.size() > kMaxPieces) {
        return Err(x.line, kp,
                   "expected 1 to " + std::to_string(kMaxPieces) + " pieces");
      }
      for (size_t i = 0; i < items.size(); ++i) {
        AffinePiece p;
        DCR_RETURN_IF_ERROR(ParsePiece(items[i], x.line,
                                       kp + "[" + std::to_string(i) + "]", &p));
        e->pieces.push_back(std::move(p));
      }
    }
  }
  if (e->transpose && e->shape.size() != 2) {
    return Err(f.Get("transpose")->line, path + ".transpose",
               "only a 2-dimensional tensor can be stored transposed");
  }
  return Status::OK();
}

Result<LayoutSpec> Parser::Parse(std::string_view text) {
  int docs = yaml_doc::CountDocuments(text);
  if (docs > 1) {
    return Err(0, "",
               "expected one YAML document, got " + std::to_string(docs));
  }
  YAML::Node doc = YAML::Load(std::string(text));
  if (!doc.IsDefined() || doc.IsNull()) {
    return Err(0, "",
               docs == 0 ? "the file is empty"
                         : "expected a map of layout keys (version, "
                           "parallel, tensors, ...), got no value");
  }
  LayoutSpec spec;
  spec.source = source();
  // The version first, before the keys are checked: a newer schema fails
  // on its version, not on a key this dcr does not know.
  if (doc.IsMap()) {
    for (const auto& kv : doc) {
      if (!kv.first.IsScalar() || kv.first.Scalar() != "version") continue;
      Field vf{"version", LineOf(kv.second, 1), kv.second};
      DCR_ASSIGN_OR_RETURN(uint64_t version, Uint(vf, "version", 0, 1000000));
      if (version != static_cast<uint64_t>(kLayoutVersion)) {
        return Err(vf.line, "version",
                   "unsupported layout version " + std::to_string(version) +
                       " (this dcr reads version " +
                       std::to_string(kLayoutVersion) + ")");
      }
    }
  }
  DCR_ASSIGN_OR_RETURN(Fields f, Map(doc, 1, "", kTopKeys));
  for (std::string_view k : {"version", "tensors"}) {
    DCR_RETURN_IF_ERROR(Required(f, "", k));
  }
  for (const Field& x : f.all()) {
    const std::string& p = x.key;
    spec.lines[x.key] = x.line;
    if (x.key == "parallel") {
      DCR_ASSIGN_OR_RETURN(Fields pf, Map(x.value, x.line, p, kParallelKeys));
      for (const Field& y : pf.all()) {
        std::string yp = p + "." + y.key;
        DCR_ASSIGN_OR_RETURN(uint32_t v, U32(y, yp, 1, kMaxParallel));
        (y.key == "tp" ? spec.tp : y.key == "pp" ? spec.pp : spec.ep) = v;
      }
      if (uint64_t{spec.tp} * spec.pp * spec.ep > kMaxRanks) {
        return Err(pf.line, p,
                   "tp x pp x ep is more than " + std::to_string(kMaxRanks) +
                       " ranks");
      }
    } else if (x.key == "layers") {
      DCR_ASSIGN_OR_RETURN(spec.layers, U32(x, p, 1, kMaxLayers));
    } else if (x.key == "stages") {
      DCR_ASSIGN_OR_RETURN(std::vector<uint64_t> s, Uints(x, p, 0, kMaxLayers));
      if (s.empty() || s.size() > kMaxParallel) {
        return Err(x.line, p, "expected the number of layers of each stage");
      }
      spec.stages.assign(s.begin(), s.end());
    } else if (x.key == "experts") {
      DCR_ASSIGN_OR_RETURN(spec.experts, U32(x, p, 1, kMaxLayers));
    } else if (x.key == "dtype") {
      DCR_ASSIGN_OR_RETURN(spec.dtype, DTypeOf(x, p));
    } else if (x.key == "tensors") {
      DCR_ASSIGN_OR_RETURN(std::vector<YAML::Node> items, List(x, p));
      if (items.empty()) return Err(x.line, p, "expected at least one tensor");
      for (size_t i = 0; i < items.size(); ++i) {
        EntrySpec e;
        DCR_RETURN_IF_ERROR(ParseEntry(
            items[i], x.line, "tensors[" + std::to_string(i) + "]", &e));
        spec.entries.push_back(std::move(e));
      }
    }
  }
  return spec;
}

}  // namespace

Result<LayoutSpec> ParseLayoutSpec(std::string_view text,
                                   std::string_view source) {
  return Parser(source).Parse(text);
}

}  // namespace layout_internal

std::string_view SplitKindName(SplitKind k) {
  return layout_internal::kSplitNames[static_cast<size_t>(k)];
}

Result<Layout> ParseLayout(std::string_view text,
                           std::string_view source_name) {
  std::string_view shown = source_name.empty() ? "<layout>" : source_name;
  DCR_RETURN_IF_ERROR(yaml_doc::CheckSafe(text, shown, "layout"));
  return yaml_doc::Guarded(shown, [&]() -> Result<Layout> {
    DCR_ASSIGN_OR_RETURN(layout_internal::LayoutSpec spec,
                         layout_internal::ParseLayoutSpec(text, shown));
    return layout_internal::ResolveLayout(spec);
  });
}

Result<Layout> LoadLayout(const std::string& path) {
  constexpr uintmax_t kMaxLayoutBytes = 16u << 20;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    if (ec) {
      return Status::IOError("layout file '" + path + "': " + ec.message());
    }
    return Status::NotFound("layout file '" + path + "' does not exist");
  }
  if (std::filesystem::file_size(path, ec) > kMaxLayoutBytes && !ec) {
    return Status::InvalidArgument("layout file '" + path +
                                   "' is larger than 16 MiB");
  }
  auto text = ReadFileToString(path);
  if (!text.ok()) return Status::InvalidArgument(text.status().message());
  return ParseLayout(*text, path);
}

}  // namespace dcr
