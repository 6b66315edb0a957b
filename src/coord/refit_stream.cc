// RefitRun's stream phase: the chunks of a refit (the delta, every span
// for --full, a history chain or union, a repair round's overwrites) or of
// a producers' refit (their parts, merged) go down the tree through the
// encoder pipeline (chunk_producer.h); the phase driver is refit_run.cc.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "coord/chunk_producer.h"
#include "coord/refit_run.h"
#include "coord/span_encoder.h"

namespace dcr {

Status RefitRun::Stream(bool repair, std::vector<uint32_t> tensors) {
  repair_stream_ = repair;
  if (producers_ && !repair) return StreamProducers();
  std::unique_ptr<StreamPass> pass;
  if (!repair && ahead_) {
    pass = std::move(ahead_);
  } else {
    DCR_ASSIGN_OR_RETURN(pass, StartPass(repair, std::move(tensors)));
  }
  return RunPass(*pass);
}

Result<std::unique_ptr<RefitRun::StreamPass>> RefitRun::StartPass(
    bool repair, std::vector<uint32_t> tensors) {
  auto pass = std::make_unique<StreamPass>();
  pass->repair = repair;
  SpanEncoder::Options eo;
  eo.target = setup_.target.get();
  eo.baseline = setup_.baseline.get();
  eo.composed = setup_.composed.get();
  eo.span_elems = setup_.plan.span_elems;
  const bool union_feed =
      setup_.composed && feed_.kind == ComposedDelta::Kind::kUnion;
  eo.compress =
      options_.mode != RefitMode::kFull || options_.compress_full || union_feed;
  eo.hash = setup_.signer != nullptr;
  eo.context = setup_.plan.context_coded;
  // A mixed tree sends the base-independent copy too.
  // (Not for a repair round, whose overwrites need no copy: the record may
  // be in use by root.baseline's last writes, beside the vote.)
  eo.base_independent = (!repair && record_.active()) || setup_.mixed();
  eo.hash_base_independent = eo.hash && setup_.mixed();
  eo.scanned = repair ? nullptr : sent_.scanned();
  pass->kind = repair                              ? SpanEncoder::Kind::kFull
               : union_feed                        ? SpanEncoder::Kind::kRepair
               : setup_.composed                   ? SpanEncoder::Kind::kCompose
               : options_.mode == RefitMode::kFull ? SpanEncoder::Kind::kFull
                                                   : SpanEncoder::Kind::kDiff;
  // The first pass of a refit whose PLAN left the target's digests to END
  // hashes the target as it encodes it.
  if (!repair && setup_.plan.target_at_end() && setup_.target &&
      (pass->kind == SpanEncoder::Kind::kDiff ||
       pass->kind == SpanEncoder::Kind::kFull)) {
    pass->digests = std::make_unique<TargetDigests>(setup_.target.get(),
                                                    setup_.plan.span_elems);
    eo.digests = pass->digests.get();
  }
  pass->encoder =
      std::make_unique<SpanEncoder>(eo, pass->kind, std::move(tensors));
  StreamPass* p = pass.get();
  ChunkJob job;
  job.items = p->encoder->size();
  job.prepare = [this, p] { return p->encoder->Prepare(setup_.pool->size()); };
  job.encode = [p](size_t i, size_t worker, EncodedChunk* out) {
    return p->encoder->Encode(i, worker, out);
  };
  // in_stream_ is set (or not) before the producer is released: it emits
  // only after that.
  job.emit = [this, p](size_t i,
                       const EncodedChunk& chunk) -> Result<Outgoing> {
    DCR_ASSIGN_OR_RETURN(Outgoing o, Emit(p->encoder->id(i), chunk, p->repair));
    if (!p->repair && in_stream_) in_stream_->Changed(p->encoder->id(i));
    return o;
  };
  if (!repair) {
    // The last batch's writes go beside the vote (RunPass).
    job.after_batch = [this](bool last) {
      return last || !in_stream_ ? Status::OK() : in_stream_->AfterBatch(false);
    };
  }
  p->producer = std::make_unique<ChunkProducer>(setup_.pool.get(),
                                                setup_.plan.chunk_window_bytes,
                                                [this] { root_->Wake(); });
  p->producer->Hold();
  p->producer->Start(std::move(job));
  return pass;
}

Status RefitRun::RunPass(StreamPass& pass) {
  const bool repair = pass.repair;
  // The baseline takes the target's bits as the delta streams, behind the
  // history record (its undo log): a whole-tree delta refit that records.
  if (!repair && pass.kind == SpanEncoder::Kind::kDiff && setup_.baseline &&
      setup_.target && record_.active() && options_.only_nodes.empty()) {
    BaselineInStream::Options bo;
    bo.baseline = setup_.baseline.get();
    bo.target = setup_.target.get();
    bo.pool = setup_.pool.get();
    bo.record = &record_;
    bo.refit = report_.refit;
    bo.base = report_.base;
    bo.to = report_.target;
    bo.span_elems = setup_.plan.span_elems;
    in_stream_ = std::make_unique<BaselineInStream>(std::move(bo));
  }
  pass.producer->Release();
  RootTree::Streamed streamed =
      root_->StreamFrom(pass.producer.get(), setup_.plan.chunk_window_bytes);
  Status produced = pass.producer->Join();
  if (!repair && in_stream_ && produced.ok()) {
    // END need not wait for them; the decision does (RunPhases).
    in_stream_->SettleLastInBackground(setup_.pool->size(),
                                       [this] { root_->Wake(); });
  }
  if (repair) {
    report_.repair_chunks += streamed.chunks;
    report_.repair_bytes += streamed.payload_bytes;
    if (!produced.ok()) {
      spdlog::warn("encoding the repair round failed: {}", produced.ToString());
    }
    return produced;
  }
  report_.chunks = streamed.chunks;
  report_.payload_bytes = streamed.payload_bytes;
  if (setup_.mixed())
    report_.plain_payload_bytes = streamed.plain_payload_bytes;
  if (pass.digests && produced.ok()) {
    // Whatever the pass did not reach (it hashed every span it encoded).
    CheckpointDigests d = pass.digests->Finish(setup_.pool.get());
    report_.hashed_in_stream_seconds = pass.digests->offered_seconds();
    report_.target.digest = d.version;
    setup_.plan.target = report_.target;
    setup_.plan.target_tensor_digests = std::move(d.tensors);
    target_at_end_ = true;
    spdlog::info("target step {} is {} (hashed during the stream: {:.3f} s)",
                 report_.target.step, report_.target.digest.ShortHex(),
                 report_.hashed_in_stream_seconds);
  }
  report_.changed_elements = sent_.changed_elements();
  root_->ReportProgress();
  return produced;
}

Result<Outgoing> RefitRun::Emit(const ChunkId& id, const EncodedChunk& chunk,
                                bool repair) {
  // Numbered in the order queued: the coordinator thread sends nothing
  // else while the producer runs. A mixed tree's subtrees without context
  // get a context-coded chunk's base-independent copy, at the same
  // sequence number.
  const bool two = !repair && setup_.mixed() && !chunk.base_independent.empty();
  Outgoing o;
  if (two) {
    DCR_ASSIGN_OR_RETURN(
        auto frames, root_->sender().NextPair(FrameType::kChunk, chunk.bytes,
                                              chunk.base_independent));
    std::tie(o.frame, o.plain) = std::move(frames);
  } else {
    DCR_ASSIGN_OR_RETURN(o.frame,
                         root_->sender().Next(FrameType::kChunk, chunk.bytes));
  }
  o.payload = chunk.bytes.size();
  o.plain_payload = two ? chunk.base_independent.size() : 0;
  sent_.Add(id, chunk.sha256, chunk.sizes, repair,
            two && setup_.signer ? &chunk.base_independent_sha256 : nullptr);
  if (repair) return o;
  // The history keeps base-independent chunks: it is decoded later,
  // against no base.
  auto h = PeekChunkHeader(chunk.bytes);
  const bool context = h.ok() && h->encoding == ChunkEncoding::kContext;
  if (context) ++report_.context_chunks;
  if (!chunk.base_independent.empty()) {
    record_.Append(chunk.base_independent);
  } else if (!context) {
    record_.Append(chunk.bytes);
  } else if (record_.active()) {
    // Never reached (the encoders keep a base-independent copy while the
    // history records); a history must not hold a context chunk.
    spdlog::error(
        "not recording the history of this refit: chunk "
        "without a base-independent copy");
    record_.Discard();
  }
  return o;
}

Status RefitRun::SendJob(ChunkJob job, RootTree::Streamed* streamed) {
  const uint64_t window = setup_.plan.chunk_window_bytes;
  ChunkProducer producer(setup_.pool.get(), window, [this] { root_->Wake(); });
  producer.Start(std::move(job));
  *streamed = root_->StreamFrom(&producer, window);
  return producer.Join();
}

void RefitRun::FillProgress(RefitOptions::Progress* p) {
  p->scanned_bytes = *sent_.scanned();
  p->total_bytes = report_.checkpoint_bytes;
  // The stream's chunks are in flight until every receiver applied them:
  // that is the stream (or the repair round) still, not the vote.
  const bool in_flight =
      !p->payload_final ||
      (p->delivered_bytes && *p->delivered_bytes < p->payload_bytes);
  switch (phases_.phase()) {
    case RootPhase::kStreaming:
      p->phase = "stream";
      break;
    case RootPhase::kRepairing:
      p->phase = "repair";
      break;
    case RootPhase::kVoting:
      p->phase = !in_flight ? "vote" : repair_stream_ ? "repair" : "stream";
      break;
    case RootPhase::kCommitting:
    case RootPhase::kStopped:
    case RootPhase::kDone:
      p->phase = "commit";
      break;
    case RootPhase::kAborting:
      p->phase = "abort";
      break;
    default:
      p->phase = "plan";
      break;
  }
  options_.on_progress(*p);
}

Status RefitRun::StreamProducers() {
  ThreadPool* pool = setup_.pool.get();
  DCR_RETURN_IF_ERROR(producers_->Begin(
      setup_.baseline.get(), report_.refit, setup_.plan,
      options_.TEST_held_parts_bytes != 0 ? options_.TEST_held_parts_bytes
                                          : setup_.plan.chunk_window_bytes,
      pool));
  const uint64_t window = setup_.plan.chunk_window_bytes;
  ProducerGoMsg go;
  go.refit = report_.refit;
  go.span_elems = setup_.plan.span_elems;
  go.base = report_.base;
  go.target_step = report_.target.step;
  producers_->Go(go, window);
  ChunkJob job =
      producers_->Job(options_.phase_timeout, setup_.signer != nullptr,
                      setup_.signer != nullptr && setup_.mixed(), pool->size());
  job.emit = [&](size_t i, const EncodedChunk& chunk) -> Result<Outgoing> {
    return Emit(producers_->id(i), chunk, /*repair=*/false);
  };
  // The ranks' streams interleave tensors (pipeline stages stream at once):
  // marks tell the relays which tensors no chunk will write again, so that
  // they hash those ahead of the vote, and no others. The first goes before
  // any chunk: it tells them the stream is marked.
  job.mark = [&, sent = std::optional<uint32_t>()]() mutable
      -> Result<std::optional<Outgoing>> {
    const uint32_t below = producers_->CompleteBelow();
    if (sent && below <= *sent) return std::optional<Outgoing>();
    sent = below;
    Outgoing o;
    DCR_ASSIGN_OR_RETURN(
        o.frame, root_->sender().Next(FrameType::kStreamMark,
                                      EncodeStreamMark(StreamMarkMsg{below})));
    o.mark = true;
    return std::optional<Outgoing>(std::move(o));
  };
  RootTree::Streamed streamed;
  Status produced = SendJob(std::move(job), &streamed);
  report_.chunks = streamed.chunks;
  report_.payload_bytes = streamed.payload_bytes;
  if (setup_.mixed()) {
    report_.plain_payload_bytes = streamed.plain_payload_bytes;
  }
  if (!produced.ok()) return produced;
  CheckpointDigests d = producers_->Finish();
  report_.target.digest = d.version;
  setup_.plan.target = report_.target;
  setup_.plan.target_tensor_digests = std::move(d.tensors);
  target_at_end_ = true;
  report_.changed_elements = producers_->changed_elements();
  spdlog::info(
      "target step {} is {} (from {} producers' digest parts): {} chunks, "
      "{:.1f} MB ({} context-coded); {} spans sent as one chunk of {} "
      "parts",
      report_.target.step, report_.target.digest.ShortHex(),
      producers_->ranks(), report_.chunks,
      static_cast<double>(report_.payload_bytes) / 1e6, report_.context_chunks,
      producers_->grouped_spans(), producers_->grouped_parts());
  root_->ReportProgress();
  return Status::OK();
}

}  // namespace dcr
