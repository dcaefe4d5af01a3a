#ifndef MUON_COMMON_WIRE_NAMES_H_
#define MUON_COMMON_WIRE_NAMES_H_

// The names the edges of the system print for the wire enums of
// proto/muon/v1/coordinator.proto (OpKind, StreamKind, ScheduleMode,
// JobState, RankState): the value's name after its enum's prefix, in lower
// case, e.g. OP_KIND_GATHER is "gather" and RANK_STATE_LOST is "lost". The
// prefix is the name of the enum's zero value without "UNSPECIFIED", as the
// protobuf style guide names them. muonctl's tables and JSON, the metrics
// labels and the log use these names; inside the system the values are
// compared as enums.

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/generated_enum_reflection.h"

namespace muon {

// "gather" for OP_KIND_GATHER (see above); "unspecified" for the zero value.
std::string WireName(const google::protobuf::EnumValueDescriptor& value);

// The value of `type` whose WireName is `name`; nullptr when none is.
const google::protobuf::EnumValueDescriptor* FindByWireName(
    const google::protobuf::EnumDescriptor& type, absl::string_view name);

// WireName of a generated enum value, e.g. WireName(v1::OP_KIND_APPLY) is
// "apply". A number the enum does not define prints as "unknown(N)".
template <typename E>
std::string WireName(E value) {
  const google::protobuf::EnumValueDescriptor* v =
      google::protobuf::GetEnumDescriptor<E>()->FindValueByNumber(
          static_cast<int>(value));
  if (v == nullptr) {
    return "unknown(" + std::to_string(static_cast<int>(value)) + ")";
  }
  return WireName(*v);
}

// Parses a WireName of enum E into *out; false (and *out unchanged) for a
// name that is not one.
template <typename E>
bool ParseWireName(absl::string_view name, E* out) {
  const google::protobuf::EnumValueDescriptor* v =
      FindByWireName(*google::protobuf::GetEnumDescriptor<E>(), name);
  if (v == nullptr) return false;
  *out = static_cast<E>(v->number());
  return true;
}

// Every value of enum E but the zero (UNSPECIFIED) one, in declaration
// order: e.g. the label values a metric registers up front.
template <typename E>
std::vector<E> SpecifiedValues() {
  const google::protobuf::EnumDescriptor* d =
      google::protobuf::GetEnumDescriptor<E>();
  std::vector<E> values;
  for (int i = 0; i < d->value_count(); ++i) {
    if (d->value(i)->number() != 0) {
      values.push_back(static_cast<E>(d->value(i)->number()));
    }
  }
  return values;
}

}  // namespace muon

#endif  // MUON_COMMON_WIRE_NAMES_H_
