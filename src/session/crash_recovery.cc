// RefitSession::RecoverAfterCrash (refit_session.h): a relay's start after
// a crash mid-refit, from the refit's journal.
#include <fmt/format.h>
#include <unistd.h>

#include <set>

#include "session/refit_session.h"
#include "session/serving_store.h"

namespace dcr {

RefitSession::CrashRecovery RefitSession::RecoverAfterCrash(
    WeightStore* store, const std::string& journal_path,
    const std::string& boot_id, ThreadPool* pool, const ReceiverMap* serving) {
  using Outcome = CrashRecovery::Outcome;
  // What the bits hash to: the version digest, or a serving rank's bits
  // digest (what its journal's header and yes votes name).
  auto bits = [&]() -> Result<Digest128> {
    if (serving == nullptr) return store->Digests(pool).version;
    DCR_ASSIGN_OR_RETURN(auto regions,
                         session_internal::ServingRegions(store, *serving));
    return serving->BitsDigest(regions);
  };
  CrashRecovery out;
  out.unfinished = store->InProgress();
  if (!out.unfinished) {
    // A journal of a refit that ended (its removal did not happen).
    if (!journal_path.empty()) (void)::unlink(journal_path.c_str());
    return out;
  }
  const RefitInProgress& busy = *out.unfinished;
  out.outcome = Outcome::kNoJournal;
  if (journal_path.empty()) {
    out.detail = "a memory store keeps no journal";
    return out;
  }
  auto reader = JournalReader::Open(journal_path);
  if (!reader.ok()) {
    out.detail = reader.status().ToString();
    return out;
  }
  const JournalHeader& h = (*reader)->header();
  // A serving store's journal names the versions by the rank's bits.
  const bool same =
      serving != nullptr
          ? h.base.step == busy.base.step && h.target.step == busy.target.step
          : h.base == busy.base && SameTarget(h.target, busy.target);
  if (h.refit != busy.refit || !same) {
    out.detail = fmt::format("the journal {} is of refit {}, not this one",
                             journal_path, h.refit.ToHex());
    return out;
  }
  if (boot_id.empty() || h.boot_id != boot_id) {
    // A host crash: what reached the disk of the journal and of the store
    // is not known.
    out.detail = fmt::format(
        "the journal {} was written before a reboot (boot {}): not trusted",
        journal_path, h.boot_id.empty() ? "unknown" : h.boot_id);
    return out;
  }
  if (const std::optional<Digest128>& yes = (*reader)->voted_yes()) {
    // Prepared: the root may have committed R with this vote. Only the
    // root's decision may end R here. (The record learns the target's
    // digest only at the commit when the PLAN left it to END: the yes
    // vote names it.)
    if (serving != nullptr) {
      // The yes vote names the rank's bits, not the target's digest.
    } else if (busy.target.digest == Digest128{}) {
      out.unfinished->target.digest = *yes;
    } else if (*yes != busy.target.digest) {
      out.outcome = Outcome::kPreparedMix;
      out.detail = fmt::format("voted yes at {}, but the target is {}",
                               yes->ShortHex(), busy.target.digest.ShortHex());
      return out;
    }
    auto hashed = bits();
    if (!hashed.ok()) {
      out.outcome = Outcome::kPreparedMix;
      out.detail = "cannot hash the store: " + hashed.status().ToString();
      return out;
    }
    const Digest128 digest = *hashed;
    out.outcome = digest == *yes ? Outcome::kPrepared : Outcome::kPreparedMix;
    out.detail =
        out.outcome == Outcome::kPrepared
            ? fmt::format("voted yes at {}; the bits are step {}'s (verified)",
                          yes->ShortHex(), busy.target.step)
            : fmt::format(
                  "voted yes at {}, but the bits hash to {}: an "
                  "unknown mix",
                  yes->ShortHex(), digest.ShortHex());
    return out;
  }
  // Never voted yes: restore the base, last record first.
  JournalApply a;
  std::set<ChunkId> spans;
  const auto& applies = (*reader)->applies();
  const Manifest& m = store->manifest();
  const MutableShardBytes shards =
      serving != nullptr ? ShardsOf(store) : MutableShardBytes();
  Fp8Dirty dirty;
  for (auto it = applies.rbegin(); it != applies.rend(); ++it) {
    Status s = (*reader)->Read(*it, &a);
    if (serving != nullptr) {
      // (The map refuses a tensor past the layout.)
      if (s.ok()) s = RestoreServing(a, *serving, shards, &dirty);
    } else {
      if (s.ok() && a.id.tensor >= m.size()) {
        s = Status::Corruption(
            "journal record names a tensor past the manifest");
      }
      if (s.ok()) s = RestoreApply(a, store->MutableTensor(a.id.tensor));
    }
    if (!s.ok()) {
      out.outcome = Outcome::kRestoreFailed;
      out.detail = "cannot restore from " + journal_path + ": " + s.ToString();
      return out;
    }
    spans.insert(ChunkId{a.id.tensor, a.id.span, 0});  // parts: one span
    out.bytes += a.bytes();
  }
  out.spans = spans.size();
  if (serving != nullptr) {
    if (Status s = serving->Requantize(shards, &dirty); !s.ok()) {
      out.outcome = Outcome::kRestoreFailed;
      out.detail = "restored, but cannot requantize: " + s.ToString();
      return out;
    }
  }
  auto hashed = bits();
  const Digest128 base = serving != nullptr ? h.base.digest : busy.base.digest;
  if (!hashed.ok() || *hashed != base || base == Digest128{}) {
    const Digest128 digest = hashed.ok() ? *hashed : Digest128{};
    out.outcome = Outcome::kRestoreFailed;
    out.detail =
        base == Digest128{}
            ? fmt::format(
                  "restored {} records, but step {}'s bits are not "
                  "known to check them against",
                  applies.size(), busy.base.step)
            : fmt::format(
                  "the restored bits hash to {}, not step {}'s {} ({} records)",
                  digest.ShortHex(), busy.base.step, base.ShortHex(),
                  applies.size());
    (void)::unlink(journal_path.c_str());
    return out;
  }
  if (Status s = store->EndRefit(); !s.ok()) {
    out.outcome = Outcome::kRestoreFailed;
    out.detail = "restored, but cannot end the refit: " + s.ToString();
    return out;
  }
  (void)::unlink(journal_path.c_str());
  out.outcome = Outcome::kRestored;
  out.detail = fmt::format("{} records", applies.size());
  return out;
}

}  // namespace dcr
