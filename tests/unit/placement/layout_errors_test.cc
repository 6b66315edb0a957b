// Bad layout YAML (dcr/layout.h): every refusal, with the line it names
// and the fix it suggests (layout_test.cc checks what resolves).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "dcr/layout.h"

namespace dcr {
namespace {

using ::testing::HasSubstr;

struct BadCase {
  const char* what;
  std::string yaml;
  std::string message;  // a substring, with the line
};

// A layout of the one tensor `entry`, after top-level keys `top`.
std::string One(const std::string& entry, const std::string& top = "") {
  return "version: 1\n" + top + "tensors:\n" + entry;
}

TEST(LayoutTest, BadLayoutsAreRefusedWithTheLineAndTheFix) {
  const std::string col =
      "  - name: w\n    shard: s\n    split: column\n    shape: [6, 4]\n";
  const BadCase cases[] = {
      {"version", "version: 2\ntensors: []\n",
       "x.yaml:1: version: unsupported layout version 2"},
      {"empty", "", "x.yaml: the file is empty"},
      {"no tensors", "version: 1\ntensors: []\n",
       "x.yaml:2: tensors: expected at least one tensor"},
      {"typo", One(col, "paralel: {tp: 2}\n"),
       "x.yaml:2: paralel: unknown key (did you mean 'parallel'?)"},
      {"bad split",
       One("  - name: w\n    shard: s\n    split: rows\n    shape: [4]\n"),
       "x.yaml:5: tensors[0].split: expected one of replicated, column, row, "
       "vocab, qkv, gate_up, pieces, got 'rows'"},
      {"key of another kind",
       One("  - name: w\n    shard: s\n    split: column\n    shape: [4]\n"
           "    heads: 2\n"),
       "x.yaml:7: tensors[0].heads: a 'column' entry takes no heads"},
      {"missing shard", One("  - name: w\n    split: column\n    shape: [4]\n"),
       "x.yaml:3: tensors[0]: missing required key 'shard'"},
      {"tp does not divide", One(col, "parallel: {tp: 4}\n"),
       "x.yaml:4: tensors[0]: tensor 'w': 6 rows do not split evenly over "
       "tp 4"},
      {"kv heads over tp",
       One("  - names: [q, k, v]\n    shard: s\n    split: qkv\n"
           "    heads: 8\n    kv_heads: 2\n    head_dim: 4\n",
           "parallel: {tp: 4}\n"),
       "tensor 'q': 2 kv_heads do not split evenly over tp 4"},
      {"heads over groups",
       One("  - names: [q, k, v]\n    shard: s\n    split: qkv\n"
           "    heads: 6\n    kv_heads: 4\n    head_dim: 4\n"),
       "tensor 'q': 6 heads do not split into 4 kv_heads groups"},
      {"qkv order",
       One("  - names: [q, k, v]\n    shard: s\n    split: qkv\n"
           "    heads: 8\n    kv_heads: 2\n    head_dim: 4\n"
           "    order: vllm\n"),
       "x.yaml:9: tensors[0].order: expected grouped (Megatron) or stacked "
       "(vLLM, SGLang), got 'vllm'"},
      {"order of another kind",
       One("  - name: w\n    shard: s\n    split: column\n    shape: [4]\n"
           "    order: stacked\n"),
       "x.yaml:7: tensors[0].order: a 'column' entry takes no order"},
      {"fp8 block",
       One("  - name: w\n    shard: s\n    split: column\n    shape: [4, 4]\n"
           "    fp8: {block: [2]}\n"),
       "x.yaml:7: tensors[0].fp8.block: expected [rows, columns] of a block"},
      {"fp8 block word",
       One("  - name: w\n    shard: s\n    split: column\n    shape: [4, 4]\n"
           "    fp8: {block: tensors}\n"),
       "x.yaml:7: tensors[0].fp8.block: expected [rows, columns] of a block, "
       "e.g. [128, 128], or 'tensor' for one scale per tensor; got 'tensors'"},
      {"fp8 key",
       One("  - name: w\n    shard: s\n    split: column\n    shape: [4, 4]\n"
           "    fp8: {block: [2, 2], scales: t}\n"),
       "tensors[0].fp8.scales: unknown key (did you mean 'scale'?)"},
      {"fp8 of an integer",
       One("  - name: w\n    shard: s\n    split: column\n    shape: [4, 4]\n"
           "    dtype: I8\n    fp8: {block: [2, 2]}\n"),
       "x.yaml:3: tensors[0]: an fp8 tensor is quantized from BF16, F16 or "
       "F32, not I8"},
      {"two names for qkv",
       One("  - names: [q, k]\n    shard: s\n    split: qkv\n"
           "    heads: 8\n    kv_heads: 2\n    head_dim: 4\n"),
       "x.yaml:3: tensors[0].names: expected 3 names: the q, k and v tensors"},
      {"duplicate tensor", One(col + col),
       "x.yaml:7: tensors[1]: tensor 'w': already declared by tensors[0] "
       "(line 3)"},
      {"layer without layers",
       One("  - name: l.{layer}.w\n    shard: l.{layer}.s\n"
           "    split: replicated\n    shape: [4]\n"),
       "x.yaml:3: tensors[0]: 'l.{layer}.w' holds {layer}, but the layout "
       "gives no 'layers'"},
      {"unknown placeholder",
       One("  - name: l.{layers}.w\n    shard: s\n    split: replicated\n"
           "    shape: [4]\n"),
       "unknown placeholder '{layers}' in 'l.{layers}.w' (known: {layer}, "
       "{expert})"},
      {"shard lacks the placeholder",
       One("  - name: l.{layer}.w\n    shard: s\n    split: replicated\n"
           "    shape: [4]\n",
           "layers: 2\n"),
       "the shard name 's' must hold the same placeholders as 'l.{layer}.w'"},
      {"uneven stages", One(col, "parallel: {pp: 3}\nlayers: 4\n"),
       "x.yaml:3: layers: 4 layers do not split evenly over pp 3; give "
       "'stages' (layers per stage)"},
      {"stages that do not add up",
       One(col, "parallel: {pp: 2}\nlayers: 4\nstages: [1, 2]\n"),
       "x.yaml:4: stages: expected 2 stages (pp) whose layers add up to 4"},
      {"ep without experts", One(col, "parallel: {ep: 2}\n"),
       "x.yaml:2: parallel.ep: expert parallelism needs 'experts'"},
      {"stage beyond pp",
       One("  - name: w\n    shard: s\n    split: replicated\n"
           "    shape: [4]\n    stage: 2\n"),
       "x.yaml:3: tensors[0]: stage 2 is not below pp 1"},
      {"conversion",
       One("  - name: w\n    shard: s\n    split: replicated\n"
           "    shape: [4]\n    shard_dtype: I32\n"),
       "no conversion from I32 to BF16"},
      {"transpose of a vector",
       One("  - name: w\n    shard: s\n    split: replicated\n"
           "    shape: [4]\n    transpose: true\n"),
       "x.yaml:7: tensors[0].transpose: only a 2-dimensional tensor can be "
       "stored transposed"},
      {"pieces overlap",
       One("  - name: w\n    split: pieces\n    shape: [4]\n    pieces:\n"
           "      - {rank: 0, shard: a, shard_shape: [3], to: [0]}\n"
           "      - {rank: 1, shard: b, shard_shape: [2], to: [2]}\n",
           "parallel: {tp: 2}\n"),
       "x.yaml:4: tensors[0]: tensor 'w': the pieces of rank 0 (shard 'a') "
       "and rank 1 (shard 'b') hold the same elements"},
      {"pieces leave a gap",
       One("  - name: w\n    split: pieces\n    shape: [4]\n    pieces:\n"
           "      - {rank: 0, shard: a, shard_shape: [2], to: [0]}\n"),
       "tensor 'w': 2 of its 4 elements are held by no rank"},
      {"piece out of bounds",
       One("  - name: w\n    split: pieces\n    shape: [4]\n    pieces:\n"
           "      - {rank: 0, shard: a, shard_shape: [4], to: [1]}\n"),
       "tensor 'w', rank 0 shard 'a': its image leaves the canonical shape"},
      {"rank beyond the layout",
       One("  - name: w\n    split: pieces\n    shape: [4]\n    pieces:\n"
           "      - {rank: 1, shard: a, shard_shape: [4], to: [0]}\n"),
       "tensor 'w': rank 1 is not below the layout's 1 ranks"},
      {"shard declared twice",
       One("  - name: a\n    shard: s\n    split: replicated\n"
           "    shape: [4]\n"
           "  - name: b\n    shard: s\n    split: replicated\n"
           "    shape: [8]\n"),
       "rank 0 shard 's' is declared with another shape or dtype by tensor "
       "'a' (line 3)"},
      {"alias", One(col, "parallel: &p {tp: 2}\n"),
       "x.yaml:2: YAML anchors and aliases (&name, *name) are not allowed in "
       "a layout"},
      {"zero dimension",
       One("  - name: w\n    shard: s\n    split: replicated\n"
           "    shape: [0]\n"),
       "x.yaml:6: tensors[0].shape[0]: expected an integer 1-1099511627776, "
       "got '0'"},
      {"syntax", "version: 1\ntensors: [\n", "x.yaml:2:"},
      {"newer version with a new key",
       "version: 2\nquantization: {}\ntensors: []\n",
       "x.yaml:1: version: unsupported layout version 2"},
      {"stages without layers", One(col, "parallel: {pp: 2}\nstages: [1, 1]\n"),
       "x.yaml:3: stages: 'stages' splits the layers: give 'layers' too"},
      {"an add F32 cannot hold",
       One("  - name: w\n    shard: s\n    split: replicated\n"
           "    shape: [4]\n    add: 1e300\n"),
       "x.yaml:7: tensors[0].add: expected a number that F32 holds, got "
       "'1e300'"},
      {"billions of pieces",
       One("  - name: l.{layer}.w\n    shard: l.{layer}.s\n"
           "    split: column\n    shape: [4096]\n",
           "parallel: {tp: 4096}\nlayers: 100000\n"),
       "x.yaml:5: tensors[0]: the layout expands to more than 1048576 "
       "pieces"},
      {"too many pieces to check",
       One("  - names: [q, k, v]\n    shard: s\n    split: qkv\n"
           "    heads: 16384\n    kv_heads: 16384\n    head_dim: 1\n"),
       "the layout has too many pieces per tensor to check"},
      {"a tensor of 2^60 elements",
       One("  - name: w\n    shard: s\n    split: replicated\n"
           "    shape: [1073741824, 1073741824]\n"),
       "tensor 'w': more than 2^56 elements"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.what);
    auto l = ParseLayout(c.yaml, "x.yaml");
    ASSERT_FALSE(l.ok());
    EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(l.status().message(), HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace dcr
