// One test per malformed input: each checks the status code and that the
// message names the file and, where there is one, the tensor.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/bytes.h"
#include "dcr/checkpoint.h"
#include "format/safetensors_header.h"

namespace dcr {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class SafetensorsErrorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    dir_ = fs::temp_directory_path() /
           ("dcr_format_errors_test_" + std::to_string(::getpid()) + "_" +
            std::to_string(counter++));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string Path(const std::string& name) const {
    return (dir_ / name).string();
  }

  // Writes `bytes` verbatim to `name` in the test directory.
  std::string WriteBytes(const std::string& name, const std::string& bytes) {
    const std::string path = Path(name);
    std::ofstream out(path, std::ios::binary);
    out << bytes;
    return path;
  }
  // Writes a safetensors file: u64 LE header length, header, data.
  std::string WriteRaw(const std::string& name, const std::string& header,
                       size_t data_bytes) {
    return WriteRaw(name, header, std::string(data_bytes, 'd'), header.size());
  }
  std::string WriteRaw(const std::string& name, const std::string& header,
                       const std::string& data, uint64_t declared_length) {
    std::string file(8, '\0');
    StoreLE<uint64_t>(file.data(), declared_length);
    return WriteBytes(name, file + header + data);
  }

  // Opens `path` expecting failure with `code`; returns the message.
  std::string OpenError(const std::string& path, StatusCode code) {
    auto cp = Checkpoint::Open(path, Checkpoint::Mode::kReadOnly);
    EXPECT_FALSE(cp.ok());
    if (cp.ok()) return "";
    EXPECT_EQ(cp.status().code(), code) << cp.status().ToString();
    return std::string(cp.status().message());
  }

  // Writes a one-file checkpoint with header `header` and `data_bytes`
  // bytes of data, expects Corruption naming the file, returns the message.
  std::string CorruptHeader(const std::string& header, size_t data_bytes) {
    const std::string path = WriteRaw("bad.safetensors", header, data_bytes);
    std::string msg = OpenError(path, StatusCode::kCorruption);
    EXPECT_THAT(msg, HasSubstr(path));
    return msg;
  }

  fs::path dir_;
};

std::string Entry(const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  return R"({"dtype":")" + dtype + R"(","shape":)" + shape +
         R"(,"data_offsets":)" + offsets + "}";
}

TEST_F(SafetensorsErrorsTest, MissingPath) {
  const std::string path = Path("nope.safetensors");
  EXPECT_THAT(OpenError(path, StatusCode::kNotFound), HasSubstr(path));
}

TEST_F(SafetensorsErrorsTest, ShortFile) {
  const std::string path = WriteBytes("short.safetensors", "abcde");
  const std::string msg = OpenError(path, StatusCode::kCorruption);
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("too short"));
  // A zero-length file is rejected the same way.
  const std::string empty = WriteBytes("empty.safetensors", "");
  EXPECT_THAT(OpenError(empty, StatusCode::kCorruption), HasSubstr(empty));
}

TEST_F(SafetensorsErrorsTest, HugeHeaderLength) {
  const std::string path =
      WriteRaw("huge.safetensors", "{}", "", kMaxSafetensorsHeaderBytes + 1);
  const std::string msg = OpenError(path, StatusCode::kCorruption);
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("exceeds the limit"));
}

TEST_F(SafetensorsErrorsTest, HeaderPastEof) {
  const std::string path = WriteRaw("eof.safetensors", "{}", "", 100);
  const std::string msg = OpenError(path, StatusCode::kCorruption);
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("past the end of the file"));
}

TEST_F(SafetensorsErrorsTest, BadJson) {
  EXPECT_THAT(CorruptHeader(R"({"a":)", 0), HasSubstr("malformed JSON"));
  EXPECT_THAT(CorruptHeader(R"({} trailing)", 0), HasSubstr("malformed JSON"));
  EXPECT_THAT(CorruptHeader(std::string("{\"\xff\":1}"), 0),
              HasSubstr("malformed JSON"));
  EXPECT_THAT(CorruptHeader(std::string(40, '[') + std::string(40, ']'), 0),
              HasSubstr("deeper"));
}

TEST_F(SafetensorsErrorsTest, NonObject) {
  EXPECT_THAT(CorruptHeader("[1, 2]", 0), HasSubstr("not a JSON object"));
  EXPECT_THAT(CorruptHeader(R"({"w":[1]})", 0),
              HasSubstr("tensor 'w': entry is array, not an object"));
}

TEST_F(SafetensorsErrorsTest, DuplicateKey) {
  const std::string e = Entry("U8", "[4]", "[0,4]");
  EXPECT_THAT(CorruptHeader(R"({"w":)" + e + R"(,"w":)" + e + "}", 4),
              HasSubstr("tensor 'w' appears twice"));
  EXPECT_THAT(CorruptHeader(R"({"w":{"dtype":"U8","dtype":"U8","shape":[4],)"
                            R"("data_offsets":[0,4]}})",
                            4),
              HasSubstr("key 'dtype' appears twice"));
}

TEST_F(SafetensorsErrorsTest, Metadata) {
  EXPECT_THAT(CorruptHeader(R"({"__metadata__":{"a":1}})", 0),
              HasSubstr("'a'"));
  EXPECT_THAT(CorruptHeader(R"({"__metadata__":"x"})", 0),
              HasSubstr("not an object of strings"));
}

TEST_F(SafetensorsErrorsTest, UnknownDtype) {
  const std::string msg =
      CorruptHeader(R"({"w":)" + Entry("U16", "[2]", "[0,4]") + "}", 4);
  EXPECT_THAT(msg, HasSubstr("tensor 'w'"));
  EXPECT_THAT(msg, HasSubstr("'U16'"));
}

TEST_F(SafetensorsErrorsTest, FieldsMissingOrExtra) {
  EXPECT_THAT(CorruptHeader(R"({"w":{"dtype":"U8","shape":[0]}})", 0),
              HasSubstr("tensor 'w': missing field 'data_offsets'"));
  EXPECT_THAT(
      CorruptHeader(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[0,0],)"
                    R"("x":1}})",
                    0),
      HasSubstr("tensor 'w': unexpected field 'x'"));
  EXPECT_THAT(CorruptHeader(R"({"w":)" + Entry("U8", "[1]", "[0]") + "}", 1),
              HasSubstr("tensor 'w': data_offsets"));
}

TEST_F(SafetensorsErrorsTest, ShapeOffsetSizeMismatch) {
  const std::string msg =
      CorruptHeader(R"({"w":)" + Entry("F32", "[2]", "[0,4]") + "}", 4);
  EXPECT_THAT(msg, HasSubstr("tensor 'w'"));
  EXPECT_THAT(msg, HasSubstr("need 8"));
}

TEST_F(SafetensorsErrorsTest, OffsetsEndBeforeBegin) {
  EXPECT_THAT(
      CorruptHeader(R"({"w":)" + Entry("U8", "[0]", "[4,0]") + "}", 4),
      HasSubstr("tensor 'w': data_offsets [4, 0] end before they begin"));
}

TEST_F(SafetensorsErrorsTest, OutOfBoundsOffsets) {
  const std::string msg =
      CorruptHeader(R"({"w":)" + Entry("U8", "[8]", "[0,8]") + "}", 4);
  EXPECT_THAT(msg, HasSubstr("tensor 'w'"));
  EXPECT_THAT(msg, HasSubstr("past the end of the data region"));
  // Offsets so large that begin + size would wrap.
  EXPECT_THAT(CorruptHeader(R"({"w":)" +
                                Entry("U8", "[1]",
                                      "[18446744073709551615,"
                                      "18446744073709551616]") +
                                "}",
                            1),
              HasSubstr("tensor 'w'"));
}

TEST_F(SafetensorsErrorsTest, OverlappingRanges) {
  const std::string msg =
      CorruptHeader(R"({"a":)" + Entry("U8", "[8]", "[0,8]") + R"(,"b":)" +
                        Entry("U8", "[8]", "[4,12]") + "}",
                    12);
  EXPECT_THAT(msg, HasSubstr("tensor 'b'"));
  EXPECT_THAT(msg, HasSubstr("overlap tensor 'a'"));
}

TEST_F(SafetensorsErrorsTest, Hole) {
  const std::string msg =
      CorruptHeader(R"({"a":)" + Entry("U8", "[4]", "[0,4]") + R"(,"b":)" +
                        Entry("U8", "[4]", "[8,12]") + "}",
                    12);
  EXPECT_THAT(msg, HasSubstr("hole"));
  EXPECT_THAT(msg, HasSubstr("[4, 8)"));
  EXPECT_THAT(msg, HasSubstr("'b'"));
}

TEST_F(SafetensorsErrorsTest, TrailingBytes) {
  EXPECT_THAT(CorruptHeader(R"({"a":)" + Entry("U8", "[4]", "[0,4]") + "}", 6),
              HasSubstr("2 trailing bytes"));
  EXPECT_THAT(CorruptHeader("{}", 3), HasSubstr("3 trailing bytes"));
}

TEST_F(SafetensorsErrorsTest, BadShapeElements) {
  for (const char* shape : {"[-1]", "[1.5]", "[\"2\"]", "[2, null]", "3",
                            "[18446744073709551616]"}) {
    const std::string msg =
        CorruptHeader(R"({"w":)" + Entry("U8", shape, "[0,0]") + "}", 0);
    EXPECT_THAT(msg, HasSubstr("tensor 'w': shape")) << shape;
  }
}

TEST_F(SafetensorsErrorsTest, OverflowingShape) {
  const std::string msg = CorruptHeader(
      R"({"w":)" + Entry("F32", "[4294967296,4294967296]", "[0,0]") + "}", 0);
  EXPECT_THAT(msg, HasSubstr("tensor 'w'"));
  EXPECT_THAT(msg, HasSubstr("overflows"));
  // Elements fit in u64 but bytes do not.
  EXPECT_THAT(
      CorruptHeader(
          R"({"w":)" + Entry("F64", "[2305843009213693952]", "[0,0]") + "}", 0),
      HasSubstr("overflows"));
}

TEST_F(SafetensorsErrorsTest, RankTooHigh) {
  EXPECT_THAT(
      CorruptHeader(
          R"({"w":)" +
              Entry("U8", "[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]", "[0,1]") + "}",
          1),
      HasSubstr("tensor 'w': shape has rank 17"));
}

TEST_F(SafetensorsErrorsTest, ParserAcceptsPrefixOfFile) {
  // The fuzz entry point works on the header bytes alone.
  const std::string header = R"({"w":)" + Entry("U8", "[4]", "[0,4]") + "}";
  std::string bytes(8, '\0');
  StoreLE<uint64_t>(bytes.data(), header.size());
  bytes += header;
  Result<SafetensorsHeader> h = ParseSafetensorsHeader(
      std::as_bytes(std::span<const char>(bytes)), bytes.size() + 4, "f");
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->data_offset, bytes.size());
  ASSERT_EQ(h->tensors.size(), 1u);
  EXPECT_EQ(h->tensors[0].end, 4u);
  Result<SafetensorsHeader> short_input = ParseSafetensorsHeader(
      std::as_bytes(std::span<const char>(bytes)).first(10), 100, "f");
  EXPECT_FALSE(short_input.ok());
}

// Sharded checkpoints.

class IndexErrorsTest : public SafetensorsErrorsTest {
 protected:
  // Writes a valid file named `name` holding the U8 tensors `tensors`, each
  // of 4 bytes.
  void WriteShard(const std::string& name,
                  const std::vector<std::string>& tensors) {
    std::string header = "{";
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (i > 0) header += ",";
      header += "\"" + tensors[i] + "\":" +
                Entry("U8", "[4]",
                      "[" + std::to_string(4 * i) + "," +
                          std::to_string(4 * i + 4) + "]");
    }
    header += "}";
    WriteRaw(name, header, 4 * tensors.size());
  }
  std::string WriteIndex(const std::string& weight_map) {
    return WriteBytes(
        "model.safetensors.index.json",
        R"({"metadata":{"total_size":0},"weight_map":)" + weight_map + "}");
  }
};

TEST_F(IndexErrorsTest, ValidIndexOpens) {
  WriteShard("a.safetensors", {"x", "y"});
  WriteShard("b.safetensors", {"z"});
  const std::string index = WriteIndex(
      R"({"x":"a.safetensors","y":"a.safetensors","z":"b.safetensors"})");
  auto cp = Checkpoint::Open(index, Checkpoint::Mode::kReadOnly);
  ASSERT_TRUE(cp.ok()) << cp.status().ToString();
  EXPECT_EQ((*cp)->manifest().size(), 3u);
  EXPECT_EQ((*cp)->FileOf(2), Path("b.safetensors"));
}

TEST_F(IndexErrorsTest, IndexNamesMissingFile) {
  WriteShard("a.safetensors", {"x"});
  const std::string index =
      WriteIndex(R"({"x":"a.safetensors","y":"gone.safetensors"})");
  const std::string msg = OpenError(index, StatusCode::kNotFound);
  EXPECT_THAT(msg, HasSubstr(index));
  EXPECT_THAT(msg, HasSubstr("'gone.safetensors'"));
  // The directory form reports the same.
  EXPECT_THAT(OpenError(dir_.string(), StatusCode::kNotFound),
              HasSubstr("gone.safetensors"));
}

TEST_F(IndexErrorsTest, TensorInFileButNotInIndex) {
  WriteShard("a.safetensors", {"x", "y"});
  const std::string index = WriteIndex(R"({"x":"a.safetensors"})");
  const std::string msg = OpenError(index, StatusCode::kCorruption);
  EXPECT_THAT(msg, HasSubstr("tensor 'y'"));
  EXPECT_THAT(msg, HasSubstr(Path("a.safetensors")));
  EXPECT_THAT(msg, HasSubstr(index));
}

TEST_F(IndexErrorsTest, TensorInIndexButNotInFile) {
  WriteShard("a.safetensors", {"x"});
  const std::string index =
      WriteIndex(R"({"x":"a.safetensors","y":"a.safetensors"})");
  const std::string msg = OpenError(index, StatusCode::kCorruption);
  EXPECT_THAT(msg, HasSubstr("tensor 'y'"));
  EXPECT_THAT(msg, HasSubstr("a.safetensors"));
}

TEST_F(IndexErrorsTest, TensorMappedToWrongFile) {
  WriteShard("a.safetensors", {"x"});
  WriteShard("b.safetensors", {"y"});
  const std::string index =
      WriteIndex(R"({"x":"b.safetensors","y":"a.safetensors"})");
  const std::string msg = OpenError(index, StatusCode::kCorruption);
  EXPECT_THAT(msg, HasSubstr("tensor 'x'"));
  EXPECT_THAT(msg, HasSubstr(Path("a.safetensors")));
}

TEST_F(IndexErrorsTest, TensorInTwoFiles) {
  WriteShard("a.safetensors", {"x", "y"});
  WriteShard("b.safetensors", {"x", "z"});
  const std::string index = WriteIndex(
      R"({"x":"a.safetensors","y":"a.safetensors","z":"b.safetensors"})");
  const std::string msg = OpenError(index, StatusCode::kCorruption);
  EXPECT_THAT(msg, HasSubstr("tensor 'x' appears in both"));
  EXPECT_THAT(msg, HasSubstr(Path("a.safetensors")));
  EXPECT_THAT(msg, HasSubstr(Path("b.safetensors")));
}

TEST_F(IndexErrorsTest, MalformedIndex) {
  EXPECT_THAT(OpenError(WriteIndex("[1]"), StatusCode::kCorruption),
              HasSubstr("weight_map"));
  EXPECT_THAT(OpenError(WriteIndex(R"({"x":1})"), StatusCode::kCorruption),
              HasSubstr("tensor 'x'"));
  EXPECT_THAT(OpenError(WriteIndex(R"({"x":"../a.safetensors"})"),
                        StatusCode::kCorruption),
              HasSubstr("not a plain file name"));
  EXPECT_THAT(
      OpenError(WriteIndex(R"({"x":"a.safetensors","x":"a.safetensors"})"),
                StatusCode::kCorruption),
      HasSubstr("tensor 'x' appears twice"));
  const std::string index = WriteBytes("model.safetensors.index.json", "{");
  EXPECT_THAT(OpenError(index, StatusCode::kCorruption), HasSubstr(index));
}

TEST_F(IndexErrorsTest, BadShardNamesFileAndTensor) {
  WriteRaw("a.safetensors", R"({"x":)" + Entry("F32", "[2]", "[0,4]") + "}", 4);
  const std::string index = WriteIndex(R"({"x":"a.safetensors"})");
  const std::string msg = OpenError(index, StatusCode::kCorruption);
  EXPECT_THAT(msg, HasSubstr(Path("a.safetensors")));
  EXPECT_THAT(msg, HasSubstr("tensor 'x'"));
}

TEST_F(SafetensorsErrorsTest, DirectoryWithNoSafetensorsFile) {
  WriteBytes("README", "hello");
  const std::string msg = OpenError(dir_.string(), StatusCode::kNotFound);
  EXPECT_THAT(msg, HasSubstr(dir_.string()));
  EXPECT_THAT(msg, HasSubstr("pass a .safetensors file"));
}

TEST_F(SafetensorsErrorsTest, DirectoryWithTwoSafetensorsFiles) {
  WriteRaw("a.safetensors", "{}", 0);
  WriteRaw("b.safetensors", "{}", 0);
  const std::string msg =
      OpenError(dir_.string(), StatusCode::kInvalidArgument);
  EXPECT_THAT(msg, HasSubstr(dir_.string()));
  EXPECT_THAT(msg, HasSubstr("'a.safetensors', 'b.safetensors'"));
  EXPECT_THAT(msg, HasSubstr("index"));
}

// A tensor name is a JSON string and may hold \u0000 or other control
// characters. Such a name is refused, and the message shows it escaped:
// printed raw, a NUL would end the error line where C's printf stops.
TEST_F(SafetensorsErrorsTest, ControlCharacterInTensorName) {
  const std::string e = Entry("U8", "[4]", "[0,4]");
  for (const auto& [json_name, shown] :
       std::vector<std::pair<std::string, std::string>>{
           {R"(a\u0000b)", R"(a\x00b)"},
           {R"(\u0000)", R"(\x00)"},
           {R"(line\nbreak)", R"(line\x0abreak)"},
           {R"(del\u007f)", R"(del\x7f)"}}) {
    const std::string msg =
        CorruptHeader(R"({")" + json_name + R"(":)" + e + "}", 4);
    EXPECT_EQ(msg.find('\0'), std::string::npos) << json_name;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << json_name;
    EXPECT_THAT(msg, HasSubstr("tensor '" + shown + "'"));
    EXPECT_THAT(msg, HasSubstr("control character"));
  }
}

// Every other error naming such a tensor shows it escaped too: a name
// repeated in one header is caught by the JSON reader before the name
// check, as is a name in two files of an index.
TEST_F(SafetensorsErrorsTest, ControlCharacterNameEscapedInOtherErrors) {
  const std::string e = Entry("U8", "[4]", "[0,4]");
  const std::string msg =
      CorruptHeader(R"({"a\u0000b":)" + e + R"(,"a\u0000b":)" + e + "}", 4);
  EXPECT_EQ(msg.find('\0'), std::string::npos);
  EXPECT_THAT(msg, HasSubstr(R"(tensor 'a\x00b' appears twice)"));
}

}  // namespace
}  // namespace dcr
