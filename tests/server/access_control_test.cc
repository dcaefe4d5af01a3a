// Access control and bounds of the coordinator over real gRPC on loopback:
// per-job secret and read-only token in the metadata, TLS with a
// self-signed certificate made here with openssl, message size limit, and
// waiting KeyGets that hold no server thread.
#include <dirent.h>
#include <sys/stat.h>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "control/grpc_coordination_client.h"
#include "coordination/credentials.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "muon/v1/coordinator.grpc.pb.h"
#include "server/coordinator_server.h"
#include "tests/server/test_specs.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::muon::testing::MakeSpec;
using ::muon::testing::Manifests;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kSecret[] = "job-secret-0123456789abcdef";
constexpr char kReadToken[] = "read-token-0123456789abcdef";

std::string TempDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp != nullptr ? tmp : "/tmp";
}

std::unique_ptr<CoordinatorServer> StartServer(TlsFiles tls = TlsFiles(),
                                               int max_message_bytes = 1
                                                                       << 20) {
  CoordinatorServerOptions options;
  options.service.job_id = "secret-job-name";
  options.service.world_size = 2;
  options.auth.job_secret = kSecret;
  options.auth.read_token = kReadToken;
  options.tls = tls;
  options.max_message_bytes = max_message_bytes;
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
      CoordinatorServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

std::unique_ptr<GrpcCoordinationClient> Connect(
    const std::string& address, const std::string& token,
    const std::string& ca_file = "") {
  absl::StatusOr<std::unique_ptr<GrpcCoordinationClient>> client =
      GrpcCoordinationClient::Create(
          address, "", absl::Seconds(3),
          GrpcClientSecurity{token, ca_file, "localhost"});
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

v1::JoinRequest JoinRank0() {
  v1::JoinRequest request;
  *request.mutable_manifest() =
      Manifests(MakeSpec({{"dp_shard", 2}}, {{"w", 8, 8, {"Shard(0)"}}}))[0];
  request.set_incarnation(7);
  request.set_timeout_ms(100);
  return request;
}

TEST(AccessControlTest, NoOrWrongToken_EveryRpcUnauthenticatedLeakingNothing) {
  std::unique_ptr<CoordinatorServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  for (const std::string token : {"", "wrong-token", "job-secret"}) {
    std::unique_ptr<GrpcCoordinationClient> c =
        Connect(server->address(), token);
    ASSERT_NE(c, nullptr);
    std::vector<absl::Status> results = {
        c->Join(JoinRank0()).status(),
        c->Heartbeat(v1::HeartbeatRequest()).status(),
        c->ReportStep(v1::StepReport()),
        c->KeySet("gloo/0", "x"),
        c->KeyGet("gloo/0", absl::ZeroDuration()).status(),
        c->GetJob().status(),
        c->GetPlan().status(),
        c->GetAssignments().status(),
        c->ListRanks().status(),
        c->GetReports(-1, 0).status()};
    for (const absl::Status& s : results) {
      EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnauthenticated,
                              Not(HasSubstr("secret-job-name"))))
          << "token \"" << token << "\"";
      // The error says what to fix: the shared secret and where it is set.
      EXPECT_THAT(
          s.message(),
          AllOf(HasSubstr("refused this client's credentials"),
                HasSubstr("MUON_JOB_SECRET"), HasSubstr("--token_file")))
          << s;
    }
  }
  // Nothing was written: the rogue KeySet and Join left no trace.
  std::unique_ptr<GrpcCoordinationClient> ok =
      Connect(server->address(), kSecret);
  absl::StatusOr<v1::JobInfo> job = ok->GetJob();
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->ranks_joined(), 0);
  EXPECT_THAT(ok->KeyGet("gloo/0", absl::ZeroDuration()),
              StatusIs(absl::StatusCode::kDeadlineExceeded, ::testing::_));
}

// A heartbeat stream checks the credentials once, when it opens: a wrong
// token ends it UNAUTHENTICATED, the read-only one PERMISSION_DENIED.
TEST(AccessControlTest, HeartbeatStream_WrongOrReadOnlyTokenRefused) {
  std::unique_ptr<CoordinatorServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      MakeCoordinatorChannel(server->address(), GrpcClientSecurity());
  ASSERT_THAT(channel, IsOk());
  std::unique_ptr<v1::Coordinator::Stub> stub =
      v1::Coordinator::NewStub(*channel);
  const std::pair<std::string, grpc::StatusCode> cases[] = {
      {"wrong-token", grpc::StatusCode::UNAUTHENTICATED},
      {kReadToken, grpc::StatusCode::PERMISSION_DENIED}};
  for (const auto& [token, code] : cases) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    context.AddMetadata(kAuthorizationMetadataKey, BearerValue(token));
    auto stream = stub->HostHeartbeatStream(&context);
    v1::HostHeartbeatRequest beat;
    beat.set_host("h0");
    stream->Write(beat);
    v1::HeartbeatResponse answer;
    EXPECT_FALSE(stream->Read(&answer)) << token;
    EXPECT_EQ(stream->Finish().error_code(), code) << token;
  }
}

TEST(AccessControlTest, ReadOnlyToken_ReadsButRankRpcsPermissionDenied) {
  std::unique_ptr<CoordinatorServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  std::unique_ptr<GrpcCoordinationClient> ctl =
      Connect(server->address(), kReadToken);
  ASSERT_NE(ctl, nullptr);
  EXPECT_THAT(ctl->GetJob(), IsOk());
  EXPECT_THAT(ctl->ListRanks(), IsOk());
  EXPECT_THAT(ctl->GetReports(-1, 0), IsOk());
  EXPECT_THAT(ctl->GetPlan(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                       ::testing::_));  // no plan yet
  EXPECT_THAT(
      ctl->Join(JoinRank0()),
      StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("read-only")));
  EXPECT_THAT(ctl->KeySet("k", "v"),
              StatusIs(absl::StatusCode::kPermissionDenied, ::testing::_));
  EXPECT_THAT(ctl->Heartbeat(v1::HeartbeatRequest()).status(),
              StatusIs(absl::StatusCode::kPermissionDenied, ::testing::_));
  // The job secret may do everything.
  std::unique_ptr<GrpcCoordinationClient> rank =
      Connect(server->address(), kSecret);
  EXPECT_THAT(rank->KeySet("k", "v"), IsOk());
  EXPECT_THAT(rank->Join(JoinRank0()),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("waiting for ranks [1]")));
}

TEST(AccessControlTest, OversizedRequest_RejectedByMessageLimit) {
  std::unique_ptr<CoordinatorServer> server =
      StartServer(TlsFiles(), /*max_message_bytes=*/4096);
  ASSERT_NE(server, nullptr);
  std::unique_ptr<GrpcCoordinationClient> c =
      Connect(server->address(), kSecret);
  EXPECT_THAT(c->KeySet("big", std::string(8192, 'x')),
              StatusIs(absl::StatusCode::kResourceExhausted, ::testing::_));
  EXPECT_THAT(c->KeySet("small", std::string(100, 'x')), IsOk());
}

int CountThreads() {
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n;
}

TEST(AccessControlTest, ThreeHundredWaitingKeyGets_HoldNoServerThreads) {
  std::unique_ptr<CoordinatorServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  auto channel = grpc::CreateChannel(server->address(),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::Coordinator::NewStub(channel);
  // Warm up the channel and the server's threads with one call.
  std::unique_ptr<GrpcCoordinationClient> c =
      Connect(server->address(), kSecret);
  ASSERT_THAT(c->KeySet("warm", "1"), IsOk());
  const int before = CountThreads();

  constexpr int kCalls = 300;
  struct Call {
    grpc::ClientContext context;
    v1::KeyGetRequest request;
    v1::KeyGetResponse response;
  };
  std::vector<std::unique_ptr<Call>> calls;
  absl::Mutex mu;
  int ok = 0;
  int done = 0;
  for (int i = 0; i < kCalls; ++i) {
    auto call = std::make_unique<Call>();
    call->context.AddMetadata(kAuthorizationMetadataKey, BearerValue(kSecret));
    call->context.set_deadline(
        absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    call->request.set_key("late");
    call->request.set_timeout_ms(20000);
    Call* raw = call.get();
    stub->async()->KeyGet(&raw->context, &raw->request, &raw->response,
                          [&mu, &ok, &done, raw](grpc::Status s) {
                            absl::MutexLock lock(&mu);
                            if (s.ok() && raw->response.value() == "v") ++ok;
                            ++done;
                          });
    calls.push_back(std::move(call));
  }
  // Let the calls reach the server (they wait there for 20 s).
  absl::SleepFor(absl::Seconds(1));
  const int during = CountThreads();
  std::cout << "threads of the test process (server + client): " << before
            << " before, " << during << " with " << kCalls
            << " KeyGets waiting\n";
  // gRPC's pollers and the callback executor may add a few threads; one
  // per waiting call would add ~300.
  EXPECT_LT(during - before, 40) << "before " << before << " during " << during;
  ASSERT_THAT(c->KeySet("late", "v"), IsOk());
  {
    absl::MutexLock lock(&mu);
    auto all_done = [&]() {
      mu.AssertReaderHeld();
      return done == kCalls;
    };
    mu.AwaitWithTimeout(absl::Condition(&all_done), absl::Seconds(20));
    EXPECT_EQ(done, kCalls);
    EXPECT_EQ(ok, kCalls);
  }
}

// Makes a self-signed certificate for "localhost" and 127.0.0.1 in `dir`.
bool MakeSelfSignedCert(const std::string& dir) {
  const std::string cmd = absl::StrCat(
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
      "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout ",
      dir, "/key.pem -out ", dir, "/cert.pem >/dev/null 2>&1");
  return std::system(cmd.c_str()) == 0;
}

TEST(AccessControlTest, Tls_SelfSignedCert_VerifiedClientWorksPlaintextFails) {
  const std::string dir = TempDir();
  ASSERT_TRUE(MakeSelfSignedCert(dir)) << "openssl failed";
  TlsFiles tls;
  tls.cert_file = dir + "/cert.pem";
  tls.key_file = dir + "/key.pem";
  std::unique_ptr<CoordinatorServer> server = StartServer(tls);
  ASSERT_NE(server, nullptr);
  std::unique_ptr<GrpcCoordinationClient> secure =
      Connect(server->address(), kSecret, dir + "/cert.pem");
  ASSERT_NE(secure, nullptr);
  absl::StatusOr<v1::JobInfo> job = secure->GetJob();
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->job_id(), "secret-job-name");
  std::unique_ptr<GrpcCoordinationClient> plain =
      Connect(server->address(), kSecret);
  EXPECT_THAT(plain->GetJob(),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
}

TEST(AccessControlTest, Tls_CertWithoutKey_RejectedNamingIt) {
  TlsFiles tls;
  tls.cert_file = TempDir() + "/cert.pem";
  CoordinatorServerOptions options;
  options.tls = tls;
  EXPECT_THAT(CoordinatorServer::Start(options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("certificate file and a key file")));
}

TEST(CredentialsTest, SecretFile_CreatedMode0600_WorldReadableRejected) {
  const std::string path = TempDir() + "/job.secret";
  std::remove(path.c_str());
  absl::StatusOr<std::string> secret = GenerateSecret();
  ASSERT_THAT(secret, IsOk());
  EXPECT_EQ(secret->size(), 64u);
  ASSERT_THAT(WriteSecretFile(path, *secret), IsOk());
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  absl::StatusOr<std::string> read = ReadSecretFile(path);
  ASSERT_THAT(read, IsOk());
  EXPECT_EQ(*read, *secret);
  EXPECT_THAT(WriteSecretFile(path, "other"),
              StatusIs(absl::StatusCode::kAlreadyExists, ::testing::_));
  ASSERT_EQ(chmod(path.c_str(), 0644), 0);
  EXPECT_THAT(
      ReadSecretFile(path),
      StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("mode 0644")));
  EXPECT_THAT(ReadSecretFile(TempDir() + "/absent.secret"),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
}

// MUON_JOB_SECRET set but empty or only whitespace (and an empty
// MUON_JOB_SECRET_FILE) is an error naming the variable, not "no secret"
// (which turns authentication off); a real value is stripped and kept.
TEST(CredentialsTest, JobSecretFromEnv_BlankSecret_InvalidArgumentNamingIt) {
  const char* saved_secret = std::getenv("MUON_JOB_SECRET");
  const char* saved_file = std::getenv("MUON_JOB_SECRET_FILE");
  const std::string secret_before = saved_secret ? saved_secret : "";
  const std::string file_before = saved_file ? saved_file : "";
  unsetenv("MUON_JOB_SECRET_FILE");
  for (const char* blank : {"", "   ", " \t\n"}) {
    ASSERT_EQ(setenv("MUON_JOB_SECRET", blank, 1), 0);
    EXPECT_THAT(JobSecretFromEnv(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("MUON_JOB_SECRET is"),
                               HasSubstr("turn authentication off"))))
        << "\"" << blank << "\"";
  }
  ASSERT_EQ(setenv("MUON_JOB_SECRET", " s3cret\n", 1), 0);
  absl::StatusOr<std::string> kept = JobSecretFromEnv();
  ASSERT_THAT(kept, IsOk());
  EXPECT_EQ(*kept, "s3cret");
  unsetenv("MUON_JOB_SECRET");
  absl::StatusOr<std::string> none = JobSecretFromEnv();
  ASSERT_THAT(none, IsOk());
  EXPECT_EQ(*none, "");
  ASSERT_EQ(setenv("MUON_JOB_SECRET_FILE", "", 1), 0);
  EXPECT_THAT(JobSecretFromEnv(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("MUON_JOB_SECRET_FILE is set but empty")));
  // A blank variable next to a usable other one counts as unset (`export
  // MUON_JOB_SECRET=` clears it): the other gives the secret.
  const std::string path = TempDir() + "/blank_next_to_file.secret";
  ::unlink(path.c_str());
  ASSERT_THAT(WriteSecretFile(path, "from-file"), IsOk());
  ASSERT_EQ(setenv("MUON_JOB_SECRET", "", 1), 0);
  ASSERT_EQ(setenv("MUON_JOB_SECRET_FILE", path.c_str(), 1), 0);
  absl::StatusOr<std::string> from_file = JobSecretFromEnv();
  ASSERT_THAT(from_file, IsOk());
  EXPECT_EQ(*from_file, "from-file");
  ASSERT_EQ(setenv("MUON_JOB_SECRET", "s3cret", 1), 0);
  ASSERT_EQ(setenv("MUON_JOB_SECRET_FILE", " ", 1), 0);
  absl::StatusOr<std::string> from_value = JobSecretFromEnv();
  ASSERT_THAT(from_value, IsOk());
  EXPECT_EQ(*from_value, "s3cret");
  unsetenv("MUON_JOB_SECRET");
  unsetenv("MUON_JOB_SECRET_FILE");
  ::unlink(path.c_str());
  EXPECT_THAT(CheckJobSecret("  ", "the test's secret"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the test's secret is only whitespace")));
  unsetenv("MUON_JOB_SECRET_FILE");
  if (saved_secret != nullptr) {
    setenv("MUON_JOB_SECRET", secret_before.c_str(), 1);
  }
  if (saved_file != nullptr) {
    setenv("MUON_JOB_SECRET_FILE", file_before.c_str(), 1);
  }
}

// A server given a job secret or read token of only whitespace refuses to
// start (an empty one serves without authentication, for in-process tests).
TEST(AccessControlTest, Start_BlankSecret_InvalidArgument) {
  CoordinatorServerOptions options;
  options.auth.job_secret = " \t ";
  EXPECT_THAT(CoordinatorServer::Start(options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("job secret is only whitespace")));
  options.auth.job_secret = kSecret;
  options.auth.read_token = "  ";
  EXPECT_THAT(CoordinatorServer::Start(options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("read-only token is only whitespace")));
  options.auth.read_token = "";
  options.max_message_bytes = 0;
  EXPECT_THAT(CoordinatorServer::Start(options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("max_message_bytes is 0")));
}

TEST(CredentialsTest, IsLoopbackHost_LoopbackOnly) {
  EXPECT_TRUE(IsLoopbackHost("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackHost("::1"));
  EXPECT_TRUE(IsLoopbackHost("localhost"));
  EXPECT_FALSE(IsLoopbackHost("0.0.0.0"));
  EXPECT_FALSE(IsLoopbackHost("192.0.2.2"));
}

}  // namespace
}  // namespace muon
