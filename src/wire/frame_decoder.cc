// The incremental frame decoder (contract in dcr/wire.h).
#include <algorithm>
#include <cstring>

#include "dcr/wire.h"
#include "wire/frame_internal.h"

namespace dcr {

FrameDecoder::FrameDecoder(FrameOptions options)
    : options_(std::move(options)) {}

void FrameDecoder::Fail(Status why) {
  status_ = std::move(why);
  current_.reset();
  header_have_ = 0;
}

void FrameDecoder::Feed(std::span<const std::byte> data) {
  while (!data.empty() && !failed()) {
    if (current_ == nullptr) {
      const size_t n = std::min(data.size(), kFrameHeaderSize - header_have_);
      std::memcpy(header_buf_.data() + header_have_, data.data(), n);
      header_have_ += n;
      data = data.subspan(n);
      if (header_have_ < kFrameHeaderSize) return;
      // The header is validated (length bound included) before the frame's
      // buffer is reserved.
      Result<ParsedFrameHeader> parsed =
          ParseFrameHeader(std::span<const std::byte, kFrameHeaderSize>(
                               header_buf_.data(), kFrameHeaderSize),
                           options_);
      if (!parsed.ok()) {
        Fail(parsed.status());
        return;
      }
      if (frames_started_ == 0 && options_.first_frame_max_payload != 0 &&
          parsed->payload_length > options_.first_frame_max_payload) {
        Fail(Status::Corruption(
            FrameTypeName(parsed->header.type) + " payload of " +
            std::to_string(parsed->payload_length) +
            " bytes exceeds the limit of " +
            std::to_string(options_.first_frame_max_payload) +
            " bytes for a link's first frame (a greeting)"));
        return;
      }
      ++frames_started_;
      parsed_ = *parsed;
      current_size_ = parsed_.frame_size();
      current_ = std::make_shared<std::vector<std::byte>>();
      current_->reserve(current_size_);
      current_->insert(current_->end(), header_buf_.begin(), header_buf_.end());
      header_have_ = 0;
    } else {
      const size_t n = std::min(data.size(), current_size_ - current_->size());
      current_->insert(current_->end(), data.begin(), data.begin() + n);
      data = data.subspan(n);
    }
    if (current_->size() == current_size_) FinishFrame();
  }
}

void FrameDecoder::FinishFrame() {
  std::shared_ptr<std::vector<std::byte>> buf = std::move(current_);
  current_.reset();
  Result<Frame> frame =
      wire_internal::CheckFrameBody(parsed_, std::span(*buf), options_);
  if (!frame.ok()) {
    Fail(frame.status());
    return;
  }
  ready_.push_back(DecodedFrame{*frame, FrameBuffer(std::move(buf))});
}

Result<std::optional<DecodedFrame>> FrameDecoder::Next() {
  if (!ready_.empty()) {
    DecodedFrame f = std::move(ready_.front());
    ready_.pop_front();
    return std::optional<DecodedFrame>(std::move(f));
  }
  if (failed()) return status_;
  return std::optional<DecodedFrame>();
}

size_t FrameDecoder::partial_bytes() const {
  return current_ ? current_->size() : header_have_;
}

size_t FrameDecoder::reserved_bytes() const {
  return current_ ? current_->capacity() : 0;
}

}  // namespace dcr
