// `dcr keygen`: makes the root's Ed25519 key pair for signed refits
// (topology root.signing_key_file and defaults.signing_public_key_file).
#include <cstdio>

#include "cli/cli_common.h"
#include "wire/signature.h"

namespace dcr::cli {

void AddKeygenCommand(CLI::App* app, int* exit_code) {
  struct Args {
    std::string private_path;
    std::string public_path;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app->add_subcommand("keygen",
                                  "Make an Ed25519 key pair for signed refits");
  cmd->add_option("--private", a->private_path,
                  "Where to write the private key (PEM, mode 0600): the "
                  "topology's root.signing_key_file")
      ->required();
  cmd->add_option("--public", a->public_path,
                  "Where to write the public key (PEM): "
                  "defaults.signing_public_key_file, for every relay")
      ->required();
  cmd->footer(
      "\nThe root signs each refit's manifest (the SHA-256 of every chunk) "
      "with the\nprivate key; relays with the public key vote no on any "
      "chunk the root did\nnot sign. Keep the private key on the root's "
      "host only. Existing files are\nnever overwritten.\n\n"
      "Examples:\n"
      "  dcr keygen --private /etc/dcr/root.key --public "
      "/etc/dcr/root.pub\n\n"
      "Exit codes: 0 written, 2 a file exists or a path is bad, 1 other "
      "failure.\n");
  cmd->callback([a, exit_code] {
    Status s = WriteNewKeyPair(a->private_path, a->public_path);
    if (!s.ok()) {
      *exit_code = ReportError(s);
      return;
    }
    std::printf("wrote %s (private, mode 0600) and %s (public)\n",
                a->private_path.c_str(), a->public_path.c_str());
    *exit_code = kExitOk;
  });
}

}  // namespace dcr::cli
