// The version record: a small JSON file beside a store naming the version it
// last committed and any refit in progress. Layout in dcr/store.h and
// docs/FORMAT.md §version record.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/file.h"
#include "common/strict_json.h"
#include "dcr/store.h"
#include "store/store_internal.h"

namespace dcr {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

// Format 4 is format 3 plus the "unsynced" key; a record without the mark
// is written as format 3. Formats 1 and 2 are the same pair with the XXH3
// digests of earlier builds (dcr/store.h "Digests").
constexpr int kLegacyRecordFormat = 1;
constexpr int kLegacyUnsyncedRecordFormat = 2;
constexpr int kRecordFormat = 3;
constexpr int kUnsyncedRecordFormat = 4;
// A record nests three levels deep; anything deeper is rejected early.
constexpr int kMaxRecordDepth = 4;

// Strict parse: no comments, no trailing bytes, no key twice in one object.
Result<Json> ParseStrict(std::string_view text, const std::string& what) {
  StrictJsonOptions options;
  options.max_depth = kMaxRecordDepth;
  return ParseStrictJson(text, what, options);
}

// Validates one JSON object against an exact key set; `where` is a path
// such as "in_progress.base" for messages.
class Reader {
 public:
  explicit Reader(std::string what) : what_(std::move(what)) {}

  Status Error(const std::string& where, const std::string& msg) const {
    return Status::Corruption(
        what_ + ": " + (where.empty() ? "" : "\"" + where + "\" ") + msg);
  }

  Status ExpectKeys(const Json& j, const std::string& where,
                    std::initializer_list<const char*> allowed) const {
    if (!j.is_object()) {
      return Error(where,
                   "is " + std::string(j.type_name()) + ", not an object");
    }
    for (const auto& [key, unused] : j.items()) {
      bool known = false;
      for (const char* a : allowed) known = known || key == a;
      if (!known) return Error(where, "has unexpected key '" + key + "'");
    }
    for (const char* a : allowed) {
      if (!j.contains(a)) {
        return Error(where, "lacks key '" + std::string(a) + "'");
      }
    }
    return Status::OK();
  }

  Result<uint64_t> U64(const Json& j, const std::string& where) const {
    if (!j.is_number_unsigned()) {
      return Error(where, "is " + j.dump() + ", not a non-negative integer");
    }
    return j.get<uint64_t>();
  }

  Result<std::string> String(const Json& j, const std::string& where) const {
    if (!j.is_string())
      return Error(where, "is " + j.dump() + ", not a string");
    return j.get<std::string>();
  }

  Result<Digest128> Digest(const Json& j, const std::string& where) const {
    DCR_ASSIGN_OR_RETURN(std::string hex, String(j, where));
    Result<Digest128> d = Digest128::FromHex(hex);
    if (!d.ok()) return Error(where, std::string(d.status().message()));
    return *d;
  }

  Result<RefitId> Refit(const Json& j, const std::string& where) const {
    DCR_ASSIGN_OR_RETURN(std::string hex, String(j, where));
    Result<RefitId> id = RefitId::FromHex(hex);
    if (!id.ok()) return Error(where, std::string(id.status().message()));
    return *id;
  }

  Result<Version> ReadVersion(const Json& j, const std::string& where) const {
    DCR_RETURN_IF_ERROR(ExpectKeys(j, where, {"step", "digest"}));
    Version v;
    DCR_ASSIGN_OR_RETURN(v.step, U64(j["step"], where + ".step"));
    DCR_ASSIGN_OR_RETURN(v.digest, Digest(j["digest"], where + ".digest"));
    return v;
  }

 private:
  std::string what_;
};

// The error of a failed record write: names the record, the step and the
// temporary file, and says so plainly when the disk is full. The previous
// record is untouched whatever failed (the write goes to `tmp`).
Status RecordWriteError(const std::string& path, std::string_view step,
                        const std::string& tmp, int err) {
  const std::string what = "cannot write version record '" + path + "'";
  if (err == ENOSPC || err == EDQUOT) {
    return Status::IOError(
        what + ": the disk is full (" + std::strerror(err) + ": " +
        std::string(step) + " '" + tmp +
        "'); the previous record is unchanged; free space on that file "
        "system");
  }
  return Status::FromErrno(
      what + ": cannot " + std::string(step) + " '" + tmp + "'", err);
}

OrderedJson VersionToJson(const Version& v) {
  return OrderedJson{{"step", v.step}, {"digest", v.digest.ToHex()}};
}

}  // namespace

std::string EncodeVersionRecord(const VersionRecord& record) {
  OrderedJson j;
  // A record still holding legacy digests keeps its format: never a new
  // format number over old digests.
  j["format"] =
      (record.unsynced ? kUnsyncedRecordFormat : kRecordFormat) -
      (record.legacy_digests ? kRecordFormat - kLegacyRecordFormat : 0);
  j["manifest"] = record.manifest.ToHex();
  if (record.committed) {
    const CommitInfo& c = *record.committed;
    j["committed"] = OrderedJson{{"step", c.version.step},
                                 {"digest", c.version.digest.ToHex()},
                                 {"refit", c.refit.ToHex()},
                                 {"committed_at", c.committed_at}};
  } else {
    j["committed"] = nullptr;
  }
  if (record.in_progress) {
    const RefitInProgress& p = *record.in_progress;
    j["in_progress"] = OrderedJson{{"refit", p.refit.ToHex()},
                                   {"base", VersionToJson(p.base)},
                                   {"target", VersionToJson(p.target)},
                                   {"started_at", p.started_at}};
  } else {
    j["in_progress"] = nullptr;
  }
  if (record.unsynced) {
    j["unsynced"] = OrderedJson{{"boot_id", record.unsynced->boot_id},
                                {"since", record.unsynced->since}};
    if (record.unsynced->synced) {
      j["unsynced"]["synced"] = VersionToJson(*record.unsynced->synced);
    }
  }
  // Timestamps come from strftime, so the dump cannot meet invalid UTF-8;
  // replace rather than throw if a caller passes something odd.
  return j.dump(-1, ' ', false, OrderedJson::error_handler_t::replace) + "\n";
}

Result<VersionRecord> DecodeVersionRecord(std::string_view text,
                                          std::string_view what) {
  const std::string w(what);
  if (text.size() > kMaxVersionRecordBytes) {
    return Status::Corruption(w + ": " + std::to_string(text.size()) +
                              " bytes, more than the limit " +
                              std::to_string(kMaxVersionRecordBytes));
  }
  DCR_ASSIGN_OR_RETURN(Json j, ParseStrict(text, w));
  const Reader r(w);
  if (!j.is_object()) {
    return r.Error(
        "", "top level is " + std::string(j.type_name()) + ", not an object");
  }
  // The format number is checked before the key set, so that a newer
  // format with other keys is reported as such.
  auto format = j.find("format");
  if (format == j.end()) return r.Error("", "lacks key 'format'");
  DCR_ASSIGN_OR_RETURN(uint64_t fmt, r.U64(*format, "format"));
  if (fmt < kLegacyRecordFormat || fmt > kUnsyncedRecordFormat) {
    return Status::Unsupported(w + ": record format " + std::to_string(fmt) +
                               " (this build reads formats " +
                               std::to_string(kLegacyRecordFormat) + " to " +
                               std::to_string(kUnsyncedRecordFormat) + ")");
  }
  const bool legacy =
      fmt == kLegacyRecordFormat || fmt == kLegacyUnsyncedRecordFormat;
  if (legacy) fmt += kRecordFormat - kLegacyRecordFormat;
  if (fmt == kRecordFormat) {
    DCR_RETURN_IF_ERROR(r.ExpectKeys(
        j, "", {"format", "manifest", "committed", "in_progress"}));
  } else {
    DCR_RETURN_IF_ERROR(r.ExpectKeys(
        j, "", {"format", "manifest", "committed", "in_progress", "unsynced"}));
  }
  VersionRecord rec;
  rec.legacy_digests = legacy;
  DCR_ASSIGN_OR_RETURN(rec.manifest, r.Digest(j["manifest"], "manifest"));

  const Json& c = j["committed"];
  if (!c.is_null()) {
    DCR_RETURN_IF_ERROR(r.ExpectKeys(
        c, "committed", {"step", "digest", "refit", "committed_at"}));
    CommitInfo info;
    DCR_ASSIGN_OR_RETURN(info.version.step, r.U64(c["step"], "committed.step"));
    DCR_ASSIGN_OR_RETURN(info.version.digest,
                         r.Digest(c["digest"], "committed.digest"));
    DCR_ASSIGN_OR_RETURN(info.refit, r.Refit(c["refit"], "committed.refit"));
    DCR_ASSIGN_OR_RETURN(info.committed_at,
                         r.String(c["committed_at"], "committed.committed_at"));
    rec.committed = std::move(info);
  }

  const Json& p = j["in_progress"];
  if (!p.is_null()) {
    DCR_RETURN_IF_ERROR(r.ExpectKeys(
        p, "in_progress", {"refit", "base", "target", "started_at"}));
    RefitInProgress info;
    DCR_ASSIGN_OR_RETURN(info.refit, r.Refit(p["refit"], "in_progress.refit"));
    DCR_ASSIGN_OR_RETURN(info.base,
                         r.ReadVersion(p["base"], "in_progress.base"));
    DCR_ASSIGN_OR_RETURN(info.target,
                         r.ReadVersion(p["target"], "in_progress.target"));
    DCR_ASSIGN_OR_RETURN(info.started_at,
                         r.String(p["started_at"], "in_progress.started_at"));
    rec.in_progress = std::move(info);
  }

  if (fmt == kUnsyncedRecordFormat) {
    const Json& u = j["unsynced"];
    const bool has_synced = u.is_object() && u.contains("synced");
    DCR_RETURN_IF_ERROR(
        has_synced ? r.ExpectKeys(u, "unsynced", {"boot_id", "since", "synced"})
                   : r.ExpectKeys(u, "unsynced", {"boot_id", "since"}));
    DataUnsynced info;
    DCR_ASSIGN_OR_RETURN(info.boot_id,
                         r.String(u["boot_id"], "unsynced.boot_id"));
    if (info.boot_id.size() != 36) {
      return r.Error("unsynced.boot_id", "is not a 36-character boot id");
    }
    DCR_ASSIGN_OR_RETURN(info.since, r.String(u["since"], "unsynced.since"));
    if (has_synced) {
      DCR_ASSIGN_OR_RETURN(info.synced,
                           r.ReadVersion(u["synced"], "unsynced.synced"));
    }
    rec.unsynced = std::move(info);
  }
  return rec;
}

Result<std::optional<VersionRecord>> ReadVersionRecord(
    const std::string& path) {
  const std::string what = "version record '" + path + "'";
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::optional<VersionRecord>();
    return Status::FromErrno("cannot stat " + what, errno);
  }
  if (!S_ISREG(st.st_mode)) {
    return Status::Corruption(what + " is not a regular file");
  }
  if (static_cast<uint64_t>(st.st_size) > kMaxVersionRecordBytes) {
    return Status::Corruption(what + " is " + std::to_string(st.st_size) +
                              " bytes, more than the limit " +
                              std::to_string(kMaxVersionRecordBytes));
  }
  DCR_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  DCR_ASSIGN_OR_RETURN(VersionRecord rec, DecodeVersionRecord(text, what));
  return std::optional<VersionRecord>(std::move(rec));
}

Status WriteVersionRecord(const std::string& path,
                          const VersionRecord& record) {
  const std::string text = EncodeVersionRecord(record);
  const std::string tmp = path + ".tmp";
  UniqueFd fd(
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  // Not created: nothing of ours to remove (it may be someone's directory).
  if (!fd.valid()) return RecordWriteError(path, "create", tmp, errno);
  // Every later failure removes the temporary file: a full disk must not
  // keep a half-written one holding the space that ran out.
  auto fail = [&](std::string_view step, int err) {
    ::unlink(tmp.c_str());
    return RecordWriteError(path, step, tmp, err);
  };
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd.get(), text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail("write", errno);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd.get()) != 0) return fail("fsync", errno);
  // Some file systems (NFS) report a full disk only at close.
  if (::close(fd.Release()) != 0) return fail("close", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return fail("rename over the record", errno);
  }
  // The new record is in place; syncing its directory makes the rename
  // durable. Were that to fail, the old or the new record survives a crash,
  // both whole, so the write still counts as done.
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  UniqueFd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.valid()) (void)::fsync(dfd.get());
  return Status::OK();
}

namespace store_internal {

std::string NowIso8601() {
  struct timespec ts;
  ::clock_gettime(CLOCK_REALTIME, &ts);
  struct tm t;
  ::gmtime_r(&ts.tv_sec, &t);
  char buf[32];
  const size_t n = std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &t);
  return std::string(buf, n);
}

Status CheckRecordDirWritable(const std::string& record_path) {
  std::string dir = std::filesystem::path(record_path).parent_path().string();
  if (dir.empty()) dir = ".";
  if (::faccessat(AT_FDCWD, dir.c_str(), W_OK | X_OK, AT_EACCESS) != 0) {
    return Status::FromErrno("cannot write version record '" + record_path +
                                 "': directory '" + dir + "' is not writable",
                             errno);
  }
  return Status::OK();
}

Result<VersionRecord> LoadRecord(const std::string& record_path,
                                 const Manifest& manifest) {
  DCR_ASSIGN_OR_RETURN(std::optional<VersionRecord> found,
                       ReadVersionRecord(record_path));
  if (!found) {
    VersionRecord empty;
    empty.manifest = manifest.digest();
    return empty;
  }
  if (found->manifest != manifest.digest()) {
    return Status::Corruption(
        "version record '" + record_path +
        "' belongs to a store with manifest " + found->manifest.ShortHex() +
        " but the store has manifest " + manifest.digest().ShortHex() +
        " (the data was replaced; remove the record to treat the store as "
        "never committed)");
  }
  return std::move(*found);
}

Status RemoveRecord(const std::string& record_path) {
  if (::unlink(record_path.c_str()) != 0) {
    if (errno == ENOENT) return Status::OK();
    return Status::FromErrno(
        "cannot remove version record '" + record_path + "'", errno);
  }
  // The removal must be durable before new data can be paired with it:
  // a stale record beside re-created data would claim a version.
  std::string dir = std::filesystem::path(record_path).parent_path().string();
  if (dir.empty()) dir = ".";
  UniqueFd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dfd.valid() || ::fsync(dfd.get()) != 0) {
    return Status::FromErrno("cannot sync directory '" + dir +
                                 "' after removing version record '" +
                                 record_path + "'",
                             errno);
  }
  return Status::OK();
}

}  // namespace store_internal
}  // namespace dcr
