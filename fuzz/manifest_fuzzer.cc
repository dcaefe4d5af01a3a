// libFuzzer target: what the coordinator does with the manifests ranks send
// on Join. The input is a protobuf wire message whose field 1 (repeated,
// length-delimited) holds serialized muon.v1.JoinRequest messages, i.e. the
// encoding of `message { repeated muon.v1.JoinRequest joins = 1; }` (at most
// kMaxJoins are used). Then:
//   1. ValidateManifests and PlanJob on the requests' manifests (index =
//      position in the input);
//   2. a fresh in-process CoordinatorService (world size from the first
//      Join, as the daemon without --world_size) gets every request's Join in
//      order, each with a 1 ms wait (a Join that completes the world plans
//      at once; the others time out quickly, stay registered and are
//      answered by the plan or the error), then GetJob / GetPlan /
//      GetAssignments / ListRanks / Heartbeat, and Shutdown.
// A request's job_id is used as given: "" and "job" name the service's job.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/unknown_field_set.h"
#include "muon/v1/coordinator.pb.h"
#include "plan/manifest_validation.h"
#include "plan/plan_job.h"
#include "server/coordinator_service.h"

namespace {
constexpr int kMaxJoins = 8;
}  // namespace

// protobuf logs every string field with invalid UTF-8 it parses: silence it
// (the parse result is what matters).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  google::protobuf::UnknownFieldSet fields;
  if (!fields.ParseFromArray(data, static_cast<int>(size))) return 0;
  std::vector<muon::v1::JoinRequest> joins;
  for (int i = 0; i < fields.field_count() && joins.size() < kMaxJoins; ++i) {
    const google::protobuf::UnknownField& f = fields.field(i);
    if (f.number() != 1 ||
        f.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) {
      continue;
    }
    muon::v1::JoinRequest join;
    if (!join.ParseFromString(f.length_delimited())) continue;
    joins.push_back(std::move(join));
  }
  if (joins.empty()) return 0;

  std::vector<muon::v1::RankManifest> manifests;
  for (const muon::v1::JoinRequest& join : joins) {
    manifests.push_back(join.manifest());
  }
  (void)muon::ValidateManifests(manifests);
  (void)muon::PlanJob(manifests, "job");

  muon::CoordinatorService::Options options;
  options.job_id = "job";
  options.default_join_timeout = absl::Milliseconds(1);
  muon::CoordinatorService service(options);
  for (muon::v1::JoinRequest join : joins) {
    join.set_timeout_ms(1);
    (void)service.Join(join);
  }
  muon::v1::GetJobRequest get_job;
  (void)service.GetJob(get_job);
  muon::v1::GetPlanRequest get_plan;
  (void)service.GetPlan(get_plan);
  muon::v1::GetAssignmentsRequest get_assignments;
  (void)service.GetAssignments(get_assignments);
  muon::v1::ListRanksRequest list_ranks;
  (void)service.ListRanks(list_ranks);
  for (const muon::v1::JoinRequest& join : joins) {
    muon::v1::HeartbeatRequest heartbeat;
    heartbeat.set_rank(join.manifest().rank());
    heartbeat.set_incarnation(join.incarnation());
    (void)service.Heartbeat(heartbeat);
  }
  service.Shutdown();
  return 0;
}
