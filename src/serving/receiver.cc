// ServingReceiver (include/dcr/serving.h): the two images mapped
// read-only, the live header, and the relay's socket (serving/pause_link.h).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "common/file.h"
#include "dcr/serving.h"
#include "format/safetensors_header.h"
#include "serving/pause_link.h"
#include "serving/pause_messages.h"

namespace dcr {

// One image, mapped read-only.
class ServingReceiver::Image {
 public:
  static Result<std::shared_ptr<Image>> Map(const std::string& name) {
    const std::string describe = "shm:" + name;
    UniqueFd fd(::shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0));
    if (!fd.valid()) {
      return Status::FromErrno("cannot open " + describe, errno);
    }
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) {
      return Status::FromErrno("cannot stat " + describe, errno);
    }
    const size_t size = static_cast<size_t>(st.st_size);
    if (size < 8) return Status::Corruption(describe + " is not an image");
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) {
      return Status::FromErrno("cannot map " + describe, errno);
    }
    auto image = std::shared_ptr<Image>(
        new Image(static_cast<const std::byte*>(p), size));
    image->inode_ = st.st_ino;
    DCR_ASSIGN_OR_RETURN(
        SafetensorsHeader header,
        ParseSafetensorsHeader({image->data_, size}, size, describe));
    std::vector<TensorInfo> infos;
    for (const SafetensorsEntry& e : header.tensors) {
      infos.push_back(e.info);
      image->spans_.push_back(
          {image->data_ + header.data_offset + e.begin, e.end - e.begin});
    }
    auto manifest = Manifest::Create(std::move(infos));
    if (!manifest.ok()) {
      return Status::Corruption(describe + ": " +
                                std::string(manifest.status().message()));
    }
    image->manifest_ = *std::move(manifest);
    return image;
  }
  ~Image() { ::munmap(const_cast<std::byte*>(data_), size_); }

  const Manifest& manifest() const { return manifest_; }
  std::span<const std::byte> Tensor(size_t i) const { return spans_[i]; }
  // Whether `name` is still the object this maps (not removed and made
  // again, as the relay's first catch-up or a reseed does).
  bool Current(const std::string& name) const {
    struct stat st;
    UniqueFd fd(::shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0));
    return fd.valid() && ::fstat(fd.get(), &st) == 0 && st.st_ino == inode_ &&
           static_cast<size_t>(st.st_size) == size_;
  }

 private:
  Image(const std::byte* data, size_t size) : data_(data), size_(size) {}
  const std::byte* data_;
  size_t size_;
  ino_t inode_ = 0;
  Manifest manifest_;
  std::vector<std::span<const std::byte>> spans_;
};

ServingReceiver::ServingReceiver(Options options)
    : options_(std::move(options)) {}
ServingReceiver::~ServingReceiver() = default;

Result<std::unique_ptr<ServingReceiver>> ServingReceiver::Open(
    const Options& options) {
  if (options.store.kind != StoreSpec::Kind::kShm) {
    return Status::InvalidArgument(
        "a serving process maps a shm store (shm:NAME), not '" +
        options.store.path + "'");
  }
  std::unique_ptr<ServingReceiver> r(new ServingReceiver(options));
  const std::string name = LiveHeaderName(options.store);
  const auto until = std::chrono::steady_clock::now() + options.wait;
  // Until the relay's first commit made the header (a header being made
  // reads as corrupt for a moment), and the live image's reader lock is
  // taken (the relay holds it only while a flip is under way).
  for (;;) {
    Status s;
    if (!r->header_) {
      auto header = LiveHeader::Open(name);
      if (header.ok()) {
        r->header_.emplace(*std::move(header));
      } else {
        s = header.status();
      }
    }
    if (r->header_) {
      auto state = r->header_->Read();
      s = state.ok() ? r->Move(*state) : state.status();
      if (s.ok()) break;
    }
    const StatusCode c = s.code();
    if ((c != StatusCode::kNotFound && c != StatusCode::kCorruption &&
         c != StatusCode::kAborted) ||
        std::chrono::steady_clock::now() >= until) {
      return s;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!options.socket.empty()) {
    r->port_ = std::make_unique<PauseLink>(options.socket);
  }
  (void)r->Poll();  // attach now if the relay listens
  return r;
}

const Manifest& ServingReceiver::manifest() const {
  return images_[live_.image]->manifest();
}

std::span<const std::byte> ServingReceiver::Tensor(size_t i) const {
  return images_[live_.image]->Tensor(i);
}

std::shared_ptr<const void> ServingReceiver::Pin() const {
  return images_[live_.image];
}

bool ServingReceiver::attached() const { return port_ && port_->connected(); }

Status ServingReceiver::Move(const LiveState& state) {
  // The new image's reader lock first (the relay does not write it from
  // now on), then a check that it is still the live one.
  DCR_ASSIGN_OR_RETURN(UniqueFd lock,
                       LockImage(options_.store, state.image, false));
  DCR_ASSIGN_OR_RETURN(LiveState now, header_->Read());
  if (now.image != state.image) {
    return Status::Aborted("the relay flipped again meanwhile");
  }
  std::shared_ptr<Image>& image = images_[state.image];
  // Mapped again only if the object is not the one mapped: the relay
  // creates the second image at its first catch-up.
  const std::string name = ServingImageSpec(options_.store, state.image).path;
  if (!image || !image->Current(name)) {
    DCR_ASSIGN_OR_RETURN(image, Image::Map(name));
  }
  const std::shared_ptr<Image>& other = images_[1 - state.image];
  if (other && other->manifest().digest() != image->manifest().digest()) {
    return Status::Corruption(
        "the relay's two images hold different tensors: " +
        Manifest::Difference(other->manifest(), image->manifest()));
  }
  live_ = now;
  // The old image's lock goes: the relay may write it from now on.
  reader_lock_ = std::move(lock);
  return Status::OK();
}

Result<std::optional<LiveState>> ServingReceiver::Pending() const {
  Result<LiveState> read = header_->Read();
  // A header being repaired: nothing pending yet.
  if (!read.ok() && read.status().code() == StatusCode::kCorruption) {
    return std::optional<LiveState>();
  }
  DCR_ASSIGN_OR_RETURN(LiveState state, std::move(read));
  if (state.image == live_.image) return std::optional<LiveState>();
  return std::optional<LiveState>(state);
}

Result<bool> ServingReceiver::Poll(bool move) {
  if (port_) {
    if (port_->MaybeConnect()) {
      PauseMsg hello;
      hello.op = PauseMsg::Op::kHello;
      hello.pid = static_cast<uint64_t>(::getpid());
      hello.image = live_.image;
      port_->Send(hello);
    }
    for (const PauseMsg& m : port_->Receive()) {
      if (m.op == PauseMsg::Op::kPrepare) {
        // Ready: this process computes on the live image only and moves
        // at its next Poll after the commit.
        PauseMsg ready;
        ready.op = PauseMsg::Op::kReady;
        ready.refit = m.refit;
        port_->Send(ready);
        ++prepares_;
      }
      // live, commit, abort: the header says what to compute on.
    }
  }
  Result<LiveState> read = header_->Read();
  if (!read.ok() && read.status().code() == StatusCode::kCorruption) {
    // Torn by a relay's crash, or replaced by a restarted relay: stay on
    // the image held (its lock keeps it whole) and map the header again.
    auto again = LiveHeader::Open(LiveHeaderName(options_.store));
    if (again.ok()) header_.emplace(*std::move(again));
    return false;
  }
  DCR_ASSIGN_OR_RETURN(LiveState state, std::move(read));
  if (state.image == live_.image) {
    live_ = state;
    return false;
  }
  if (!move) return false;
  if (Status s = Move(state); !s.ok()) {
    // Busy (the relay is mid-flip): stay on the image held, try again.
    if (s.code() == StatusCode::kAborted) return false;
    return s;
  }
  if (port_) {
    PauseMsg flipped;
    flipped.op = PauseMsg::Op::kFlipped;
    flipped.image = live_.image;
    flipped.version.step = live_.version.step;
    port_->Send(flipped);
  }
  return true;
}

}  // namespace dcr
