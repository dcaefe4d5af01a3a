#include "common/wire_names.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "muon/v1/coordinator.pb.h"

namespace muon {
namespace {

TEST(WireNamesTest, NamesAreTheValueAfterTheEnumsPrefixInLowerCase) {
  EXPECT_EQ(WireName(v1::OP_KIND_GATHER), "gather");
  EXPECT_EQ(WireName(v1::OP_KIND_ORTHOGONALIZE), "orthogonalize");
  EXPECT_EQ(WireName(v1::OP_KIND_REDISTRIBUTE), "redistribute");
  EXPECT_EQ(WireName(v1::OP_KIND_APPLY), "apply");
  EXPECT_EQ(WireName(v1::STREAM_KIND_COMPUTE), "compute");
  EXPECT_EQ(WireName(v1::SCHEDULE_MODE_ASYNC), "async");
  EXPECT_EQ(WireName(v1::JOB_STATE_WAITING), "waiting");
  EXPECT_EQ(WireName(v1::RANK_STATE_LOST), "lost");
  EXPECT_EQ(WireName(v1::RANK_STATE_UNSPECIFIED), "unspecified");
}

TEST(WireNamesTest, NumberOutsideTheEnumPrintsAsUnknown) {
  EXPECT_EQ(WireName(static_cast<v1::OpKind>(42)), "unknown(42)");
}

// Every value of every wire enum parses back from its name, so the names
// printed by muonctl and the metrics are unambiguous.
template <typename E>
void ExpectRoundTrip() {
  const google::protobuf::EnumDescriptor* d =
      google::protobuf::GetEnumDescriptor<E>();
  for (int i = 0; i < d->value_count(); ++i) {
    const E value = static_cast<E>(d->value(i)->number());
    E parsed{};
    ASSERT_TRUE(ParseWireName(WireName(value), &parsed)) << WireName(value);
    EXPECT_EQ(parsed, value) << WireName(value);
  }
}

TEST(WireNamesTest, EveryValueOfEveryWireEnumParsesBack) {
  ExpectRoundTrip<v1::OpKind>();
  ExpectRoundTrip<v1::StreamKind>();
  ExpectRoundTrip<v1::ScheduleMode>();
  ExpectRoundTrip<v1::JobState>();
  ExpectRoundTrip<v1::RankState>();
}

TEST(WireNamesTest, SpecifiedValuesAreEveryValueButZeroInDeclarationOrder) {
  const std::vector<v1::OpKind> ops = SpecifiedValues<v1::OpKind>();
  EXPECT_EQ(ops, (std::vector<v1::OpKind>{
                     v1::OP_KIND_GATHER, v1::OP_KIND_ORTHOGONALIZE,
                     v1::OP_KIND_REDISTRIBUTE, v1::OP_KIND_APPLY}));
  EXPECT_EQ(SpecifiedValues<v1::RankState>().size(), 6u);
}

TEST(WireNamesTest, UnknownNameIsRefusedAndLeavesTheOutputAlone) {
  v1::OpKind op = v1::OP_KIND_APPLY;
  EXPECT_FALSE(ParseWireName("GATHER", &op));  // names are lower case
  EXPECT_FALSE(ParseWireName("scatter", &op));
  EXPECT_EQ(op, v1::OP_KIND_APPLY);
}

}  // namespace
}  // namespace muon
