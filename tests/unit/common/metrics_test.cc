#include "common/metrics.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <thread>

#include "common/file.h"

namespace dcr {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

TEST(MetricsTextTest, FamiliesAndSamples) {
  MetricsText m;
  m.Family("dcr_bytes_sent_total", "counter", "Bytes written to children.");
  m.Sample("dcr_bytes_sent_total", uint64_t{12}, {{"peer", "a:1"}});
  m.Sample("dcr_bytes_sent_total", uint64_t{34}, {{"peer", "b:2"}});
  m.Family("dcr_bytes_sent_total", "counter", "ignored the second time");
  m.Family("dcr_queue_bytes", "gauge", "Bytes queued.");
  m.Sample("dcr_queue_bytes", 7, {{"peer", "a:1"}, {"dir", "down"}});
  m.Sample("dcr_up", 1);
  EXPECT_EQ(m.str(),
            "# HELP dcr_bytes_sent_total Bytes written to children.\n"
            "# TYPE dcr_bytes_sent_total counter\n"
            "dcr_bytes_sent_total{peer=\"a:1\"} 12\n"
            "dcr_bytes_sent_total{peer=\"b:2\"} 34\n"
            "# HELP dcr_queue_bytes Bytes queued.\n"
            "# TYPE dcr_queue_bytes gauge\n"
            "dcr_queue_bytes{peer=\"a:1\",dir=\"down\"} 7\n"
            "dcr_up 1\n");
}

TEST(MetricsTextTest, EscapesLabelValuesAndHelp) {
  MetricsText m;
  m.Family("x", "gauge", "a \\ b\nc \"q\"");
  m.Sample("x", uint64_t{1}, {{"path", "C:\\dir\n\"name\""}});
  EXPECT_EQ(m.str(),
            "# HELP x a \\\\ b\\nc \"q\"\n"
            "# TYPE x gauge\n"
            "x{path=\"C:\\\\dir\\n\\\"name\\\"\"} 1\n");
}

TEST(MetricsTextTest, Values) {
  MetricsText m;
  m.Sample("a", 0.1);
  m.Sample("b", 1.0);
  m.Sample("c", -2.5);
  m.Sample("d", 1e300);
  m.Sample("e", std::numeric_limits<double>::quiet_NaN());
  m.Sample("f", std::numeric_limits<double>::infinity());
  m.Sample("g", -std::numeric_limits<double>::infinity());
  m.Sample("h", std::numeric_limits<uint64_t>::max());
  m.Sample("i", int64_t{-5});
  m.Sample("j", uint32_t{4000000000u});
  m.Sample("k", 1.0 / 3.0);
  EXPECT_EQ(m.str(),
            "a 0.1\n"
            "b 1\n"
            "c -2.5\n"
            "d 1e+300\n"
            "e NaN\n"
            "f +Inf\n"
            "g -Inf\n"
            "h 18446744073709551615\n"
            "i -5\n"
            "j 4000000000\n"
            "k 0.3333333333333333\n");
  // Shortest round-trip: the printed text parses back to the same double.
  EXPECT_EQ(std::stod("0.3333333333333333"), 1.0 / 3.0);
}

// ---- the server, scraped over real sockets ----

// A blocking client socket to 127.0.0.1:port with a 10 s receive timeout.
UniqueFd Connect(uint16_t port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  EXPECT_TRUE(fd.valid());
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(
      ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  timeval tv{10, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

bool SendAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// Reads until the server closes (or an error / the receive timeout).
std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

std::string Request(uint16_t port, std::string_view request) {
  UniqueFd fd = Connect(port);
  EXPECT_TRUE(SendAll(fd.get(), request));
  return ReadAll(fd.get());
}

std::string Body(const std::string& response) {
  size_t end = response.find("\r\n\r\n");
  return end == std::string::npos ? "" : response.substr(end + 4);
}

std::unique_ptr<MetricsServer> MustStart(std::function<std::string()> render) {
  Result<std::unique_ptr<MetricsServer>> s =
      MetricsServer::Start("127.0.0.1", 0, std::move(render));
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (!s.ok()) return nullptr;
  EXPECT_NE((*s)->port(), 0);
  return std::move(s).value();
}

constexpr std::string_view kGet =
    "GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: text/plain\r\n\r\n";

TEST(MetricsServerTest, ServesRenderedText) {
  std::atomic<int> scrapes{0};
  auto server = MustStart([&] {
    MetricsText m;
    m.Family("dcr_scrapes", "counter", "Scrapes so far.");
    m.Sample("dcr_scrapes", static_cast<uint64_t>(++scrapes));
    return m.str();
  });
  ASSERT_TRUE(server);
  std::string r = Request(server->port(), kGet);
  EXPECT_EQ(r.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r;
  EXPECT_NE(r.find("\r\nContent-Type: text/plain; version=0.0.4; "
                   "charset=utf-8\r\n"),
            std::string::npos)
      << r;
  EXPECT_NE(r.find("\r\nConnection: close\r\n"), std::string::npos) << r;
  std::string body = Body(r);
  EXPECT_NE(
      r.find("\r\nContent-Length: " + std::to_string(body.size()) + "\r\n"),
      std::string::npos)
      << r;
  EXPECT_EQ(body,
            "# HELP dcr_scrapes Scrapes so far.\n"
            "# TYPE dcr_scrapes counter\n"
            "dcr_scrapes 1\n");
  // Rendered afresh for every scrape; a query string is ignored.
  r = Request(server->port(), "GET /metrics?x=1 HTTP/1.0\r\n\r\n");
  EXPECT_NE(Body(r).find("dcr_scrapes 2\n"), std::string::npos) << r;
  // HEAD: the headers only.
  r = Request(server->port(), "HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r;
  EXPECT_EQ(Body(r), "");
  EXPECT_EQ(scrapes.load(), 3);
}

TEST(MetricsServerTest, ErrorAnswers) {
  auto server = MustStart([] { return std::string("x 1\n"); });
  ASSERT_TRUE(server);
  std::string r = Request(server->port(), "GET /other HTTP/1.1\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 404 Not Found\r\n", 0), 0u) << r;
  r = Request(server->port(), "GET / HTTP/1.1\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 404 Not Found\r\n", 0), 0u) << r;
  r = Request(server->port(),
              "POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc");
  EXPECT_EQ(r.rfind("HTTP/1.1 405 Method Not Allowed\r\n", 0), 0u) << r;
  EXPECT_NE(r.find("\r\nAllow: GET, HEAD\r\n"), std::string::npos) << r;
  for (std::string_view garbage :
       {"hello\r\n\r\n", "GET /metrics\r\n\r\n",
        "get /metrics HTTP/1.1\r\n\r\n", "GET metrics HTTP/1.1\r\n\r\n",
        "GET /metrics SPDY/3\r\n\r\n", "\x16\x03\x01\x02\x01\xfc\x03\x03\n"}) {
    r = Request(server->port(), garbage);
    EXPECT_EQ(r.rfind("HTTP/1.1 400 Bad Request\r\n", 0), 0u)
        << "request: " << garbage << "\nanswer: " << r;
  }
  // Still serving afterwards.
  EXPECT_EQ(Body(Request(server->port(), kGet)), "x 1\n");
}

TEST(MetricsServerTest, OversizedRequestIsRefused) {
  auto server = MustStart([] { return std::string("x 1\n"); });
  ASSERT_TRUE(server);
  UniqueFd fd = Connect(server->port());
  std::string big =
      "GET /metrics HTTP/1.1\r\nX-Pad: " + std::string(64u << 10, 'a') +
      "\r\n\r\n";
  SendAll(fd.get(), big);  // the server may close before taking it all
  std::string r = ReadAll(fd.get());
  // 400, or the connection was reset under the answer: never a 200.
  EXPECT_TRUE(r.empty() || r.rfind("HTTP/1.1 400 Bad Request\r\n", 0) == 0)
      << r.substr(0, 200);
  fd.Reset();  // else the server waits (up to 200 ms) for the rest of it
  EXPECT_EQ(Body(Request(server->port(), kGet)), "x 1\n");
}

TEST(MetricsServerTest, SilentClientDelaysTheNextScrapeAtMostTheTimeout) {
  auto server = MustStart([] { return std::string("x 1\n"); });
  ASSERT_TRUE(server);
  UniqueFd silent = Connect(server->port());
  // A slow client too: half a request line, then nothing.
  UniqueFd slow = Connect(server->port());
  ASSERT_TRUE(SendAll(slow.get(), "GET /met"));
  auto start = Clock::now();
  EXPECT_EQ(Body(Request(server->port(), kGet)), "x 1\n");
  auto elapsed = Clock::now() - start;
  // Two clients ahead of it, each dropped after 2 s.
  EXPECT_LT(elapsed, std::chrono::milliseconds(4000 + 1500));
  // Both were closed without an answer.
  EXPECT_EQ(ReadAll(silent.get()), "");
  EXPECT_EQ(ReadAll(slow.get()), "");
}

TEST(MetricsServerTest, StopWhileAClientIsConnectedReturnsPromptly) {
  auto server = MustStart([] { return std::string("x 1\n"); });
  ASSERT_TRUE(server);
  UniqueFd silent = Connect(server->port());
  // Let the server take the connection and wait on it.
  std::this_thread::sleep_for(milliseconds(200));
  auto start = Clock::now();
  server->Stop();
  EXPECT_LT(Clock::now() - start, milliseconds(1000));
  server->Stop();  // idempotent
  EXPECT_EQ(ReadAll(silent.get()), "");
  // The listener is closed.
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(server->port());
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_NE(
      ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  server.reset();  // the destructor after Stop
}

TEST(MetricsServerTest, DestructorStopsAnIdleServer) {
  auto start = Clock::now();
  {
    auto server = MustStart([] { return std::string(); });
    ASSERT_TRUE(server);
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_LT(Clock::now() - start, milliseconds(1000));
}

TEST(MetricsServerTest, LargeBody) {
  std::string text;
  for (int i = 0; i < 50000; ++i) {
    text +=
        "dcr_x{i=\"" + std::to_string(i) + "\"} " + std::to_string(i) + "\n";
  }
  auto server = MustStart([&] { return text; });
  ASSERT_TRUE(server);
  EXPECT_EQ(Body(Request(server->port(), kGet)), text);
}

TEST(MetricsServerTest, ListenErrorsNameHostAndPort) {
  auto server = MustStart([] { return std::string(); });
  ASSERT_TRUE(server);
  Result<std::unique_ptr<MetricsServer>> again = MetricsServer::Start(
      "127.0.0.1", server->port(), [] { return std::string(); });
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kIOError);
  EXPECT_EQ(again.status().message(), "metrics: cannot listen on 127.0.0.1:" +
                                          std::to_string(server->port()) +
                                          ": Address already in use");
  Result<std::unique_ptr<MetricsServer>> bad = MetricsServer::Start(
      "no.such.host.invalid", 9100, [] { return std::string(); });
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(
                "metrics: cannot listen on no.such.host.invalid:9100"),
            std::string::npos)
      << bad.status().ToString();
  EXPECT_TRUE(MetricsServer::Start("127.0.0.1", 0, nullptr)
                  .status()
                  .IsInvalidArgument());
}

}  // namespace
}  // namespace dcr
