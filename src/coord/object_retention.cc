#include "coord/object_retention.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "common/file.h"
#include "common/mutex.h"
#include "coord/state_json.h"

namespace dcr {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kRefitsPrefix = "refits/";
constexpr std::string_view kUploading = "uploading";
constexpr std::string_view kCommitted = "committed";

Result<ObjectRefitRecord> ParseRecord(const std::string& path,
                                      const RefitId& named) {
  DCR_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  DCR_ASSIGN_OR_RETURN(nlohmann::json j, StateJson::Parse(text, path));
  StateJson f(j, path);
  DCR_RETURN_IF_ERROR(f.OnlyFields(
      {"format", "refit", "epoch", "target_step", "whole_tree", "state"}));
  DCR_RETURN_IF_ERROR(f.Format().status());
  ObjectRefitRecord r;
  DCR_ASSIGN_OR_RETURN(r.refit, f.Refit("refit"));
  if (r.refit != named) {
    return f.Bad("refit", "is not the refit the file is named after");
  }
  DCR_ASSIGN_OR_RETURN(r.epoch, f.Uint("epoch"));
  DCR_ASSIGN_OR_RETURN(r.target_step, f.Uint("target_step"));
  DCR_ASSIGN_OR_RETURN(r.whole_tree, f.Bool("whole_tree"));
  DCR_ASSIGN_OR_RETURN(std::string state, f.String("state"));
  if (state != kUploading && state != kCommitted) {
    return f.Bad("state", "is neither \"uploading\" nor \"committed\"");
  }
  r.committed = state == kCommitted;
  return r;
}

// The refit a key under refits/ belongs to: "refits/<32 hex>/...".
std::optional<std::string> RefitOfKey(std::string_view key) {
  if (!key.starts_with(kRefitsPrefix)) return std::nullopt;
  key.remove_prefix(kRefitsPrefix.size());
  const size_t slash = key.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  if (!RefitId::FromHex(key.substr(0, slash)).ok()) return std::nullopt;
  return std::string(key.substr(0, slash));
}

}  // namespace

std::string ObjectRetention::RecordPath(const RefitId& refit) const {
  return state_.ObjectsDir() + "/" + refit.ToHex() + ".json";
}

Status ObjectRetention::WriteRecord(const ObjectRefitRecord& r) const {
  std::error_code ec;
  fs::create_directories(state_.ObjectsDir(), ec);
  if (ec) {
    return Status::IOError(
        fmt::format("cannot create {}: {}", state_.ObjectsDir(), ec.message()));
  }
  const nlohmann::json j = {{"format", kStateFormat},
                            {"refit", r.refit.ToHex()},
                            {"epoch", r.epoch},
                            {"target_step", r.target_step},
                            {"whole_tree", r.whole_tree},
                            {"state", r.committed ? kCommitted : kUploading}};
  const std::string text = j.dump(2) + "\n";
  return WriteFileAtomic(RecordPath(r.refit), std::as_bytes(std::span(text)));
}

Status ObjectRetention::Begin(const RefitId& refit, uint64_t epoch,
                              uint64_t target_step, bool whole_tree) {
  std::error_code ec;
  if (fs::exists(RecordPath(refit), ec)) return Status::OK();
  return WriteRecord(
      ObjectRefitRecord{refit, epoch, target_step, whole_tree, false});
}

Status ObjectRetention::Committed(const RefitId& refit) {
  DCR_ASSIGN_OR_RETURN(ObjectRefitRecord r,
                       ParseRecord(RecordPath(refit), refit));
  if (r.committed) return Status::OK();
  r.committed = true;
  return WriteRecord(r);
}

Result<uint64_t> ObjectRetention::DeleteObjects(const std::string& refit_hex,
                                                uint64_t pushed) const {
  DCR_ASSIGN_OR_RETURN(std::vector<std::string> keys,
                       store_->List(RefitObjectPrefix(refit_hex)));
  if (pushed > 0) {
    std::set<std::string> all(keys.begin(), keys.end());
    for (uint64_t i = 0; i < pushed; ++i) {
      all.insert(RefitObjectKey(refit_hex, i));
    }
    keys.assign(all.begin(), all.end());
  }
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> removed{0};
  Mutex mu;
  Status first_error;
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < keys.size();) {
      Status s = store_->Delete(keys[i]);
      if (s.ok()) {
        removed.fetch_add(1);
        continue;
      }
      MutexLock lock(&mu);
      if (first_error.ok()) first_error = s;
    }
  };
  std::vector<std::thread> threads;
  const size_t n = std::min<size_t>(kDeleteThreads, keys.size());
  for (size_t t = 1; t < n; ++t) threads.emplace_back(work);
  work();
  for (std::thread& t : threads) t.join();
  MutexLock lock(&mu);
  if (!first_error.ok()) {
    return first_error.WithContext(
        fmt::format("{} of refit {}'s {} objects not removed",
                    keys.size() - removed.load(), refit_hex, keys.size()));
  }
  // What uploads cut short by a root that died left (directory store).
  Result<uint64_t> unfinished =
      store_->RemoveUnfinished(RefitObjectPrefix(refit_hex));
  if (!unfinished.ok()) {
    return unfinished.status().WithContext(
        fmt::format("refit {}'s unfinished uploads", refit_hex));
  }
  return removed.load();
}

Status ObjectRetention::Remove(const RefitId& refit, uint64_t pushed) {
  DCR_ASSIGN_OR_RETURN(uint64_t removed, DeleteObjects(refit.ToHex(), pushed));
  spdlog::info("removed refit {}'s {} objects from {}", refit.ToHex(), removed,
               store_->describe());
  std::error_code ec;
  fs::remove(RecordPath(refit), ec);
  if (ec) {
    return Status::IOError(
        fmt::format("cannot remove {}: {}", RecordPath(refit), ec.message()));
  }
  return Status::OK();
}

Result<std::vector<ObjectRefitRecord>> ObjectRetention::Records(
    std::vector<RefitId>* unreadable) const {
  std::vector<ObjectRefitRecord> records;
  const std::string dir = state_.ObjectsDir();
  std::error_code ec;
  if (!fs::exists(dir, ec)) return records;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const fs::path& p = e.path();
    const std::optional<RefitId> id = RefitOfJsonFile(e);
    if (!id) {
      // WriteFileAtomic's temporary file of a write cut short is not one.
      if (p.extension() != ".tmp") {
        spdlog::warn("{}: not an object record (<refit id>.json); left alone",
                     p.string());
      }
      continue;
    }
    Result<ObjectRefitRecord> r = ParseRecord(p.string(), *id);
    if (!r.ok()) {
      spdlog::warn("keeping an object record it cannot read: {}",
                   r.status().ToString());
      if (unreadable) unreadable->push_back(*id);
      continue;
    }
    records.push_back(*r);
  }
  if (ec) {
    return Status::IOError(
        fmt::format("cannot list {}: {}", dir, ec.message()));
  }
  std::sort(records.begin(), records.end(),
            [](const auto& a, const auto& b) { return a.epoch > b.epoch; });
  return records;
}

Result<RetentionReport> ObjectRetention::Prune(
    const std::optional<RefitId>& running, bool scan_store,
    bool remove_unrecorded, bool dry_run) {
  std::vector<RefitId> unreadable;
  DCR_ASSIGN_OR_RETURN(std::vector<ObjectRefitRecord> records,
                       Records(&unreadable));
  // current.json's refit (unfinished: dcr refit --resume needs its
  // objects) is not over either.
  std::optional<RefitId> unfinished;
  if (state_.HasCurrent()) {
    Result<CurrentRefit> c = state_.ReadCurrent();
    if (!c.ok()) {
      return c.status().WithContext(
          "not pruning objects: cannot tell which refit is unfinished");
    }
    unfinished = c->refit;
  }
  auto not_over = [&](const RefitId& id) {
    return (running && id == *running) || (unfinished && id == *unfinished);
  };
  // Objects per refit under refits/, when scanning.
  std::map<std::string, uint64_t> listed;
  RetentionReport report;
  if (scan_store) {
    DCR_ASSIGN_OR_RETURN(std::vector<std::string> keys,
                         store_->List(kRefitsPrefix));
    for (const std::string& key : keys) {
      if (std::optional<std::string> hex = RefitOfKey(key)) {
        ++listed[*hex];
      } else {
        report.foreign_keys.push_back(key);
      }
    }
  }
  auto remove = [&](RetainedRefit* entry, const RefitId* recorded) {
    entry->removed = true;
    if (dry_run) return;
    Result<uint64_t> n = DeleteObjects(entry->refit);
    std::error_code ec;
    if (n.ok() && recorded) fs::remove(RecordPath(*recorded), ec);
    if (!n.ok() || ec) {
      entry->removed = false;
      entry->why =
          !n.ok() ? n.status().ToString()
                  : fmt::format("cannot remove its record: {}", ec.message());
      ++report.failures;
      spdlog::warn("refit {}'s objects: {}", entry->refit, entry->why);
      return;
    }
    entry->objects = *n;
    report.objects_removed += *n;
  };
  uint32_t committed_kept = 0;
  for (const ObjectRefitRecord& r : records) {
    RetainedRefit e;
    e.refit = r.refit.ToHex();
    e.state = std::string(r.committed ? kCommitted : kUploading);
    e.target_step = r.target_step;
    if (auto it = listed.find(e.refit); it != listed.end()) {
      e.objects = it->second;
      listed.erase(it);
    } else if (scan_store) {
      e.objects = 0;
    }
    // A committed refit is over (current.json may still name it until its
    // report is written).
    if (r.committed && r.whole_tree && committed_kept < keep_) {
      ++committed_kept;
      e.why =
          fmt::format("one of the last {} committed (root.keep_deltas)", keep_);
    } else if (!r.committed && not_over(r.refit)) {
      e.why = "its refit is not over";
    } else {
      e.why = !r.committed ? "never committed (aborted, or its root stopped)"
              : !r.whole_tree
                  ? "a refit of named nodes (catch-up, repair, seed)"
                  : fmt::format("older than the last {} committed", keep_);
      remove(&e, &r.refit);
    }
    report.refits.push_back(std::move(e));
  }
  for (const RefitId& id : unreadable) {
    RetainedRefit e;
    e.refit = id.ToHex();
    e.state = "unreadable";
    if (auto it = listed.find(e.refit); it != listed.end()) {
      e.objects = it->second;
      listed.erase(it);
    }
    e.why = "its record cannot be read (logged): left alone";
    report.refits.push_back(std::move(e));
  }
  for (const auto& [hex, count] : listed) {
    RetainedRefit e;
    e.refit = hex;
    e.state = "unrecorded";
    e.objects = count;
    const Result<RefitId> id = RefitId::FromHex(hex);
    if (id.ok() && not_over(*id)) {
      e.why = "its refit is not over";
    } else if (remove_unrecorded) {
      e.why = "no record in state_dir/objects (--unrecorded)";
      remove(&e, nullptr);
    } else {
      e.why =
          "no record in state_dir/objects: another root's, or its record "
          "was removed (--unrecorded removes it)";
    }
    report.refits.push_back(std::move(e));
  }
  return report;
}

}  // namespace dcr
