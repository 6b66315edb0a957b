// TransportSet: one transport per kind, created on first use; TCP-only
// options refused for UCX; forced kinds for tests; stopped sets refuse.
#include "transport/transport_set.h"

#include <gtest/gtest.h>

#include "transport/fake_transport.h"
#include "unit/transport/transport_test_util.h"

namespace dcr {
namespace {

using testing::kWait;
using testing::Recorder;
using testing::TestFrame;

TEST(TransportSetTest, OneTransportPerKindCreatedOnFirstUse) {
  TransportSet set(TransportOptions{});
  EXPECT_EQ(set.Find("tcp"), nullptr);
  auto tcp = set.Get("tcp");
  ASSERT_TRUE(tcp.ok()) << tcp.status().ToString();
  EXPECT_EQ((*tcp)->kind(), "tcp");
  EXPECT_EQ(*set.Get("tcp"), *tcp);
  EXPECT_EQ(set.Find("tcp"), *tcp);
  EXPECT_TRUE(set.Get("carrier-pigeon").status().IsInvalidArgument());
  // A link between two sets, as between two nodes.
  TransportSet other(TransportOptions{});
  auto listener = other.Get("tcp");
  ASSERT_TRUE(listener.ok());
  auto rec = std::make_shared<Recorder>();
  ASSERT_TRUE((*listener)->Listen("127.0.0.1", 0, rec).ok());
  auto link = (*tcp)->Connect("127.0.0.1", (*listener)->BoundPort(),
                              std::make_shared<Recorder>(), kWait);
  ASSERT_TRUE(link.ok()) << link.status().ToString();
  (*link)->Send(TestFrame(1, 100));
  EXPECT_TRUE(rec->WaitFrames(1));
  set.Stop();
  EXPECT_TRUE(set.Get("tcp").status().code() == StatusCode::kAborted);
  set.Stop();  // idempotent
}

TEST(TransportSetTest, UcxRefusesTcpOnlyOptions) {
  TransportOptions tls;
  tls.tls.ca_file = "/etc/ca.pem";
  tls.tls.cert_file = "/etc/node.pem";
  tls.tls.key_file = "/etc/node.key";
  auto s = TransportSet(tls).Get("ucx");
  EXPECT_TRUE(s.status().code() == StatusCode::kUnsupported);
  EXPECT_NE(s.status().message().find("TLS"), std::string::npos);
  TransportOptions paced;
  paced.max_send_bps = 1000000;
  auto p = TransportSet(paced).Get("ucx");
  EXPECT_TRUE(p.status().code() == StatusCode::kUnsupported);
  EXPECT_NE(p.status().message().find("link rate"), std::string::npos);
}

TEST(TransportSetTest, ForcedKindAnswersEveryRequest) {
  TransportOptions o;
  o.fake_network = FakeNetwork::Create();
  TransportSet set(o, "fake");
  auto a = set.Get("tcp");
  auto b = set.Get("ucx");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_EQ((*a)->kind(), "fake");
}

}  // namespace
}  // namespace dcr
