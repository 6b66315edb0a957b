// Shared pieces of the store backends; not part of the public API.
#ifndef DCR_STORE_STORE_INTERNAL_H_
#define DCR_STORE_STORE_INTERNAL_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/file.h"
#include "dcr/checkpoint.h"
#include "dcr/status.h"
#include "dcr/store.h"

namespace dcr::store_internal {

// The current time as ISO 8601 UTC with second resolution.
std::string NowIso8601();

// Fails (IOError) unless the directory that will hold `record_path` exists
// and this process may create files in it, so that an unwritable record
// location is reported at open, not at the first commit.
Status CheckRecordDirWritable(const std::string& record_path);

// Reads the record at `record_path` for a store with `manifest`: a missing
// record becomes an empty one; a record of another manifest is Corruption.
Result<VersionRecord> LoadRecord(const std::string& record_path,
                                 const Manifest& manifest);

// Removes the record at `record_path` if there is one.
Status RemoveRecord(const std::string& record_path);

// Takes an exclusive, non-blocking flock on `fd`; `what` names the store.
Status LockExclusive(int fd, const std::string& what);

// The memory backend (memory_store.cc): zeros, no record.
std::unique_ptr<WeightStore> CreateMemoryStore(const Manifest& manifest);

// Backends. `record_path` is already resolved (never empty).
// `spec` gives the data sync mode and the write-back delay.
Result<std::unique_ptr<WeightStore>> OpenFileStore(
    const std::string& path, const std::string& record_path,
    const StoreSpec& spec);
Result<std::unique_ptr<WeightStore>> CreateFileStore(
    const std::string& path, const std::string& record_path,
    const StoreSpec& spec, const Manifest& manifest,
    const std::map<std::string, std::string>& metadata);

Status ValidateShmName(std::string_view name);
Result<std::unique_ptr<WeightStore>> OpenShmStore(
    const std::string& name, const std::string& record_path);
Result<std::unique_ptr<WeightStore>> CreateShmStore(
    const std::string& name, const std::string& record_path,
    const Manifest& manifest,
    const std::map<std::string, std::string>& metadata);
// shm_unlink; OK when the object does not exist.
Status UnlinkShm(const std::string& name);

// The bytes a safetensors file with `manifest` and `metadata` starts with:
// the u64 LE header length, then the JSON header padded with spaces to a
// multiple of 8 bytes, byte for byte what WriteSafetensors writes. Data
// offsets lay the tensors out back to back in canonical order.
Result<std::string> SafetensorsPrefix(
    const Manifest& manifest,
    const std::map<std::string, std::string>& metadata);

}  // namespace dcr::store_internal

#endif  // DCR_STORE_STORE_INTERNAL_H_
