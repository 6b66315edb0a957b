// dcr-objstore-tool: drives one ObjectStore (dcr/objstore.h) from a test
// script. Not installed; operators use `dcr` (which reads the object store
// from the topology).
//
//   dcr-objstore-tool (--dir PATH | --endpoint URL --bucket B ...) CMD ARGS
//   CMD: put KEY FILE | get KEY FILE | rm KEY | ls [PREFIX]
//
// Prints the store's counters to stderr as one line
// "stats requests=N retries=N multipart=N bytes_up=N bytes_down=N".
// Exit codes: 0 done, 2 not found, 3 corruption, 4 invalid argument
// (credentials, keys, configuration), 1 anything else.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <vector>

#include "CLI/CLI.hpp"
#include "dcr/objstore.h"

namespace {

int ExitCode(const dcr::Status& s) {
  switch (s.code()) {
    case dcr::StatusCode::kOk:
      return 0;
    case dcr::StatusCode::kNotFound:
      return 2;
    case dcr::StatusCode::kCorruption:
      return 3;
    case dcr::StatusCode::kInvalidArgument:
      return 4;
    default:
      return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Drives one dcr object store (tests only)."};
  std::string dir;
  dcr::S3Config cfg;
  uint64_t retry_base_ms = 100;
  uint64_t retry_cap_ms = 5000;
  uint64_t stall_ms = 30000;
  std::string cmd, key, file;
  app.add_option("--dir", dir, "a directory object store");
  app.add_option("--endpoint", cfg.endpoint, "S3 endpoint URL");
  app.add_option("--bucket", cfg.bucket, "S3 bucket");
  app.add_option("--prefix", cfg.prefix, "S3 key prefix");
  app.add_option("--region", cfg.region, "S3 region");
  app.add_option("--credentials-file", cfg.credentials_file,
                 "AWS shared-credentials file");
  app.add_option("--profile", cfg.profile, "profile in the credentials file");
  app.add_option("--multipart-threshold", cfg.multipart_threshold, "bytes");
  app.add_option("--part-size", cfg.part_size, "bytes");
  app.add_option("--parallel-parts", cfg.parallel_parts, "parts in flight");
  app.add_option("--max-attempts", cfg.max_attempts, "attempts per request");
  app.add_option("--retry-base-ms", retry_base_ms, "backoff base");
  app.add_option("--retry-cap-ms", retry_cap_ms, "backoff cap");
  app.add_option("--stall-ms", stall_ms, "a stalled transfer's limit");
  app.add_option("cmd", cmd, "put, get, rm or ls")->required();
  app.add_option("key", key, "object key (ls: a prefix)");
  app.add_option("file", file, "local file (put, get)");
  CLI11_PARSE(app, argc, argv);
  cfg.retry_base = std::chrono::milliseconds(retry_base_ms);
  cfg.retry_cap = std::chrono::milliseconds(retry_cap_ms);
  cfg.stall_timeout = std::chrono::milliseconds(stall_ms);

  dcr::Result<std::unique_ptr<dcr::ObjectStore>> store =
      dcr::Status::InvalidArgument("give --dir or --endpoint");
  if (!dir.empty()) {
    store = dcr::OpenDirObjectStore(dir);
  } else if (!cfg.endpoint.empty()) {
    dcr::Result<dcr::S3Credentials> creds = dcr::LoadS3Credentials(cfg);
    store =
        creds.ok()
            ? dcr::OpenS3ObjectStore(cfg, *creds)
            : dcr::Result<std::unique_ptr<dcr::ObjectStore>>(creds.status());
  }
  if (!store.ok()) {
    std::cerr << "error: " << store.status().ToString() << "\n";
    return ExitCode(store.status());
  }
  dcr::ObjectStore& os = **store;
  dcr::Status s;
  if (cmd == "put") {
    std::ifstream in(file, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                            std::istreambuf_iterator<char>());
    if (!in && !in.eof()) {
      s = dcr::Status::IOError("cannot read " + file);
    } else {
      s = os.Put(key, std::as_bytes(std::span(bytes.data(), bytes.size())));
    }
  } else if (cmd == "get") {
    dcr::Result<std::vector<std::byte>> data = os.Get(key);
    if (!data.ok()) {
      s = data.status();
    } else {
      std::ofstream out(file, std::ios::binary);
      out.write(reinterpret_cast<const char*>(data->data()),
                static_cast<std::streamsize>(data->size()));
      if (!out) s = dcr::Status::IOError("cannot write " + file);
    }
  } else if (cmd == "rm") {
    s = os.Delete(key);
  } else if (cmd == "ls") {
    dcr::Result<std::vector<std::string>> keys = os.List(key);
    if (!keys.ok()) {
      s = keys.status();
    } else {
      for (const std::string& k : *keys) std::cout << k << "\n";
    }
  } else {
    s = dcr::Status::InvalidArgument("unknown command '" + cmd + "'");
  }
  dcr::ObjectStoreStats st = os.stats();
  std::cerr << "stats requests=" << st.requests << " retries=" << st.retries
            << " multipart=" << st.multipart_uploads
            << " bytes_up=" << st.bytes_up << " bytes_down=" << st.bytes_down
            << "\n";
  if (!s.ok()) std::cerr << "error: " << s.ToString() << "\n";
  return ExitCode(s);
}
