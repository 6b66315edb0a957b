// Relay::Impl's start (relay_impl.h): checks the options, opens the store
// (and, after a crash mid-refit, restores its base from the journal or
// says why not), reads the epoch file, sizes the windows to the memory
// limit, and listens.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "relay/memory_budget.h"
#include "relay/relay_impl.h"

namespace dcr {
namespace {

// The bound on a link's first frame (HELLO or ERROR, both small).
constexpr uint32_t kFirstFrameMaxPayload = 64u << 10;

// Where a relay persists the highest coordinator epoch it accepted: beside
// the store's version record ("<store>.dcr-epoch"); empty for a memory store
// (kept in memory).
std::string EpochPath(const StoreSpec& spec) {
  if (spec.kind == StoreSpec::Kind::kMemory) return "";
  std::string record =
      spec.record_path.empty() ? DefaultRecordPath(spec) : spec.record_path;
  constexpr std::string_view kSuffix = ".dcr-version";
  if (record.size() > kSuffix.size() && record.ends_with(kSuffix)) {
    record.resize(record.size() - kSuffix.size());
  }
  return record + ".dcr-epoch";
}

}  // namespace

Status Relay::Impl::Init() {
  if (options_.name.empty()) {
    return Status::InvalidArgument("relay: a node name is required");
  }
  DCR_RETURN_IF_ERROR(ApplyMemoryLimit());
  // The first frame of every link is a HELLO (or an ERROR): a peer that
  // has not greeted cannot make the relay hold a large frame.
  FrameOptions& frames = options_.transport_options.frames;
  if (frames.first_frame_max_payload == 0) {
    frames.first_frame_max_payload =
        std::min(frames.max_payload, kFirstFrameMaxPayload);
  }
  sender_.emplace(frames);
  if (!options_.undo_dir.empty()) {
    // Found out now, not at the first refit: the directory takes journals.
    Status probe = Journal::ProbeDir(options_.undo_dir);
    if (!probe.ok()) {
      return Status::InvalidArgument(
          "undo directory '" + options_.undo_dir +
          "' cannot hold a refit's journal: " + probe.ToString());
    }
  }
  DCR_RETURN_IF_ERROR(LoadServing());
  if (!options_.serving_socket.empty()) {
    DCR_ASSIGN_OR_RETURN(
        images_,
        ServingImages::Open(
            {.node = options_.name,
             .store = options_.store,
             .socket = options_.serving_socket,
             .deadline = options_.serving_deadline,
             .pool = nullptr,  // set below, once the pool exists
             .post =
                 [this](std::function<void()> fn) {
                   mailbox_.Post(std::move(fn));
                 },
             .attach_device =
                 [this](const std::string& socket, const Manifest* live) {
                   return AttachServerGpu(socket, live);
                 },
             .device_patch_budget = device_patch_budget_}));
  }
  if (!options_.on_commit.empty()) {
    hook_ = std::make_unique<CommitHook>(
        CommitHook::Options{.command = options_.on_commit,
                            .node = options_.name,
                            .store = options_.store.ToString(),
                            .timeout = options_.on_commit_timeout});
  }
  const StoreSpec spec = images_ ? images_->standby_spec() : options_.store;
  auto store = OpenStore(spec);
  if (store.ok()) {
    store_ = *std::move(store);
    if (serving_ && store_->manifest().digest() != serving_store_.digest()) {
      return Status::InvalidArgument(fmt::format(
          "{} does not hold the shards of serving rank {} of {}: {}; "
          "move it away and seed the node with a full refit",
          store_->describe(), options_.serving_rank, options_.serving_layout,
          Manifest::Difference(serving_store_, store_->manifest())));
    }
  } else if (store.status().code() == StatusCode::kNotFound) {
    spdlog::warn("{}: {}; it joins the next full refit (dcr refit --full)",
                 options_.name, store.status().message());
  } else {
    return store.status();
  }
  epoch_file_ = EpochFile(
      EpochPath(options_.store),
      "it holds the highest coordinator epoch this relay accepted (delete "
      "it only if no older coordinator can come back)");
  DCR_ASSIGN_OR_RETURN(max_epoch_, epoch_file_.Read());
  TransportOptions to = options_.transport_options;
  to.name = options_.name;
  transports_ = std::make_unique<TransportSet>(
      to, to.fake_network ? std::string("fake") : std::string());
  DCR_ASSIGN_OR_RETURN(listener_, transports_->Get(options_.transport));
  DCR_ASSIGN_OR_RETURN(decoder_, ChunkDecoder::Create());
  // An apply completion is an event of the refit: Advance runs after it.
  workers_ = std::make_unique<ApplyWorkers>(options_.apply_threads,
                                            [this] { mailbox_.Wake(); });
  hash_pool_ = std::make_unique<ThreadPool>(options_.apply_threads);
  RecoverStore();
  if (images_) {
    images_->set_pool(hash_pool_.get());
    DCR_RETURN_IF_ERROR(images_->Reconcile(store_, prepared_.has_value()));
    // After the store's lock: a second relay started by mistake stops at
    // the store, before it touches this one's socket.
    DCR_RETURN_IF_ERROR(images_->Listen());
  }
  env_ = RelayRefit::Env{options_.name,
                         workers_.get(),
                         hash_pool_.get(),
                         decoder_.get(),
                         options_.signing_public_key.get(),
                         &counters_};
  inbound_ = std::make_unique<InboundLinks>(
      InboundLinks::Options{
          options_.name, options_.peer_addresses, options_.max_inbound_links,
          options_.inbound_quota_bytes, options_.known_nodes,
          options_.hello_timeout, options_.idle_timeout,
          [this](uint64_t id) {
            return current_ && current_->parent->link_id() == id;
          }},
      &mailbox_, &*sender_,
      InboundLinks::Counters{&counters_.links_refused,
                             &counters_.inbound_pauses,
                             counters_.peers_cut.data()},
      [this](const std::shared_ptr<Link>& link, const Frame& frame,
             const FrameBuffer& buffer) { OnFrame(link, frame, buffer); },
      [this](uint64_t id, const Status& why) { OnClosed(id, why); });
  inbound_->set_epoch(max_epoch_);
  Status s = listener_->Listen(options_.listen_host, options_.listen_port,
                               inbound_->Handler());
  if (!s.ok()) {
    transports_->Stop();
    return s;
  }
  PublishStats();
  actor_ = std::thread([this] { Run(); });
  spdlog::info("{}: listening on {}:{} ({}) with {}; apply threads: {}",
               options_.name, options_.listen_host, port(), listener_->kind(),
               store_ ? store_->describe() : options_.store.ToString(),
               options_.apply_threads);
  return Status::OK();
}

void Relay::Impl::RecoverStore() {
  if (!store_) return;
  Result<std::string> boot = CurrentBootId();
  using Outcome = RefitSession::CrashRecovery::Outcome;
  const RefitSession::CrashRecovery r = RefitSession::RecoverAfterCrash(
      store_.get(), JournalPath(store_->record_path(), options_.undo_dir),
      boot.ok() ? *boot : std::string(), hash_pool_.get(), serving_.get());
  if (r.outcome == Outcome::kNothing) return;
  const RefitInProgress& u = *r.unfinished;
  const std::string id = u.refit.ToHex();
  switch (r.outcome) {
    case Outcome::kNothing:
      return;
    case Outcome::kRestored:
      restored_from_ = u.refit;
      counters_.repairs_restored += 1;
      spdlog::warn(
          "{}: restored step {} after a crash mid-refit {}: {} spans, {} bytes",
          options_.name, u.base.step, id, r.spans, r.bytes);
      return;
    case Outcome::kPrepared:
    case Outcome::kPreparedMix:
      prepared_ = PreparedAfterCrash{u.refit, u.target,
                                     r.outcome == Outcome::kPrepared};
      spdlog::warn(
          "{}: {} holds refit {} (step {} -> {}) prepared: {}; it stays "
          "unfinished until the root's decision (it is never restored "
          "here after a yes vote)",
          options_.name, store_->describe(), id, u.base.step, u.target.step,
          r.detail);
      return;
    case Outcome::kRestoreFailed:
    case Outcome::kNoJournal:
      spdlog::warn(
          "{}: {} holds an unfinished refit {} (a mix of step {} and {}) and "
          "could not restore its base ({}); it takes no delta refit until "
          "the root repairs it",
          options_.name, store_->describe(), id, u.base.step, u.target.step,
          r.detail);
      return;
  }
}

Status Relay::Impl::LoadServing() {
  if (options_.serving_layout.empty()) return Status::OK();
  auto bad = [&](const Status& s) {
    return Status::InvalidArgument(
        fmt::format("serving rank {} of {}: {}", options_.serving_rank,
                    options_.serving_layout, s.message()));
  };
  auto layout = LoadLayout(options_.serving_layout);
  if (!layout.ok()) return bad(layout.status());
  auto map = ReceiverMap::Create(*layout, options_.serving_rank);
  if (!map.ok()) return bad(map.status());
  auto stored = map->StoreManifest();
  if (!stored.ok()) return bad(stored.status());
  serving_store_ = *std::move(stored);
  serving_ = std::make_unique<ReceiverMap>(*std::move(map));
  spdlog::info("{}: serves rank {} of {} (layout {}): {} shard tensors",
               options_.name, options_.serving_rank, options_.serving_layout,
               serving_->fingerprint().ShortHex(), serving_store_.size());
  return Status::OK();
}

Result<std::unique_ptr<DeviceWeights>> Relay::Impl::AttachServerGpu(
    const std::string& socket, const Manifest* live) {
  // The tensors the server computes with: its rank's shards less the FP8
  // shadows, or without a serving layout every tensor of the live image.
  std::vector<TensorInfo> want;
  std::string whose, source;
  if (serving_) {
    for (const auto& [name, shard] : serving_->DeviceShards()) {
      want.push_back({name, shard.dtype, shard.shape});
    }
    whose = fmt::format("serving rank {}", serving_->rank());
    source = fmt::format("the layout {}", options_.serving_layout);
  } else if (live != nullptr) {
    want = live->tensors();
    whose = "the server";
    source = "the live image of " + options_.store.ToString();
  } else {
    return Status::Unsupported(
        "the relay has committed no version yet and has no serving layout "
        "to say which tensors a server holds: attach after its first full "
        "refit");
  }
  return AttachCudaIpcWeights(socket, std::move(want), whose, source);
}

Status Relay::Impl::ApplyMemoryLimit() {
  if (options_.memory_limit_bytes == 0) return Status::OK();
  FrameOptions& frames = options_.transport_options.frames;
  DCR_ASSIGN_OR_RETURN(
      MemoryBudget b,
      PlanMemoryBudget(options_.memory_limit_bytes, options_.apply_threads,
                       frames.max_payload));
  auto lower = [](auto& bound, auto cap) {
    if (bound == 0 || bound > cap) bound = cap;
  };
  lower(options_.apply_window_bytes, b.apply_window_bytes);
  // A GPU server's patches: the apply share, less their staging slots and
  // the diff's scratch (relay/device_weights.h).
  const uint64_t patch_overhead =
      kPatchStagingBytes +
      kPatchScratchPerThread * std::max<size_t>(options_.apply_threads, 1);
  device_patch_budget_ = b.apply_window_bytes > patch_overhead
                             ? b.apply_window_bytes - patch_overhead
                             : 0;
  lower(options_.forward_window_cap, b.forward_window_bytes);
  lower(options_.inbound_quota_bytes, b.inbound_quota_bytes);
  lower(options_.max_inbound_links, b.max_inbound_links);
  frames.max_payload = b.max_frame_payload;
  options_.resend_buffer_bytes =
      std::min(options_.resend_buffer_bytes.value_or(b.resend_buffer_bytes),
               b.resend_buffer_bytes);
  // A last guard per link: a child's queue never holds more than the
  // forward window, what is in flight from the parent and one frame.
  lower(options_.transport_options.max_queued_bytes,
        static_cast<size_t>(b.forward_window_bytes + b.inbound_quota_bytes +
                            2ull * b.max_frame_payload));
  spdlog::info("{}: memory limit {}", options_.name, b.ToString());
  return Status::OK();
}

Status Relay::Impl::PersistEpoch(uint64_t epoch) {
  if (epoch <= max_epoch_) return Status::OK();
  DCR_RETURN_IF_ERROR(epoch_file_.Write(epoch));
  max_epoch_ = epoch;
  inbound_->set_epoch(epoch);
  return Status::OK();
}

}  // namespace dcr
