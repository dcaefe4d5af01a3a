#include "plan/schedule.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace muon {
namespace {

// Whether `rank` owns a matrix of bucket b.
std::vector<std::set<int>> OwnersPerBucket(const v1::Plan& plan) {
  std::vector<std::set<int>> owners(plan.buckets_size());
  for (int b = 0; b < plan.buckets_size(); ++b) {
    for (int mi : plan.buckets(b).matrices()) {
      if (mi >= 0 && mi < plan.matrices_size()) {
        owners[b].insert(plan.matrices(mi).owner());
      }
    }
  }
  return owners;
}

void Add(v1::RankSchedule* rs, int bucket, const char* op, const char* stream,
         int slot) {
  v1::ScheduledOp* o = rs->add_ops();
  o->set_bucket(bucket);
  o->set_op(op);
  o->set_stream(stream);
  o->set_slot(slot);
}

}  // namespace

v1::Schedule MakeSchedule(const v1::Plan& plan, bool async,
                          int prefetch_count) {
  const int buckets = plan.buckets_size();
  int p = std::max(0, prefetch_count);
  if (buckets > 0) p = std::min(p, buckets - 1);
  const std::vector<std::set<int>> owners = OwnersPerBucket(plan);
  v1::Schedule s;
  s.set_mode(async ? "async" : "sequential");
  s.set_prefetch_count(async ? p : 0);
  s.set_slots(async ? p + 1 : 1);
  for (int r = 0; r < plan.world_size(); ++r) {
    v1::RankSchedule* rs = s.add_ranks();
    rs->set_rank(r);
    if (!async) {
      for (int b = 0; b < buckets; ++b) {
        Add(rs, b, "gather", "main", 0);
        if (owners[b].count(r)) Add(rs, b, "orthogonalize", "main", 0);
        Add(rs, b, "redistribute", "main", 0);
        Add(rs, b, "apply", "main", 0);
      }
      continue;
    }
    const int slots = p + 1;
    int next_gather = 0;
    for (; next_gather <= p && next_gather < buckets; ++next_gather) {
      Add(rs, next_gather, "gather", "comm", next_gather % slots);
    }
    for (int b = 0; b < buckets; ++b) {
      Add(rs, b, "redistribute", "comm", b % slots);
      Add(rs, b, "apply", "comm", b % slots);
      if (next_gather < buckets) {
        Add(rs, next_gather, "gather", "comm", next_gather % slots);
        ++next_gather;
      }
    }
    for (int b = 0; b < buckets; ++b) {
      if (owners[b].count(r)) Add(rs, b, "orthogonalize", "compute", b % slots);
    }
  }
  return s;
}

absl::Status ValidateSchedule(const v1::Schedule& s, const v1::Plan& plan) {
  const bool async = s.mode() == "async";
  if (!async && s.mode() != "sequential") {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule mode \"", s.mode(), "\" is not sequential or async"));
  }
  const int buckets = plan.buckets_size();
  const int want_slots = async ? s.prefetch_count() + 1 : 1;
  if (s.prefetch_count() < 0 || s.slots() != want_slots) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule has ", s.slots(), " slots for prefetch ", s.prefetch_count(),
        " in ", s.mode(), " mode; expected ", want_slots));
  }
  if (s.ranks_size() != plan.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule has ", s.ranks_size(),
                     " ranks; the plan's world size is ", plan.world_size()));
  }
  const std::vector<std::set<int>> owners = OwnersPerBucket(plan);
  std::vector<std::pair<int, std::string>> collectives0;
  for (int r = 0; r < s.ranks_size(); ++r) {
    const v1::RankSchedule& rs = s.ranks(r);
    if (rs.rank() != r) {
      return absl::InvalidArgumentError(
          absl::StrCat("schedule entry ", r, " is for rank ", rs.rank()));
    }
    std::map<std::pair<int, std::string>, int> count;
    std::vector<std::pair<int, std::string>> collectives;
    // Per slot: the bucket in it that is not yet redistributed (-1 = free).
    std::vector<int> slot_user(s.slots(), -1);
    std::map<std::string, std::set<int>> gathered_on_stream;
    int in_flight = 0;
    int last_gathered = -1;
    for (const v1::ScheduledOp& op : rs.ops()) {
      const std::string where =
          absl::StrCat("rank ", r, ", bucket ", op.bucket(), ", ", op.op());
      if (op.bucket() < 0 || op.bucket() >= buckets) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": no such bucket"));
      }
      if (op.slot() < 0 || op.slot() >= s.slots()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": slot ", op.slot(), " out of range [0, ", s.slots(), ")"));
      }
      const std::string want_stream =
          !async ? "main" : (op.op() == "orthogonalize" ? "compute" : "comm");
      if (op.stream() != want_stream) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": on stream \"", op.stream(),
                         "\"; expected \"", want_stream, "\""));
      }
      ++count[{op.bucket(), op.op()}];
      if (op.op() == "gather") {
        if (op.bucket() != last_gathered + 1) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, ": buckets must be gathered in plan order (after bucket ",
              last_gathered, ")"));
        }
        last_gathered = op.bucket();
        if (slot_user[op.slot()] != -1) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, ": slot ", op.slot(), " still holds bucket ",
              slot_user[op.slot()], ", which is not redistributed yet"));
        }
        slot_user[op.slot()] = op.bucket();
        gathered_on_stream[op.stream()].insert(op.bucket());
        if (++in_flight > s.prefetch_count() + 1) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, ": ", in_flight, " buckets in flight; at most ",
              s.prefetch_count() + 1));
        }
        collectives.push_back({op.bucket(), op.op()});
      } else if (op.op() == "redistribute" || op.op() == "apply") {
        if (!gathered_on_stream[op.stream()].count(op.bucket())) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": comes before the bucket's gather"));
        }
        if (op.op() == "redistribute") {
          if (slot_user[op.slot()] != op.bucket()) {
            return absl::InvalidArgumentError(
                absl::StrCat(where, ": slot ", op.slot(), " holds bucket ",
                             slot_user[op.slot()]));
          }
          slot_user[op.slot()] = -1;
          --in_flight;
          collectives.push_back({op.bucket(), op.op()});
        }
      } else if (op.op() == "orthogonalize") {
        if (!owners[op.bucket()].count(r)) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, ": rank ", r, " owns no matrix of this bucket"));
        }
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": unknown operation"));
      }
    }
    for (int b = 0; b < buckets; ++b) {
      for (const char* op : {"gather", "redistribute", "apply"}) {
        if (count[{b, op}] != 1) {
          return absl::InvalidArgumentError(
              absl::StrCat("rank ", r, ", bucket ", b, ": ", op, " scheduled ",
                           count[{b, op}], " times; expected once"));
        }
      }
      const int want = owners[b].count(r) ? 1 : 0;
      if (count[{b, "orthogonalize"}] != want) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", r, ", bucket ", b, ": orthogonalize scheduled ",
            count[{b, "orthogonalize"}], " times; expected ", want));
      }
    }
    if (r == 0) {
      collectives0 = collectives;
    } else if (collectives != collectives0) {
      size_t i = 0;
      while (i < collectives.size() && i < collectives0.size() &&
             collectives[i] == collectives0[i]) {
        ++i;
      }
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", r,
                       " issues its collectives in another order than rank 0 "
                       "(first difference at collective ",
                       i, "): ranks would deadlock"));
    }
  }
  return absl::OkStatus();
}

}  // namespace muon
