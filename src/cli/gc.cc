// `dcr gc`: removes from the topology's object store what the retention
// rule does not keep (coord/object_retention.h): objects of refits that
// never committed (a root that died mid-upload, a removal that failed)
// and of committed refits older than the last root.keep_deltas.
#include <fmt/format.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/cli_common.h"
#include "coord/object_retention.h"
#include "coord/state_dir.h"
#include "dcr/objstore.h"
#include "dcr/topology.h"

namespace dcr::cli {

namespace {

using json = nlohmann::json;

struct GcArgs {
  std::string topology;
  bool dry_run = false;
  bool unrecorded = false;
};

int RunGc(const GcArgs& a, const GlobalOptions& g) {
  Result<Topology> topo = LoadTopology(a.topology);
  if (!topo.ok()) return ReportError(topo.status());
  if (!topo->objstore) {
    return ReportError(Status::InvalidArgument(
        a.topology + ": no objstore: section, so there is nothing to collect"));
  }
  if (topo->root.state_dir.empty()) {
    return ReportError(Status::InvalidArgument(
        a.topology +
        ": root.state_dir is required (its objects/ records name the "
        "refits whose objects are kept)"));
  }
  const StateDir state(topo->root.state_dir);
  // No refit may run meanwhile: it could be uploading a refit gc removes.
  Result<StateDirLock> lock = StateDirLock::Acquire(state, "dcr gc");
  if (!lock.ok()) return ReportError(lock.status());
  Result<std::unique_ptr<ObjectStore>> store = OpenObjectStore(*topo->objstore);
  if (!store.ok()) {
    return ReportError(store.status().WithContext(a.topology + ": objstore"));
  }
  ObjectRetention retention(state, store->get(), topo->root.keep_deltas);
  Result<RetentionReport> r = retention.Prune(std::nullopt, /*scan_store=*/true,
                                              a.unrecorded, a.dry_run);
  if (!r.ok()) {
    return ReportError(r.status().WithContext((*store)->describe()));
  }
  const int rc = r->failures > 0 ? kExitFailed : kExitOk;
  if (g.format() == OutputFormat::kJson) {
    json refits = json::array();
    for (const RetainedRefit& e : r->refits) {
      refits.push_back(
          {{"refit", e.refit},
           {"state", e.state},
           {"target_step",
            e.target_step ? json(*e.target_step) : json(nullptr)},
           {"objects", e.objects ? json(*e.objects) : json(nullptr)},
           {"removed", e.removed},
           {"why", e.why}});
    }
    json out = {{"store", (*store)->describe()},
                {"dry_run", a.dry_run},
                {"keep", topo->root.keep_deltas},
                {"refits", refits},
                {"objects_removed", r->objects_removed},
                {"foreign_keys", r->foreign_keys},
                {"failures", r->failures}};
    std::printf("%s\n", out.dump(2).c_str());
    return rc;
  }
  std::printf("%s (keeping the last %u committed refits)\n",
              (*store)->describe().c_str(), topo->root.keep_deltas);
  if (r->refits.empty()) std::printf("  no refit's objects\n");
  for (const RetainedRefit& e : r->refits) {
    const std::string step =
        e.target_step ? fmt::format("step {}", *e.target_step) : "";
    const std::string objects =
        e.objects ? fmt::format("{} objects", *e.objects) : "";
    const char* action =
        e.removed ? (a.dry_run ? "would remove" : "removed") : "kept";
    std::printf("  %s  %-10s %-10s %-12s %-12s %s\n", e.refit.c_str(),
                e.state.c_str(), step.c_str(), objects.c_str(), action,
                e.why.c_str());
  }
  for (const std::string& key : r->foreign_keys) {
    std::printf("  %s: not a refit's object; left alone\n", key.c_str());
  }
  std::printf(
      "%s %llu objects%s\n", a.dry_run ? "would remove" : "removed",
      static_cast<unsigned long long>(r->objects_removed),
      r->failures > 0
          ? fmt::format("; {} refits could not be removed (above)", r->failures)
                .c_str()
          : "");
  return rc;
}

}  // namespace

void AddGcCommand(CLI::App* app, GlobalOptions* g, int* exit_code) {
  auto a = std::make_shared<GcArgs>();
  auto* cmd = app->add_subcommand(
      "gc", "Remove from the object store the refits it no longer keeps");
  cmd->add_option("-t,--topology", a->topology, "Topology YAML file")
      ->required();
  cmd->add_flag("--dry-run", a->dry_run,
                "Say what would be removed; remove nothing");
  cmd->add_flag("--unrecorded", a->unrecorded,
                "Also remove refits that no record in root.state_dir/objects "
                "names (another root's, if two share the bucket prefix)");
  AddOutputOption(cmd, g);
  cmd->footer(
      "\nA refit through the object store keeps the objects of the last "
      "root.keep_deltas\ncommitted refits and removes the rest itself; dcr "
      "gc removes what a root that\nstopped left behind (an upload without "
      "a decision, a removal that failed).\nIt takes root.state_dir's lock, "
      "so it never runs beside a refit, and keeps\nan unfinished refit's "
      "objects (dcr refit --resume needs them).\n\n"
      "Examples (F: a topology with an objstore: section, "
      "topology/README.md):\n"
      "  dcr gc --topology F --dry-run\n"
      "  dcr gc --topology F -o json\n\n"
      "Exit codes: 0 done, 1 some refit's objects could not be removed, 2 "
      "usage or\nconfiguration error, or a coordinator holds "
      "root.state_dir.\n");
  cmd->callback([a, g, exit_code] { *exit_code = RunGc(*a, *g); });
}

}  // namespace dcr::cli
