// A topology's objstore: section to an ObjectStore (dcr/objstore.h).
#include "dcr/objstore.h"
#include "dcr/topology.h"
#include "fmt/format.h"

namespace dcr {

Result<std::unique_ptr<ObjectStore>> OpenObjectStore(
    const ObjectStoreSpec& spec, const ObjectRequestLimits& limits) {
  if (spec.kind == ObjectStoreKind::kDir) return OpenDirObjectStore(spec.path);
  S3Config cfg;
  cfg.endpoint = spec.endpoint;
  if (!spec.region.empty()) cfg.region = spec.region;
  cfg.bucket = spec.bucket;
  cfg.prefix = spec.prefix;
  cfg.credentials_file = spec.credentials_file;
  if (!spec.profile.empty()) cfg.profile = spec.profile;
  cfg.max_attempts = limits.max_attempts;
  cfg.connect_timeout = limits.connect_timeout;
  cfg.stall_timeout = limits.stall_timeout;
  DCR_ASSIGN_OR_RETURN(S3Credentials creds, LoadS3Credentials(cfg));
  return OpenS3ObjectStore(cfg, creds);
}

std::string RefitObjectPrefix(std::string_view refit_hex) {
  return fmt::format("refits/{}/", refit_hex);
}

std::string RefitObjectKey(std::string_view refit_hex, uint64_t ordinal) {
  return fmt::format("refits/{}/f/{:010}", refit_hex, ordinal);
}

}  // namespace dcr
