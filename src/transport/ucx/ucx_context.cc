#include "transport/ucx/ucx_context.h"

#include <stdio.h>
#include <stdlib.h>

#include <mutex>
#include <sstream>

namespace dcr::ucx_internal {

std::string UcsText(ucs_status_t status) {
  return std::string("UCX: ") + ucs_status_string(status);
}

Result<ContextPtr> CreateContext() {
  // A relay restarted after a crash listens on its port again while the
  // old connections sit in TIME_WAIT (Asio's acceptor sets SO_REUSEADDR for
  // TCP links likewise). A UCT setting, so ucp_config_modify cannot set it;
  // set once, before any context reads the environment. An explicit
  // UCX_TCP_CM_REUSEADDR wins.
  static std::once_flag reuse_addr;
  std::call_once(reuse_addr,
                 [] { setenv("UCX_TCP_CM_REUSEADDR", "y", /*overwrite=*/0); });
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) {
    return Status::IOError("ucp_config_read failed (" + UcsText(s) +
                           "); check the UCX_* environment variables");
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_STREAM | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  ucp_context_h context = nullptr;
  s = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (s != UCS_OK) {
    return Status::IOError("ucp_init failed (" + UcsText(s) +
                           "); check UCX_TLS and UCX_NET_DEVICES");
  }
  return ContextPtr(context);
}

Result<WorkerPtr> CreateWorker(ucp_context_h context) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  ucp_worker_h worker = nullptr;
  ucs_status_t s = ucp_worker_create(context, &params, &worker);
  if (s != UCS_OK) {
    return Status::IOError("ucp_worker_create failed (" + UcsText(s) + ")");
  }
  return WorkerPtr(worker);
}

std::vector<std::string> ListResources(ucp_context_h context) {
  // Lines look like "#      resource 1  :  md 1  dev 1  flags -- tcp/lo";
  // the name is the last word.
  char* text = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&text, &size);
  if (stream == nullptr) return {};
  ucp_context_print_info(context, stream);
  fclose(stream);
  std::vector<std::string> resources;
  std::istringstream lines(std::string(text, size));
  free(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.find(" resource ") == std::string::npos) continue;
    const size_t end = line.find_last_not_of(" \t");
    if (end == std::string::npos) continue;
    const size_t begin = line.find_last_of(" \t", end);
    std::string name = line.substr(begin + 1, end - begin);
    if (name.find('/') != std::string::npos) resources.push_back(name);
  }
  return resources;
}

bool IsRdmaResource(std::string_view resource) {
  const std::string_view tl = resource.substr(0, resource.find('/'));
  return tl.starts_with("rc") || tl.starts_with("ud") || tl.starts_with("dc");
}

}  // namespace dcr::ucx_internal
