// Helpers shared by the topology sources; not part of the public API.
#ifndef DCR_TOPOLOGY_INTERNAL_H_
#define DCR_TOPOLOGY_INTERNAL_H_

#include <span>
#include <string>
#include <string_view>

#include "common/yaml_doc.h"
#include "dcr/status.h"
#include "dcr/topology.h"

namespace dcr::topology_internal {

// "<source>:<line>: <path>: <msg>", leaving out what is unknown (line 0,
// empty path).
Status Error(std::string_view source, int line, std::string_view path,
             std::string_view msg);

// Names of clusters and nodes: 1-64 characters of [A-Za-z0-9_-], starting
// with a letter or digit, so they can appear in SetValue keys and DOT ids.
// Returns an error message, or "" when `name` is valid.
std::string CheckName(std::string_view name);
// Hosts: a host name, IPv4 or IPv6 address (no spaces or brackets).
std::string CheckHost(std::string_view host);
// "" when `s` is valid UTF-8 without control characters (tab and newline
// allowed: they survive a dump), else why not.
using yaml_doc::CheckText;

Result<TransportKind> ParseTransport(std::string_view s);
Result<StoreKind> ParseStoreKind(std::string_view s);
Result<ChunkSource> ParseChunkSource(std::string_view s);
Result<ObjectStoreKind> ParseObjectStoreKind(std::string_view s);
// "memory", "file:/path", "shm:name".
Result<StoreLocation> ParseStoreSpec(std::string_view s);
// An integer in [lo, hi] written in decimal.
using yaml_doc::ParseUint;
Result<uint16_t> ParsePort(std::string_view s);
Result<bool> ParseBool(std::string_view s);
// "all" (0) or an integer >= 1.
Result<uint32_t> ParseMinCommit(std::string_view s);
// defaults.apply_threads: 1 to kMaxApplyThreads; empty (an empty
// `${VAR:-}` in a file, or `dcr topo set defaults.apply_threads=`): 0, not
// given.
Result<uint32_t> ParseApplyThreads(std::string_view s);

using yaml_doc::ClosestKey;
using yaml_doc::JoinKeys;

// Escapes "$" so that ExpandEnv returns `s` unchanged.
std::string EscapeEnv(std::string_view s);

// The keys of the `defaults` and `root` mappings (topology/README.md), for
// the parser's and the editor's unknown-field errors.
inline constexpr std::string_view kDefaultsKeys[] = {
    "transport",    "span_elems",
    "fanout",       "window_bytes",
    "min_commit",   "auth_key_file",
    "tls_ca_file",  "tls_cert_file",
    "tls_key_file", "signing_public_key_file",
    "apply_threads"};
inline constexpr std::string_view kRootKeys[] = {"name",
                                                 "host",
                                                 "port",
                                                 "cluster",
                                                 "state_dir",
                                                 "baseline",
                                                 "signing_key_file",
                                                 "keep_deltas"};

}  // namespace dcr::topology_internal

#endif  // DCR_TOPOLOGY_INTERNAL_H_
