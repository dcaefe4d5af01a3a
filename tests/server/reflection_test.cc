// CoordinatorServer serves gRPC server reflection, so grpcurl / grpc_cli can
// list muon.v1.Coordinator. Debian ships the reflection library without its
// generated headers: the test speaks
// grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo with raw bytes
// (a ByteBuffer bidi stream) and decodes the answer with protobuf's
// UnknownFieldSet.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/unknown_field_set.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/codegen/client_callback.h"
#include "grpcpp/impl/codegen/sync_stream.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "server/coordinator_server.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::testing::Contains;

// The length-delimited values of field `number` in `bytes`.
std::vector<std::string> Field(const std::string& bytes, int number) {
  google::protobuf::UnknownFieldSet fields;
  std::vector<std::string> out;
  if (!fields.ParseFromString(bytes)) return out;
  for (int i = 0; i < fields.field_count(); ++i) {
    const google::protobuf::UnknownField& f = fields.field(i);
    if (f.number() == number &&
        f.type() == google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) {
      out.push_back(f.length_delimited());
    }
  }
  return out;
}

// The services a reflection server lists (ServerReflectionRequest with
// list_services = "": field 7, empty string).
std::vector<std::string> ListServices(const std::string& target) {
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(5));
  const grpc::internal::RpcMethod method(
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
      grpc::internal::RpcMethod::BIDI_STREAMING);
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>>
      stream(grpc::internal::ClientReaderWriterFactory<
             grpc::ByteBuffer, grpc::ByteBuffer>::Create(channel.get(), method,
                                                         &context));
  const std::string request("\x3a\x00", 2);  // list_services = ""
  grpc::Slice slice(request);
  grpc::ByteBuffer out(&slice, 1);
  std::vector<std::string> names;
  if (!stream->Write(out)) return names;
  stream->WritesDone();
  grpc::ByteBuffer in;
  if (stream->Read(&in)) {
    std::vector<grpc::Slice> slices;
    if (in.Dump(&slices).ok()) {
      std::string bytes;
      for (const grpc::Slice& s : slices) {
        bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
      // ServerReflectionResponse.list_services_response = 6;
      // ListServiceResponse.service = 1; ServiceResponse.name = 1.
      for (const std::string& list : Field(bytes, 6)) {
        for (const std::string& service : Field(list, 1)) {
          for (const std::string& name : Field(service, 1)) {
            names.push_back(name);
          }
        }
      }
    }
  }
  const grpc::Status status = stream->Finish();
  EXPECT_TRUE(status.ok()) << status.error_code() << ": "
                           << status.error_message();
  return names;
}

TEST(ReflectionTest, ListServices_NamesCoordinatorAndHealth) {
  CoordinatorServerOptions options;
  options.service.job_id = "reflection";
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
      CoordinatorServer::Start(options);
  ASSERT_THAT(server, IsOk());
  const std::vector<std::string> services = ListServices((*server)->address());
  EXPECT_THAT(services, Contains("muon.v1.Coordinator"));
  EXPECT_THAT(services, Contains("grpc.health.v1.Health"));
  EXPECT_THAT(services, Contains("grpc.reflection.v1alpha.ServerReflection"));
}

}  // namespace
}  // namespace muon
