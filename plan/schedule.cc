#include "plan/schedule.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/wire_names.h"

namespace muon {
namespace {

// owns[b]: whether `rank` owns a matrix of bucket b. O(matrices).
std::vector<char> OwnedBuckets(const v1::Plan& plan, int rank) {
  std::vector<char> owns(plan.buckets_size(), 0);
  for (int b = 0; b < plan.buckets_size(); ++b) {
    for (int mi : plan.buckets(b).matrices()) {
      if (mi >= 0 && mi < plan.matrices_size() &&
          plan.matrices(mi).owner() == rank) {
        owns[b] = 1;
        break;
      }
    }
  }
  return owns;
}

void Add(v1::RankSchedule* rs, int bucket, v1::OpKind op, v1::StreamKind stream,
         int slot) {
  v1::ScheduledOp* o = rs->add_ops();
  o->set_bucket(bucket);
  o->set_op(op);
  o->set_stream(stream);
  o->set_slot(slot);
}

absl::Status Invalid(int rank, int bucket, v1::OpKind op,
                     const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(
      "rank ", rank, ", bucket ", bucket, ", ", WireName(op), ": ", what));
}

// Checks the header fields against `plan`: mode, slots and prefetch depth
// (prefetch_count + 1 in int64: INT32_MAX + 1 must not wrap), and at most
// one slot per bucket (max(1, buckets), what MakeScheduleHeader's cap
// gives), so that a header cannot size a slot table beyond the plan.
absl::Status ValidateHeader(const v1::Schedule& s, const v1::Plan& plan) {
  const bool async = s.mode() == v1::SCHEDULE_MODE_ASYNC;
  if (!async && s.mode() != v1::SCHEDULE_MODE_SEQUENTIAL) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule mode \"", WireName(s.mode()),
                     "\" is not sequential or async"));
  }
  const int64_t want_slots = async ? int64_t{s.prefetch_count()} + 1 : 1;
  if (s.prefetch_count() < 0 || s.slots() != want_slots) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule has ", s.slots(), " slots for prefetch ", s.prefetch_count(),
        " in ", WireName(s.mode()), " mode; expected ", want_slots));
  }
  const int max_slots = std::max(1, plan.buckets_size());
  if (s.slots() > max_slots) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule has ", s.slots(), " slots (prefetch ", s.prefetch_count(),
        ") for a plan of ", plan.buckets_size(), " buckets; at most ",
        max_slots, " (one per bucket)"));
  }
  return absl::OkStatus();
}

}  // namespace

v1::Schedule MakeScheduleHeader(const v1::Plan& plan, bool async,
                                int prefetch_count) {
  int p = std::max(0, prefetch_count);
  p = std::min(p, std::max(0, plan.buckets_size() - 1));
  v1::Schedule s;
  s.set_mode(async ? v1::SCHEDULE_MODE_ASYNC : v1::SCHEDULE_MODE_SEQUENTIAL);
  s.set_prefetch_count(async ? p : 0);
  s.set_slots(async ? p + 1 : 1);
  s.set_derivation(kScheduleDerivation);
  return s;
}

namespace {

// MakeRankSchedule with the header given apart from the plan (whose buckets
// and owners are read), so that callers holding a new header need not copy
// the plan to attach it.
v1::RankSchedule DeriveRankSchedule(const v1::Schedule& header,
                                    const v1::Plan& plan, int rank) {
  const int buckets = plan.buckets_size();
  const std::vector<char> owns = OwnedBuckets(plan, rank);
  v1::RankSchedule rs;
  rs.set_rank(rank);
  if (header.mode() != v1::SCHEDULE_MODE_ASYNC) {
    constexpr v1::StreamKind kMain = v1::STREAM_KIND_MAIN;
    for (int b = 0; b < buckets; ++b) {
      Add(&rs, b, v1::OP_KIND_GATHER, kMain, 0);
      if (owns[b]) Add(&rs, b, v1::OP_KIND_ORTHOGONALIZE, kMain, 0);
      Add(&rs, b, v1::OP_KIND_REDISTRIBUTE, kMain, 0);
      Add(&rs, b, v1::OP_KIND_APPLY, kMain, 0);
    }
    return rs;
  }
  const int p = std::max(0, header.prefetch_count());
  const int64_t slots = int64_t{p} + 1;  // int64: p may be INT32_MAX
  constexpr v1::StreamKind kComm = v1::STREAM_KIND_COMM;
  int next_gather = 0;
  for (; next_gather <= p && next_gather < buckets; ++next_gather) {
    Add(&rs, next_gather, v1::OP_KIND_GATHER, kComm,
        static_cast<int>(next_gather % slots));
  }
  for (int b = 0; b < buckets; ++b) {
    const int slot = static_cast<int>(b % slots);  // < buckets
    Add(&rs, b, v1::OP_KIND_REDISTRIBUTE, kComm, slot);
    Add(&rs, b, v1::OP_KIND_APPLY, kComm, slot);
    if (next_gather < buckets) {
      Add(&rs, next_gather, v1::OP_KIND_GATHER, kComm,
          static_cast<int>(next_gather % slots));
      ++next_gather;
    }
  }
  for (int b = 0; b < buckets; ++b) {
    if (owns[b]) {
      Add(&rs, b, v1::OP_KIND_ORTHOGONALIZE, v1::STREAM_KIND_COMPUTE,
          static_cast<int>(b % slots));
    }
  }
  return rs;
}

}  // namespace

v1::RankSchedule MakeRankSchedule(const v1::Plan& plan, int rank) {
  return DeriveRankSchedule(plan.schedule(), plan, rank);
}

v1::Schedule MakeSchedule(const v1::Plan& plan, bool async,
                          int prefetch_count) {
  v1::Schedule s = MakeScheduleHeader(plan, async, prefetch_count);
  for (int r = 0; r < plan.world_size(); ++r) {
    *s.add_ranks() = DeriveRankSchedule(s, plan, r);
  }
  return s;
}

namespace {

// Walks one rank's operation list in order, tracking per bucket how often
// each operation ran, which bucket holds each slot, and how many buckets
// are in flight (gathered, not yet applied).
class RankScheduleWalk {
 public:
  RankScheduleWalk(const v1::RankSchedule& rs, const v1::Schedule& s,
                   const v1::Plan& plan,
                   std::vector<std::pair<int, v1::OpKind>>* collectives)
      : s_(s),
        r_(rs.rank()),
        owns_(OwnedBuckets(plan, r_)),
        counts_(plan.buckets_size(), {0, 0, 0, 0}),
        slot_user_(std::max(0, s.slots()), -1),
        gathered_(plan.buckets_size(), 0),
        collectives_(collectives) {}

  // One operation: bucket and slot in range, the mode's stream, then the
  // operation's own rules.
  absl::Status Step(const v1::ScheduledOp& op) {
    const int b = op.bucket();
    if (b < 0 || b >= static_cast<int>(counts_.size())) {
      return Invalid(r_, b, op.op(), "no such bucket");
    }
    if (op.slot() < 0 || op.slot() >= s_.slots()) {
      return Invalid(r_, b, op.op(),
                     absl::StrCat("slot ", op.slot(), " out of range [0, ",
                                  s_.slots(), ")"));
    }
    const v1::StreamKind want_stream = ExpectedStream(op.op());
    if (op.stream() != want_stream) {
      return Invalid(
          r_, b, op.op(),
          absl::StrCat("on stream \"", WireName(op.stream()), "\"; expected \"",
                       WireName(want_stream), "\""));
    }
    if (op.op() == v1::OP_KIND_GATHER) return Gather(op);
    if (op.op() == v1::OP_KIND_REDISTRIBUTE || op.op() == v1::OP_KIND_APPLY) {
      return Release(op);
    }
    if (op.op() == v1::OP_KIND_ORTHOGONALIZE) {
      ++counts_[b][1];
      if (!owns_[b]) {
        return Invalid(
            r_, b, op.op(),
            absl::StrCat("rank ", r_, " owns no matrix of this bucket"));
      }
      return absl::OkStatus();
    }
    return Invalid(r_, b, op.op(), "unknown operation");
  }

  // After the walk: every bucket gathered, redistributed and applied once,
  // orthogonalized once by an owner and never by another rank.
  absl::Status CheckCounts() const {
    static constexpr v1::OpKind kKinds[4] = {
        v1::OP_KIND_GATHER, v1::OP_KIND_ORTHOGONALIZE, v1::OP_KIND_REDISTRIBUTE,
        v1::OP_KIND_APPLY};
    for (size_t b = 0; b < counts_.size(); ++b) {
      for (int k = 0; k < 4; ++k) {
        const int want = k == 1 ? (owns_[b] ? 1 : 0) : 1;
        if (counts_[b][k] != want) {
          return absl::InvalidArgumentError(
              absl::StrCat("rank ", r_, ", bucket ", b, ": ",
                           WireName(kKinds[k]), " scheduled ", counts_[b][k],
                           " times; expected ", want == 1 ? "once" : "0"));
        }
      }
    }
    return absl::OkStatus();
  }

 private:
  // "main" in sequential mode; in async mode "compute" for Newton-Schulz
  // and "comm" for the rest.
  v1::StreamKind ExpectedStream(v1::OpKind op) const {
    if (s_.mode() != v1::SCHEDULE_MODE_ASYNC) return v1::STREAM_KIND_MAIN;
    return op == v1::OP_KIND_ORTHOGONALIZE ? v1::STREAM_KIND_COMPUTE
                                           : v1::STREAM_KIND_COMM;
  }

  // A gather: buckets in plan order, into a free slot, at most
  // prefetch_count + 1 in flight.
  absl::Status Gather(const v1::ScheduledOp& op) {
    const int b = op.bucket();
    ++counts_[b][0];
    if (b != last_gathered_ + 1) {
      return Invalid(r_, b, op.op(),
                     absl::StrCat("buckets must be gathered in plan order "
                                  "(after bucket ",
                                  last_gathered_, ")"));
    }
    last_gathered_ = b;
    if (slot_user_[op.slot()] != -1) {
      return Invalid(
          r_, b, op.op(),
          absl::StrCat("slot ", op.slot(), " still holds bucket ",
                       slot_user_[op.slot()], ", which is not applied yet"));
    }
    slot_user_[op.slot()] = b;
    gathered_[b] = 1;
    const int64_t max_in_flight = int64_t{s_.prefetch_count()} + 1;
    if (++in_flight_ > max_in_flight) {
      return Invalid(r_, b, op.op(),
                     absl::StrCat(in_flight_, " buckets in flight; at most ",
                                  max_in_flight));
    }
    if (collectives_ != nullptr) collectives_->push_back({b, op.op()});
    return absl::OkStatus();
  }

  // A redistribute, then an apply (which frees the bucket's slot: the
  // slot holds the bucket's local O until it is applied), both in the
  // bucket's slot and after its gather.
  absl::Status Release(const v1::ScheduledOp& op) {
    const int b = op.bucket();
    if (!gathered_[b]) {
      return Invalid(r_, b, op.op(), "comes before the bucket's gather");
    }
    if (slot_user_[op.slot()] != b) {
      return Invalid(r_, b, op.op(),
                     absl::StrCat("slot ", op.slot(), " holds bucket ",
                                  slot_user_[op.slot()]));
    }
    if (op.op() == v1::OP_KIND_REDISTRIBUTE) {
      ++counts_[b][2];
      if (collectives_ != nullptr) collectives_->push_back({b, op.op()});
      return absl::OkStatus();
    }
    ++counts_[b][3];
    if (counts_[b][2] == 0) {
      return Invalid(r_, b, op.op(), "comes before the bucket's redistribute");
    }
    slot_user_[op.slot()] = -1;
    --in_flight_;
    return absl::OkStatus();
  }

  const v1::Schedule& s_;
  const int r_;
  const std::vector<char> owns_;
  // counts_[b]: gather, orthogonalize, redistribute, apply.
  std::vector<std::array<int, 4>> counts_;
  // Per slot: the bucket in it that is not yet applied (-1 = free).
  std::vector<int> slot_user_;
  std::vector<char> gathered_;
  int in_flight_ = 0;
  int last_gathered_ = -1;
  std::vector<std::pair<int, v1::OpKind>>* collectives_;
};

}  // namespace

absl::Status ValidateRankSchedule(
    const v1::RankSchedule& rs, const v1::Schedule& s, const v1::Plan& plan,
    std::vector<std::pair<int, v1::OpKind>>* collectives) {
  // The header first: the walk sizes its slot table by s.slots().
  MUON_RETURN_IF_ERROR(ValidateHeader(s, plan));
  RankScheduleWalk walk(rs, s, plan, collectives);
  for (const v1::ScheduledOp& op : rs.ops()) {
    MUON_RETURN_IF_ERROR(walk.Step(op));
  }
  return walk.CheckCounts();
}

absl::Status ValidateSchedule(const v1::Schedule& s, const v1::Plan& plan) {
  MUON_RETURN_IF_ERROR(ValidateHeader(s, plan));
  if (s.ranks_size() == 0) {
    if (s.derivation() != kScheduleDerivation) {
      return absl::InvalidArgumentError(
          absl::StrCat("schedule derivation \"", s.derivation(), "\" is not \"",
                       kScheduleDerivation, "\" (a rank built another way)"));
    }
    // The collectives and slots every rank derives: those of a rank owning
    // nothing (-1); owners only add orthogonalize on their own stream.
    return ValidateRankSchedule(DeriveRankSchedule(s, plan, -1), s, plan);
  }
  if (s.ranks_size() != plan.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule has ", s.ranks_size(),
                     " ranks; the plan's world size is ", plan.world_size()));
  }
  std::vector<std::pair<int, v1::OpKind>> collectives0;
  for (int r = 0; r < s.ranks_size(); ++r) {
    if (s.ranks(r).rank() != r) {
      return absl::InvalidArgumentError(absl::StrCat(
          "schedule entry ", r, " is for rank ", s.ranks(r).rank()));
    }
    std::vector<std::pair<int, v1::OpKind>> collectives;
    absl::Status st = ValidateRankSchedule(s.ranks(r), s, plan, &collectives);
    if (!st.ok()) return st;
    if (r == 0) {
      collectives0 = std::move(collectives);
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
