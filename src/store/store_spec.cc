// Store specs (memory:, file:PATH, shm:NAME), their record paths, and the
// factory that opens, creates and removes each backend's stores.
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <string_view>

#include "dcr/store.h"
#include "store/store_internal.h"

namespace dcr {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kRecordSuffix = ".dcr-version";
constexpr std::string_view kDirRecordName = "store.dcr-version";
constexpr std::string_view kShmDir = "/dev/shm/";

std::string ResolvedRecordPath(const StoreSpec& spec) {
  return spec.record_path.empty() ? DefaultRecordPath(spec) : spec.record_path;
}

}  // namespace

// ------------------------------------------------------------------- specs

std::string StoreSpec::ToString() const {
  switch (kind) {
    case Kind::kMemory:
      return "memory:";
    case Kind::kFile:
      return "file:" + path;
    case Kind::kShm:
      return "shm:" + path;
  }
  return "?";
}

Result<StoreSpec> ParseStoreSpec(std::string_view text) {
  const size_t colon = text.find(':');
  const std::string_view kind = text.substr(0, colon);
  const std::string_view rest =
      colon == std::string_view::npos ? "" : text.substr(colon + 1);
  StoreSpec spec;
  if (kind == "memory") {
    if (!rest.empty()) {
      return Status::InvalidArgument("store '" + std::string(text) +
                                     "': a memory store takes no path");
    }
    spec.kind = StoreSpec::Kind::kMemory;
    return spec;
  }
  if (colon == std::string_view::npos || (kind != "file" && kind != "shm")) {
    return Status::InvalidArgument(
        "store '" + std::string(text) +
        "' is not one of memory:, file:PATH, shm:NAME");
  }
  if (rest.empty()) {
    return Status::InvalidArgument("store '" + std::string(text) +
                                   "' names no path");
  }
  if (kind == "file") {
    spec.kind = StoreSpec::Kind::kFile;
    spec.path = std::string(rest);
    return spec;
  }
  spec.kind = StoreSpec::Kind::kShm;
  spec.path = rest.front() == '/' ? std::string(rest) : "/" + std::string(rest);
  DCR_RETURN_IF_ERROR(store_internal::ValidateShmName(spec.path));
  return spec;
}

std::string DefaultRecordPath(const StoreSpec& spec) {
  switch (spec.kind) {
    case StoreSpec::Kind::kMemory:
      return "";
    case StoreSpec::Kind::kFile: {
      std::error_code ec;
      if (fs::is_directory(spec.path, ec)) {
        return (fs::path(spec.path) / kDirRecordName).string();
      }
      return spec.path + std::string(kRecordSuffix);
    }
    case StoreSpec::Kind::kShm:
      // spec.path is "/name"; the record sits beside the object.
      return std::string(kShmDir) + spec.path.substr(1) +
             std::string(kRecordSuffix);
  }
  return "";
}

// ----------------------------------------------------------------- factory

Result<std::unique_ptr<WeightStore>> OpenStore(const StoreSpec& spec) {
  switch (spec.kind) {
    case StoreSpec::Kind::kMemory:
      return Status::InvalidArgument(
          "a memory store cannot be reopened; create it with CreateStore");
    case StoreSpec::Kind::kFile:
      if (spec.path.empty()) {
        return Status::InvalidArgument("file store spec names no path");
      }
      return store_internal::OpenFileStore(spec.path, ResolvedRecordPath(spec),
                                           spec);
    case StoreSpec::Kind::kShm:
      DCR_RETURN_IF_ERROR(store_internal::ValidateShmName(spec.path));
      return store_internal::OpenShmStore(spec.path, ResolvedRecordPath(spec));
  }
  return Status::Internal("unknown store kind");
}

Result<std::unique_ptr<WeightStore>> CreateStore(
    const StoreSpec& spec, const Manifest& manifest,
    const std::map<std::string, std::string>& metadata) {
  switch (spec.kind) {
    case StoreSpec::Kind::kMemory:
      return store_internal::CreateMemoryStore(manifest);
    case StoreSpec::Kind::kFile:
      if (spec.path.empty()) {
        return Status::InvalidArgument("file store spec names no path");
      }
      return store_internal::CreateFileStore(
          spec.path, ResolvedRecordPath(spec), spec, manifest, metadata);
    case StoreSpec::Kind::kShm:
      DCR_RETURN_IF_ERROR(store_internal::ValidateShmName(spec.path));
      return store_internal::CreateShmStore(spec.path, ResolvedRecordPath(spec),
                                            manifest, metadata);
  }
  return Status::Internal("unknown store kind");
}

Status RemoveStore(const StoreSpec& spec) {
  switch (spec.kind) {
    case StoreSpec::Kind::kMemory:
      return Status::OK();
    case StoreSpec::Kind::kFile: {
      const std::string record_path = ResolvedRecordPath(spec);
      std::error_code ec;
      if (fs::is_directory(spec.path, ec)) {
        return Status::InvalidArgument("RemoveStore refuses directory '" +
                                       spec.path + "'");
      }
      DCR_RETURN_IF_ERROR(store_internal::RemoveRecord(record_path));
      if (::unlink(spec.path.c_str()) != 0 && errno != ENOENT) {
        return Status::FromErrno("cannot remove '" + spec.path + "'", errno);
      }
      return Status::OK();
    }
    case StoreSpec::Kind::kShm:
      DCR_RETURN_IF_ERROR(store_internal::ValidateShmName(spec.path));
      DCR_RETURN_IF_ERROR(
          store_internal::RemoveRecord(ResolvedRecordPath(spec)));
      return store_internal::UnlinkShm(spec.path);
  }
  return Status::Internal("unknown store kind");
}
}  // namespace dcr
