// Move-only owners of a UCP context and worker, and the resource listing
// that ProbeTransports and capabilities() share. Internal to the transport
// module: the UCX headers stop here and never reach include/dcr/.
#ifndef DCR_TRANSPORT_UCX_UCX_CONTEXT_H_
#define DCR_TRANSPORT_UCX_UCX_CONTEXT_H_

#include <ucp/api/ucp.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/status.h"

namespace dcr::ucx_internal {

struct ContextDeleter {
  void operator()(ucp_context_h context) const { ucp_cleanup(context); }
};
struct WorkerDeleter {
  void operator()(ucp_worker_h worker) const { ucp_worker_destroy(worker); }
};
// ucp_context_h and ucp_worker_h are pointers to these opaque structs.
using ContextPtr = std::unique_ptr<ucp_context, ContextDeleter>;
using WorkerPtr = std::unique_ptr<ucp_worker, WorkerDeleter>;

// "UCX error: <ucs_status_string>" context for a Status message.
std::string UcsText(ucs_status_t status);

// A context with the stream API, active messages and wakeup
// (ucp_worker_get_efd), reading
// the UCX_* environment (UCX_TLS, UCX_NET_DEVICES, ...) as every UCX
// program does. The error says which call failed and why.
Result<ContextPtr> CreateContext();

// A worker for one event thread. UCS_THREAD_MODE_SERIALIZED: it is created
// on the calling thread and then used only by the event thread.
Result<WorkerPtr> CreateWorker(ucp_context_h context);

// The transport resources the context selected, as "tl/device" ("tcp/lo",
// "posix/memory", "rc_mlx5/mlx5_0:1"), from ucp_context_print_info (UCX
// 1.13 has no structured query for them).
std::vector<std::string> ListResources(ucp_context_h context);

// True for InfiniBand/RoCE transports (rc*, ud*, dc*): those move memory
// by RDMA. tcp, self, shared memory and cma are not RDMA.
bool IsRdmaResource(std::string_view resource);

}  // namespace dcr::ucx_internal

#endif  // DCR_TRANSPORT_UCX_UCX_CONTEXT_H_
