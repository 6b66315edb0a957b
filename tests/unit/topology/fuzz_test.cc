// Randomized robustness of the loader: mutations of valid YAML never crash
// or throw; each either loads (and then validates, builds a tree and
// round-trips) or returns InvalidArgument naming the source.
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <string>

#include "dcr/topology.h"
#include "unit/topology/topology_testing.h"

namespace dcr {
namespace {

// Fragments that stress YAML syntax and our units.
constexpr const char* kFragments[] = {":",
                                      "-",
                                      " ",
                                      "\n",
                                      "{",
                                      "}",
                                      "[",
                                      "]",
                                      ",",
                                      "#",
                                      "&a",
                                      "*a",
                                      "!!str ",
                                      "'",
                                      "\"",
                                      "|",
                                      ">",
                                      "? ",
                                      "---\n",
                                      "...\n",
                                      "${",
                                      "${X:-",
                                      "}",
                                      "$$",
                                      "null",
                                      "~",
                                      "true",
                                      "0",
                                      "-1",
                                      "65536",
                                      "1e9",
                                      "Gbps",
                                      "MiB",
                                      "ms",
                                      "\t",
                                      "\xff",
                                      "\xc3",
                                      "<<: *a",
                                      "%YAML 1.2\n",
                                      "\\",
                                      "\x00",
                                      "nodes:",
                                      "  - {name: z, host: h, port: 1}\n",
                                      "links: [",
                                      "name: a0"};

std::string Mutate(std::string s, std::mt19937_64& rng) {
  auto pick = [&](size_t n) {
    return std::uniform_int_distribution<size_t>(0, n - 1)(rng);
  };
  int edits = 1 + static_cast<int>(pick(4));
  for (int e = 0; e < edits; ++e) {
    size_t at = s.empty() ? 0 : pick(s.size() + 1);
    switch (pick(7)) {
      case 0:  // flip a byte
        if (!s.empty()) s[pick(s.size())] = static_cast<char>(pick(256));
        break;
      case 1:  // delete a range
        if (!s.empty()) s.erase(pick(s.size()), 1 + pick(12));
        break;
      case 2: {  // insert a fragment
        std::string f = kFragments[pick(std::size(kFragments))];
        if (f.empty()) f.push_back('\0');
        s.insert(std::min(at, s.size()), f);
        break;
      }
      case 3: {  // duplicate a line
        size_t b = s.rfind('\n', at == 0 ? 0 : at - 1);
        b = b == std::string::npos ? 0 : b + 1;
        size_t end = s.find('\n', b);
        if (end == std::string::npos) break;
        s.insert(b, s.substr(b, end - b + 1));
        break;
      }
      case 4: {  // swap two lines
        std::vector<std::string> lines;
        size_t start = 0;
        for (size_t i = 0; i <= s.size(); ++i) {
          if (i == s.size() || s[i] == '\n') {
            lines.push_back(s.substr(start, i - start));
            start = i + 1;
          }
        }
        if (lines.size() > 1) {
          std::swap(lines[pick(lines.size())], lines[pick(lines.size())]);
        }
        s.clear();
        for (size_t i = 0; i < lines.size(); ++i) {
          s += lines[i] + (i + 1 < lines.size() ? "\n" : "");
        }
        break;
      }
      case 5:  // change indentation
        s.insert(std::min(at, s.size()), std::string(1 + pick(3), ' '));
        break;
      default:  // truncate
        s.resize(pick(s.size() + 1));
        break;
    }
  }
  return s;
}

TEST(TopologyFuzzTest, MutationsLoadOrFailCleanly) {
  std::mt19937_64 rng(1234);
  std::vector<std::string> seeds{testing::kSampleYaml};
  for (int i = 0; i < 8; ++i) {
    seeds.push_back(DumpTopology(testing::RandomTopology(rng)));
  }
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(20);
  int loaded = 0, refused = 0;
  for (int i = 0; i < 5000; ++i) {
    if (std::chrono::steady_clock::now() > deadline) break;
    std::string text = Mutate(seeds[i % seeds.size()], rng);
    auto t = ParseTopology(text, "fuzz.yaml");
    if (t.ok()) {
      ++loaded;
      ASSERT_TRUE(ValidateTopology(*t).ok()) << text;
      ASSERT_TRUE(BuildTree(*t).ok()) << text;
      auto again = ParseTopology(DumpTopology(*t), "dump.yaml");
      ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << text;
      ASSERT_EQ(*again, *t) << text;
    } else {
      ++refused;
      ASSERT_TRUE(t.status().IsInvalidArgument()) << t.status().ToString();
      ASSERT_EQ(t.status().message().substr(0, 9), "fuzz.yaml")
          << t.status().ToString();
    }
  }
  EXPECT_GT(loaded + refused, 1000);
  EXPECT_GT(refused, 0);
  GTEST_LOG_(INFO) << loaded << " mutations loaded, " << refused << " refused";
}

// Random edits on random topologies: each is applied only if valid.
TEST(TopologyFuzzTest, RandomEditsKeepTopologiesValid) {
  std::mt19937_64 rng(99);
  const char* keys[] = {"defaults.fanout",
                        "defaults.min_commit",
                        "defaults.window_bytes",
                        "clusters[0].fanout",
                        "clusters[1].bandwidth",
                        "links[0].bandwidth",
                        "links[0].to",
                        "root.cluster",
                        "root.port",
                        "nodes.c1n0.port",
                        "nodes.c1n0.head",
                        "clusters.c1.name",
                        "defaults.auth_key_file",
                        "defaults.apply_threads"};
  const char* values[] = {"",      "0",    "1",     "2",     "all",
                          "17000", "c0",   "c1",    "c9",    "1Gbps",
                          "x",     "true", "64MiB", "18000", "-3"};
  for (int iter = 0; iter < 300; ++iter) {
    Topology t = testing::RandomTopology(rng);
    for (int e = 0; e < 10; ++e) {
      Topology before = t;
      Status s = SetValue(&t, keys[rng() % std::size(keys)],
                          values[rng() % std::size(values)]);
      if (!s.ok()) {
        ASSERT_EQ(t, before);
      }
      ASSERT_TRUE(ValidateTopology(t).ok());
      ASSERT_TRUE(BuildTree(t).ok());
    }
  }
}

}  // namespace
}  // namespace dcr
