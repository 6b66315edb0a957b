// TLS on the TCP backend (TransportOptions::tls): a CA and node
// certificates made at test time with OpenSSL, mutual authentication,
// refusals (no certificate, another CA, plain TCP on either side), the
// transport's features over TLS (large frames, backpressure, pacing, frame
// authentication on top) and the configuration errors.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dcr/transport.h"
#include "dcr/wire.h"
#include "transport/fake_transport.h"
#include "unit/transport/test_pki.h"
#include "unit/transport/transport_test_util.h"
#include "wire/hmac_authenticator.h"

namespace dcr {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using testing::Pki;
using testing::Recorder;
using testing::TestFrame;

using testing::kConnectTimeout;

bool HasSubstr(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

// One PKI for the whole suite: CA "ca" signs nodes a, b and c; CA "other"
// signs node "stranger".
class TlsTransportTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    pki_ = new Pki();
    pki_->MakeCa("ca");
    pki_->MakeCa("other");
    pki_->MakeNode("a", "ca");
    pki_->MakeNode("b", "ca");
    pki_->MakeNode("c", "ca");
    pki_->MakeNode("stranger", "other");
  }
  static void TearDownTestSuite() {
    delete pki_;
    pki_ = nullptr;
  }

  static TransportOptions Options(const std::string& node,
                                  const std::string& ca = "ca") {
    TransportOptions o;
    o.tls = pki_->Tls(node, ca);
    return o;
  }

  static std::unique_ptr<Transport> Make(const TransportOptions& o) {
    Result<std::unique_ptr<Transport>> t = CreateTransport("tcp", o);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return t.ok() ? std::move(t).value() : nullptr;
  }

  static Status CreateError(const TlsOptions& tls) {
    TransportOptions o;
    o.tls = tls;
    return CreateTransport("tcp", o).status();
  }

  static Pki* pki_;
};

Pki* TlsTransportTest::pki_ = nullptr;

// A listening transport with a recorder.
struct Server {
  explicit Server(const TransportOptions& o, bool pause_on_open = false)
      : recorder(std::make_shared<Recorder>()) {
    Result<std::unique_ptr<Transport>> t = CreateTransport("tcp", o);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (!t.ok()) return;
    transport = std::move(t).value();
    recorder->set_pause_on_open(pause_on_open);
    Status s = transport->Listen("127.0.0.1", 0, recorder);
    EXPECT_TRUE(s.ok()) << s.ToString();
    port = transport->BoundPort();
  }
  std::unique_ptr<Transport> transport;
  std::shared_ptr<Recorder> recorder;
  uint16_t port = 0;
};

TEST_F(TlsTransportTest, MutualTlsCarriesFramesBothWays) {
  Server server(Options("a"));
  ASSERT_NE(server.port, 0);
  server.recorder->set_on_frame(
      [](Link& link, const FrameBuffer& buf) { link.Send(buf); });
  auto client = Make(Options("b"));
  ASSERT_TRUE(client);
  auto client_rec = std::make_shared<Recorder>();
  auto link =
      client->Connect("127.0.0.1", server.port, client_rec, kConnectTimeout);
  ASSERT_TRUE(link.ok()) << link.status().ToString();
  EXPECT_EQ((*link)->peer(), "127.0.0.1:" + std::to_string(server.port));
  // Small frames (gathered into shared records) and large ones (records
  // straight from the frame's buffer), interleaved.
  std::vector<FrameBuffer> sent;
  for (uint64_t i = 0; i < 400; ++i) {
    const size_t size = i % 100 == 99 ? (8u << 20) + i : 1 + (i * 7919) % 3000;
    sent.push_back(TestFrame(i, size));
    (*link)->Send(sent.back());
  }
  ASSERT_TRUE(client_rec->WaitFrames(sent.size()));
  auto got = client_rec->frames();
  ASSERT_EQ(got.size(), sent.size());
  size_t total = 0;
  for (size_t i = 0; i < sent.size(); ++i) {
    ASSERT_EQ(*got[i].buffer, *sent[i]) << "frame " << i;
    total += sent[i]->size();
  }
  ASSERT_TRUE(server.recorder->WaitFrames(sent.size()));
  ASSERT_TRUE(client_rec->WaitFor([&] { return (*link)->QueuedBytes() == 0; }));
  const LinkStats s = (*link)->stats();
  EXPECT_EQ(s.frames_sent, sent.size());
  EXPECT_EQ(s.bytes_sent, total);  // the frames' bytes, not the records'
  EXPECT_EQ(s.bytes_received, total);
  // Both ends close cleanly and report it once.
  (*link)->Close();
  ASSERT_TRUE(client_rec->WaitClosed(1));
  EXPECT_TRUE(client_rec->closed()[0].why.ok());
  ASSERT_TRUE(server.recorder->WaitClosed(1));
  EXPECT_EQ(server.recorder->closed()[0].why.code(), StatusCode::kIOError);
  EXPECT_TRUE(HasSubstr(server.recorder->closed()[0].why.message(),
                        "closed the connection"))
      << server.recorder->closed()[0].why.ToString();
}

TEST_F(TlsTransportTest, BackpressureQueuesAndDrainsOverTls) {
  TransportOptions so = Options("a");
  TransportOptions co = Options("b");
  co.high_watermark = 8u << 20;
  co.low_watermark = 1u << 20;
  Server server(so, /*pause_on_open=*/true);
  auto client = Make(co);
  ASSERT_TRUE(client);
  auto client_rec = std::make_shared<Recorder>();
  auto link =
      client->Connect("127.0.0.1", server.port, client_rec, kConnectTimeout);
  ASSERT_TRUE(link.ok()) << link.status().ToString();
  ASSERT_TRUE(server.recorder->WaitOpened(1));
  constexpr size_t kFrames = 64, kSize = 1u << 20;
  std::vector<FrameBuffer> sent;
  size_t total = 0;
  for (uint64_t i = 0; i < kFrames; ++i) {
    sent.push_back(TestFrame(i, kSize));
    total += sent.back()->size();
    (*link)->Send(sent.back());
  }
  // The paused reader stops the writer once the socket buffers are full.
  ASSERT_TRUE(
      client_rec->WaitFor([&] { return (*link)->QueuedBytes() < total; }));
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_GT((*link)->QueuedBytes(), total / 2);
  EXPECT_EQ(server.recorder->frames().size(), 0u);
  EXPECT_EQ(client_rec->drained(), 0);

  server.recorder->opened()[0]->ResumeReading();
  ASSERT_TRUE(server.recorder->WaitFrames(kFrames));
  auto got = server.recorder->frames();
  for (size_t i = 0; i < kFrames; ++i) ASSERT_EQ(*got[i].buffer, *sent[i]);
  ASSERT_TRUE(client_rec->WaitFor([&] { return (*link)->QueuedBytes() == 0; }));
  ASSERT_TRUE(client_rec->WaitFor([&] { return client_rec->drained() >= 1; }));
  EXPECT_EQ(client_rec->drained(), 1);
}

TEST_F(TlsTransportTest, PacingHoldsOverTls) {
  TransportOptions co = Options("b");
  co.max_send_bps = 40'000'000;  // 5 MB/s
  Server server(Options("a"));
  auto client = Make(co);
  ASSERT_TRUE(client);
  auto client_rec = std::make_shared<Recorder>();
  auto link =
      client->Connect("127.0.0.1", server.port, client_rec, kConnectTimeout);
  ASSERT_TRUE(link.ok()) << link.status().ToString();
  std::vector<FrameBuffer> sent;
  size_t total = 0;
  for (uint64_t i = 0; total < 2'500'000; ++i) {
    sent.push_back(TestFrame(i, 1 + (i * 104729) % 250000));
    total += sent.back()->size();
  }
  const double ideal = static_cast<double>(total) * 8 / co.max_send_bps;
  const Clock::time_point start = Clock::now();
  for (const FrameBuffer& f : sent) (*link)->Send(f);
  ASSERT_TRUE(server.recorder->WaitFrames(sent.size()));
  const double elapsed =
      std::chrono::duration<double>(Clock::now() - start).count();
  auto got = server.recorder->frames();
  for (size_t i = 0; i < sent.size(); ++i) ASSERT_EQ(*got[i].buffer, *sent[i]);
  EXPECT_GE(elapsed, 0.7 * ideal) << "ideal " << ideal << " s";
  EXPECT_LE(elapsed, 2.0 * ideal) << "ideal " << ideal << " s";
}

TEST_F(TlsTransportTest, FrameAuthenticationStaysOnTop) {
  auto keyed = [](char fill) {
    std::vector<std::byte> key(32, static_cast<std::byte>(fill));
    auto a = HmacFrameAuthenticator::Create(key);
    EXPECT_TRUE(a.ok()) << a.status().ToString();
    return std::shared_ptr<const FrameAuthenticator>(std::move(a).value());
  };
  FrameHeader h;
  h.type = FrameType::kChunk;
  h.sequence = 7;
  std::vector<std::byte> payload(100000, std::byte{0x5a});

  // The same key on both ends: the signed frame arrives.
  TransportOptions so = Options("a");
  so.frames.authenticator = keyed('k');
  TransportOptions co = Options("b");
  co.frames.authenticator = so.frames.authenticator;
  Server server(so);
  auto client = Make(co);
  ASSERT_TRUE(client);
  auto rec = std::make_shared<Recorder>();
  auto link = client->Connect("127.0.0.1", server.port, rec, kConnectTimeout);
  ASSERT_TRUE(link.ok()) << link.status().ToString();
  auto frame = EncodeFrame(h, payload, co.frames);
  ASSERT_TRUE(frame.ok());
  (*link)->Send(*frame);
  ASSERT_TRUE(server.recorder->WaitFrames(1));
  EXPECT_EQ(*server.recorder->frames()[0].buffer, **frame);

  // A valid certificate does not stand in for the key.
  TransportOptions wrong = Options("c");
  wrong.frames.authenticator = keyed('x');
  auto other = Make(wrong);
  ASSERT_TRUE(other);
  auto other_rec = std::make_shared<Recorder>();
  auto other_link =
      other->Connect("127.0.0.1", server.port, other_rec, kConnectTimeout);
  ASSERT_TRUE(other_link.ok()) << other_link.status().ToString();
  auto forged = EncodeFrame(h, payload, wrong.frames);
  ASSERT_TRUE(forged.ok());
  (*other_link)->Send(*forged);
  ASSERT_TRUE(server.recorder->WaitClosed(1));
  EXPECT_EQ(server.recorder->closed()[0].why.code(), StatusCode::kCorruption)
      << server.recorder->closed()[0].why.ToString();
  EXPECT_EQ(server.recorder->frames().size(), 1u);
}

// A TLS client with only the CA (no certificate), in raw OpenSSL.
TEST_F(TlsTransportTest, ClientWithoutCertificateIsRefused) {
  Server server(Options("a"));
  ASSERT_NE(server.port, 0);
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  ASSERT_NE(ctx, nullptr);
  ASSERT_EQ(
      SSL_CTX_load_verify_locations(ctx, pki_->path("ca.crt").c_str(), nullptr),
      1);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(server.port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  // A server that accepted the client would leave SSL_read waiting.
  timeval timeout{5, 0};
  ASSERT_EQ(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout)),
            0);
  SSL* ssl = SSL_new(ctx);
  SSL_set_fd(ssl, fd);
  // Under TLS 1.3 the client's side of the handshake completes before the
  // server has looked at its (missing) certificate; the refusal arrives
  // as an alert on the first read.
  const int connected = SSL_connect(ssl);
  if (connected == 1) {
    EXPECT_EQ(SSL_version(ssl), TLS1_3_VERSION);  // 1.3 is preferred
    FrameBuffer f = TestFrame(1, 100);
    SSL_write(ssl, f->data(), static_cast<int>(f->size()));
    char buf[64];
    EXPECT_LE(SSL_read(ssl, buf, sizeof(buf)), 0);
  }
  SSL_free(ssl);
  ::close(fd);
  SSL_CTX_free(ctx);
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_TRUE(server.recorder->opened().empty());
  EXPECT_TRUE(server.recorder->frames().empty());
}

TEST_F(TlsTransportTest, ServerFromAnotherCaIsRefused) {
  Server server(Options("stranger", "other"));
  ASSERT_NE(server.port, 0);
  auto client = Make(Options("b"));
  ASSERT_TRUE(client);
  auto link = client->Connect("127.0.0.1", server.port,
                              std::make_shared<Recorder>(), kConnectTimeout);
  ASSERT_FALSE(link.ok());
  EXPECT_EQ(link.status().code(), StatusCode::kIOError);
  const std::string want =
      "TLS handshake with 127.0.0.1:" + std::to_string(server.port) +
      " failed: certificate verify failed";
  EXPECT_TRUE(HasSubstr(link.status().message(), want))
      << link.status().ToString();
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_TRUE(server.recorder->opened().empty());
}

TEST_F(TlsTransportTest, ClientFromAnotherCaIsRefused) {
  Server server(Options("a"));
  ASSERT_NE(server.port, 0);
  // Trusts the server's CA but presents a certificate from another one.
  TransportOptions co;
  co.tls = TlsOptions{pki_->path("ca.crt"), pki_->path("stranger.crt"),
                      pki_->path("stranger.key")};
  auto client = Make(co);
  ASSERT_TRUE(client);
  auto rec = std::make_shared<Recorder>();
  auto link = client->Connect("127.0.0.1", server.port, rec, kConnectTimeout);
  if (link.ok()) {  // TLS 1.3: refused after the client's handshake
    (*link)->Send(TestFrame(1, 100));
    ASSERT_TRUE(rec->WaitClosed(1));
    const Status why = rec->closed()[0].why;
    EXPECT_EQ(why.code(), StatusCode::kIOError) << why.ToString();
    EXPECT_TRUE(HasSubstr(why.message(), "TLS handshake with 127.0.0.1:") &&
                HasSubstr(why.message(), "unknown ca"))
        << why.ToString();
  } else {
    EXPECT_EQ(link.status().code(), StatusCode::kIOError);
  }
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_TRUE(server.recorder->opened().empty());
  EXPECT_TRUE(server.recorder->frames().empty());
}

TEST_F(TlsTransportTest, PlainTcpAndTlsDoNotMix) {
  // A plain client's frame never reaches a TLS server's handler.
  Server tls_server(Options("a"));
  auto plain = Make(TransportOptions{});
  ASSERT_TRUE(plain);
  auto plain_rec = std::make_shared<Recorder>();
  auto plain_link =
      plain->Connect("127.0.0.1", tls_server.port, plain_rec, kConnectTimeout);
  ASSERT_TRUE(plain_link.ok());
  (*plain_link)->Send(TestFrame(1, 1000));
  ASSERT_TRUE(plain_rec->WaitClosed(1));
  EXPECT_FALSE(plain_rec->closed()[0].why.ok());
  EXPECT_TRUE(tls_server.recorder->opened().empty());

  // A TLS client to a plain server fails its handshake.
  Server plain_server(TransportOptions{});
  auto client = Make(Options("b"));
  ASSERT_TRUE(client);
  auto link = client->Connect("127.0.0.1", plain_server.port,
                              std::make_shared<Recorder>(), kConnectTimeout);
  ASSERT_FALSE(link.ok());
  EXPECT_TRUE(HasSubstr(link.status().message(), "TLS handshake with"))
      << link.status().ToString();
}

TEST_F(TlsTransportTest, ConfigurationErrorsNameTheFile) {
  const TlsOptions good = pki_->Tls("a", "ca");

  Status s = CreateError(TlsOptions{good.ca_file, good.cert_file, ""});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(HasSubstr(s.message(), "key_file is not set")) << s.ToString();

  s = CreateError(
      TlsOptions{pki_->path("nope.crt"), good.cert_file, good.key_file});
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_TRUE(HasSubstr(s.message(), "TLS CA file '" + pki_->path("nope.crt") +
                                         "' does not exist"))
      << s.ToString();

  pki_->WriteText("garbage.pem", "not a certificate\n");
  s = CreateError(
      TlsOptions{good.ca_file, pki_->path("garbage.pem"), good.key_file});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(HasSubstr(
      s.message(), "TLS certificate file '" + pki_->path("garbage.pem") + "'"))
      << s.ToString();

  s = CreateError(
      TlsOptions{pki_->path("garbage.pem"), good.cert_file, good.key_file});
  EXPECT_TRUE(HasSubstr(s.message(), "TLS CA file")) << s.ToString();

  // The key of another node.
  s = CreateError(
      TlsOptions{good.ca_file, good.cert_file, pki_->path("b.key")});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(HasSubstr(s.message(), "TLS key file '" + pki_->path("b.key") +
                                         "' does not match the certificate "
                                         "in '" +
                                         good.cert_file + "'"))
      << s.ToString();

  // An encrypted key fails (no passphrase prompt).
  pki_->WriteEncryptedKey("a-encrypted.key", "a.key");
  s = CreateError(
      TlsOptions{good.ca_file, good.cert_file, pki_->path("a-encrypted.key")});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(HasSubstr(s.message(), "no unencrypted PEM private key"))
      << s.ToString();

  // The fake backend has no TLS.
  TransportOptions fake;
  fake.tls = good;
  fake.fake_network = FakeNetwork::Create();
  EXPECT_EQ(CreateTransport("fake", fake).status().code(),
            StatusCode::kUnsupported);
}

// Throughput of one large transfer on loopback, TLS against plain TCP in
// the same run (printed; the figure in topology/README.md comes from it).
TEST_F(TlsTransportTest, LargeTransferThroughputAgainstPlainTcp) {
  constexpr size_t kFrameSize = 1u << 20, kFrames = 256;
  std::vector<FrameBuffer> frames;
  for (uint64_t i = 0; i < 8; ++i) frames.push_back(TestFrame(i, kFrameSize));
  auto run = [&](const TransportOptions& so, const TransportOptions& co) {
    Server server(so);
    auto client = Make(co);
    if (!client) return 0.0;
    auto link = client->Connect("127.0.0.1", server.port,
                                std::make_shared<Recorder>(), kConnectTimeout);
    EXPECT_TRUE(link.ok()) << link.status().ToString();
    if (!link.ok()) return 0.0;
    const Clock::time_point start = Clock::now();
    for (size_t i = 0; i < kFrames; ++i) (*link)->Send(frames[i % 8]);
    EXPECT_TRUE(server.recorder->WaitFrames(kFrames));
    const double s =
        std::chrono::duration<double>(Clock::now() - start).count();
    auto got = server.recorder->frames();
    EXPECT_EQ(got.size(), kFrames);
    if (got.size() == kFrames) {
      EXPECT_EQ(*got.back().buffer, *frames[7]);
    }
    return kFrames * static_cast<double>(kFrameSize) / s / 1e6;
  };
  const double plain = run(TransportOptions{}, TransportOptions{});
  const double tls = run(Options("a"), Options("b"));
  std::printf(
      "loopback, %zu x %zu MiB frames: plain TCP %.0f MB/s, TLS %.0f "
      "MB/s (%.2fx)\n",
      kFrames, kFrameSize >> 20, plain, tls, tls / plain);
  EXPECT_GT(tls, 0);
}

}  // namespace
}  // namespace dcr
