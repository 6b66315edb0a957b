// ProbeUcxTransport: what UCX offers on this machine (dcr doctor).
#include <string>

#include "transport/ucx/ucx_context.h"
#include "transport/ucx/ucx_transport.h"

namespace dcr {

TransportSupport ProbeUcxTransport() {
  TransportSupport s;
  s.kind = "ucx";
  s.built = true;
  s.version = std::string("UCX ") + ucp_get_version_string();
  Result<ucx_internal::ContextPtr> context = ucx_internal::CreateContext();
  if (!context.ok()) {
    s.detail = context.status().message();
    return s;
  }
  Result<ucx_internal::WorkerPtr> worker =
      ucx_internal::CreateWorker(context->get());
  if (!worker.ok()) {
    s.detail = worker.status().message();
    return s;
  }
  const std::vector<std::string> resources =
      ucx_internal::ListResources(context->get());
  if (resources.empty()) {
    s.detail =
        "UCX found no transport resources; check UCX_TLS and UCX_NET_DEVICES";
    return s;
  }
  s.usable = true;
  bool rdma = false;
  std::string list;
  for (const std::string& r : resources) {
    if (!list.empty()) list += ", ";
    list += r;
    rdma = rdma || ucx_internal::IsRdmaResource(r);
  }
  s.detail = "transports: " + list +
             (rdma ? " (RDMA available)" : " (no RDMA transport)");
  return s;
}

}  // namespace dcr
