#include "protocol/epoch_file.h"

#include <charconv>
#include <filesystem>
#include <span>
#include <system_error>
#include <utility>

#include "common/file.h"

namespace dcr {

EpochFile::EpochFile(std::string path, std::string meaning)
    : path_(std::move(path)), meaning_(std::move(meaning)) {}

Result<uint64_t> ParseEpoch(std::string_view text) {
  uint64_t epoch = 0;
  auto [end, err] =
      std::from_chars(text.data(), text.data() + text.size(), epoch);
  if (err != std::errc() || end == text.data() ||
      text.substr(end - text.data()).find_first_not_of('\n') !=
          std::string_view::npos) {
    return Status::Corruption("not an epoch number");
  }
  return epoch;
}

Result<uint64_t> EpochFile::Read() const {
  if (path_.empty()) return uint64_t{0};
  std::error_code ec;
  if (!std::filesystem::exists(path_, ec)) return uint64_t{0};
  DCR_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path_));
  auto epoch = ParseEpoch(text);
  if (!epoch.ok()) {
    return Status::Corruption(
        path_ + ": not an epoch number" +
        (meaning_.empty() ? std::string() : "; " + meaning_));
  }
  return *epoch;
}

Status EpochFile::Write(uint64_t epoch) const {
  if (path_.empty()) return Status::OK();
  std::string text = std::to_string(epoch) + "\n";
  return WriteFileAtomic(
      path_, std::as_bytes(std::span<const char>(text.data(), text.size())));
}

Result<uint64_t> EpochFile::Next() const {
  DCR_ASSIGN_OR_RETURN(uint64_t last, Read());
  DCR_RETURN_IF_ERROR(Write(last + 1));
  return last + 1;
}

}  // namespace dcr
