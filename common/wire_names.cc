#include "common/wire_names.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"

namespace muon {
namespace {

constexpr absl::string_view kUnspecified = "UNSPECIFIED";

// "OP_KIND_" for OpKind, from its zero value OP_KIND_UNSPECIFIED; empty when
// the zero value does not follow that naming.
absl::string_view Prefix(const google::protobuf::EnumDescriptor& type) {
  const google::protobuf::EnumValueDescriptor* zero = type.FindValueByNumber(0);
  if (zero == nullptr) return "";
  absl::string_view name = zero->name();
  if (!absl::EndsWith(name, kUnspecified)) return "";
  name.remove_suffix(kUnspecified.size());
  return name;
}

}  // namespace

std::string WireName(const google::protobuf::EnumValueDescriptor& value) {
  absl::string_view name = value.name();
  absl::ConsumePrefix(&name, Prefix(*value.type()));
  return absl::AsciiStrToLower(name);
}

const google::protobuf::EnumValueDescriptor* FindByWireName(
    const google::protobuf::EnumDescriptor& type, absl::string_view name) {
  for (int i = 0; i < type.value_count(); ++i) {
    const google::protobuf::EnumValueDescriptor* v = type.value(i);
    if (WireName(*v) == name) return v;
  }
  return nullptr;
}

}  // namespace muon
