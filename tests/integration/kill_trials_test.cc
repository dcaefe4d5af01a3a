// Failure propagation, multi-process: 4 rank processes (tests/multihost's
// muon_rank, stepping Muon in a loop) with a muon-coordinator daemon whose
// heartbeat timeout is 1 s. Each trial kills a random rank with SIGKILL at a
// random moment; every surviving rank must exit (no hang) with an error
// naming the killed rank ("rank V lost", the coordinator's words), within
// 2x the heartbeat timeout plus process exit. KILL_TRIALS (default 10) sets
// the number of trials; tools/kill_trials.sh runs 100 and prints the tally.
// Also: LaunchRanks names the rank that failed first, with its signal.
//
// With host agents: the same job as 2 hosts of 2 ranks, each host a
// muonrun (its host agent) against the daemon. Killed: one rank (its
// muonrun reports it at once; the other host's ranks name it and how it
// ended), a whole host (muonrun and its ranks; the other host's ranks name
// both of its ranks), or the coordinator (every rank says it is
// unreachable and training goes on). KILL_HOST_TRIALS (default 2) trials
// of each; tools/kill_trials.sh --hosts runs 20.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/job_secret_env.h"
#include "tools/launcher.h"

namespace muon {
namespace {

using ::testing::HasSubstr;

constexpr int kWorld = 4;
constexpr double kHeartbeatTimeoutS = 1.0;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A 2x2 mesh of small matrices: every rank takes part in every step.
constexpr char kSpec[] = R"json({
  "job_id": "kill",
  "mesh": {"dims": [{"name": "dp_replicate", "size": 2},
                    {"name": "dp_shard", "size": 2}]},
  "params": [
    {"name": "a", "shape": [12, 12], "placements": ["Replicate()", "Shard(0)"]},
    {"name": "b", "shape": [20, 12], "placements": ["Shard(0)", "Shard(1)"]},
    {"name": "c", "shape": [12, 20], "placements": ["Shard(1)", "Shard(1)"]},
    {"name": "d", "shape": [10, 7], "placements": ["Shard(0)", "Replicate()"]}
  ],
  "optimizer": {"lr": 0.02}
})json";

struct TrialResult {
  bool hang = false;
  bool named = true;   // every survivor's error names the victim
  double seconds = 0;  // kill -> every survivor exited
  std::string detail;
};

// Two consecutive free TCP ports on 127.0.0.1 (MASTER_PORT and the embedded
// coordinator's MASTER_PORT + 1), or 0.
int FreePortPair() {
  std::mt19937 rng(static_cast<unsigned>(getpid()) ^
                   static_cast<unsigned>(absl::ToUnixNanos(absl::Now())));
  for (int attempt = 0; attempt < 50; ++attempt) {
    const int port = 20000 + static_cast<int>(rng() % 30000);
    bool free = true;
    for (int p : {port, port + 1}) {
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(static_cast<uint16_t>(p));
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
        free = false;
      }
      close(fd);
    }
    if (free) return port;
  }
  return 0;
}

// One trial: with a daemon (heartbeat timeout kHeartbeatTimeoutS), or with
// the coordinator embedded in rank 0 (`embedded`, its default timeout).
TrialResult RunTrial(int victim, absl::Duration delay, int trial,
                     int sig = SIGKILL, bool embedded = false) {
  TrialResult result;
  absl::StatusOr<std::string> dir = MakeTempDir("kill-");
  if (!dir.ok()) {
    result.named = false;
    result.detail = std::string(dir.status().message());
    return result;
  }
  std::ofstream(*dir + "/spec.json") << kSpec;
  const std::string port_file = *dir + "/port";
  absl::StatusOr<pid_t> daemon =
      embedded ? absl::StatusOr<pid_t>(-1)
               : SpawnProcess({"server/muon-coordinator", "--port=0",
                               "--port_file=" + port_file, "--world_size=4",
                               "--job_id=kill", "--join_timeout_s=20",
                               absl::StrCat("--heartbeat_timeout_s=",
                                            kHeartbeatTimeoutS)});
  if (!daemon.ok()) {
    result.named = false;
    result.detail = std::string(daemon.status().message());
    return result;
  }
  absl::StatusOr<int> port =
      embedded ? absl::StatusOr<int>(FreePortPair())
               : WaitForPortFile(port_file, *daemon, absl::Seconds(30));
  std::vector<pid_t> pids;
  if (port.ok()) {
    for (int r = 0; r < kWorld; ++r) {
      const std::string command = absl::StrCat(
          "exec tests/multihost/muon_rank --spec=", *dir,
          "/spec.json --steps=100000000 --seed=", trial, " --out_dir=", *dir,
          " --timeout_s=60 2>", *dir, "/rank", r, ".err");
      std::vector<std::string> env = {absl::StrCat("RANK=", r),
                                      absl::StrCat("WORLD_SIZE=", kWorld),
                                      absl::StrCat("LOCAL_RANK=", r),
                                      absl::StrCat("LOCAL_WORLD_SIZE=", kWorld),
                                      "MASTER_ADDR=127.0.0.1",
                                      absl::StrCat("MASTER_PORT=", *port)};
      if (!embedded) {
        env.push_back(absl::StrCat("MUON_COORDINATOR=127.0.0.1:", *port));
      }
      absl::StatusOr<pid_t> pid = SpawnProcess({"/bin/sh", "-c", command}, env);
      if (pid.ok()) pids.push_back(*pid);
    }
  }
  if (pids.size() != static_cast<size_t>(kWorld)) {
    for (pid_t p : pids) kill(p, SIGKILL);
    WaitAll(pids, absl::Seconds(5));
    if (*daemon > 0) {
      kill(*daemon, SIGKILL);
      WaitAll({*daemon}, absl::Seconds(5));
    }
    result.named = false;
    result.detail = "could not start the daemon or the ranks";
    return result;
  }
  absl::SleepFor(delay);
  kill(pids[victim], sig);
  const absl::Time killed = absl::Now();
  std::vector<pid_t> survivors;
  for (int r = 0; r < kWorld; ++r) {
    if (r != victim) survivors.push_back(pids[r]);
  }
  std::vector<int> survivor_codes =
      WaitAll(survivors, absl::Seconds(20), absl::Seconds(20));
  result.seconds = absl::ToDoubleSeconds(absl::Now() - killed);
  if (sig != SIGKILL) kill(pids[victim], SIGKILL);  // a frozen one
  const int victim_code = WaitAll({pids[victim]}, absl::Seconds(10))[0];
  std::vector<int> codes;
  for (int r = 0, i = 0; r < kWorld; ++r) {
    codes.push_back(r == victim ? victim_code : survivor_codes[i++]);
  }
  if (*daemon > 0) {
    kill(*daemon, SIGTERM);
    WaitAll({*daemon}, absl::Seconds(10));
  }
  const std::string lost = absl::StrCat("rank ", victim, " lost");
  for (int r = 0; r < kWorld; ++r) {
    if (codes[r] == -1) result.hang = true;
    if (r == victim) continue;
    const std::string err = ReadFile(absl::StrCat(*dir, "/rank", r, ".err"));
    if (codes[r] == 0 || err.find(lost) == std::string::npos) {
      result.named = false;
      absl::StrAppend(&result.detail, "rank ", r, " (exit ", codes[r],
                      "): ", err.substr(0, 600), "\n");
    }
  }
  return result;
}

int Trials() {
  const char* v = std::getenv("KILL_TRIALS");
  int n = 10;
  if (v != nullptr && (!absl::SimpleAtoi(v, &n) || n < 1)) n = 10;
  return n;
}

enum class HostVictim { kRank, kHost, kCoordinator };

// The pid of the child of `parent` whose environment has LOCAL_RANK=`local`
// (a rank muonrun started), or -1.
pid_t ChildWithLocalRank(pid_t parent, int local) {
  pid_t found = -1;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return -1;
  const std::string want = absl::StrCat("LOCAL_RANK=", local);
  while (const dirent* e = readdir(proc)) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(e->d_name, &pid)) continue;
    const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
    // "pid (comm) state ppid ...": the ppid follows the last ')'.
    const size_t close = stat.rfind(')');
    int ppid = -1;
    if (close == std::string::npos ||
        std::sscanf(stat.c_str() + close + 1, " %*c %d", &ppid) != 1 ||
        ppid != parent) {
      continue;
    }
    const std::string env = ReadFile(absl::StrCat("/proc/", pid, "/environ"));
    size_t at = 0;
    while (at < env.size()) {
      const size_t end = env.find('\0', at);
      if (env.compare(at, end - at, want) == 0) found = pid;
      if (end == std::string::npos) break;
      at = end + 1;
    }
  }
  closedir(proc);
  return found;
}

// Whether some line of `err` (a muonrun's stderr) starts with "[rank r]"
// and contains `needle`.
bool RankSaid(const std::string& err, int r, const std::string& needle) {
  const std::string prefix = absl::StrCat("[rank ", r, "] ");
  size_t at = 0;
  while (at < err.size()) {
    size_t end = err.find('\n', at);
    if (end == std::string::npos) end = err.size();
    const std::string line = err.substr(at, end - at);
    if (line.rfind(prefix, 0) == 0 && line.find(needle) != std::string::npos) {
      return true;
    }
    at = end + 1;
  }
  return false;
}

// The job of 2 hosts x 2 ranks: the daemon and one muonrun per host.
struct HostJob {
  std::string dir;
  pid_t daemon = -1;
  std::vector<pid_t> hosts;  // muonrun pids, node 0 and 1
};

absl::StatusOr<HostJob> StartHostJob(int trial) {
  HostJob job;
  absl::StatusOr<std::string> dir = MakeTempDir("hostkill-");
  if (!dir.ok()) return dir.status();
  job.dir = *dir;
  std::ofstream(job.dir + "/spec.json") << kSpec;
  const std::string port_file = job.dir + "/port";
  absl::StatusOr<pid_t> daemon = SpawnProcess(
      {"server/muon-coordinator", "--port=0", "--port_file=" + port_file,
       "--world_size=4", "--job_id=kill", "--join_timeout_s=20",
       absl::StrCat("--heartbeat_timeout_s=", kHeartbeatTimeoutS)});
  if (!daemon.ok()) return daemon.status();
  job.daemon = *daemon;
  absl::StatusOr<int> port =
      WaitForPortFile(port_file, job.daemon, absl::Seconds(30));
  if (!port.ok()) {
    kill(job.daemon, SIGKILL);
    WaitAll({job.daemon}, absl::Seconds(5));
    return port.status();
  }
  for (int h = 0; h < 2; ++h) {
    const std::string command = absl::StrCat(
        "exec tools/muonrun --nnodes=2 --node-rank=", h,
        " --nproc-per-node=2 --master-addr=127.0.0.1 --master-port=", *port,
        " --grace_s=5 tests/multihost/muon_rank --spec=", job.dir,
        "/spec.json --steps=100000000 --seed=", trial, " --out_dir=", job.dir,
        " --timeout_s=60 2>", job.dir, "/host", h, ".err");
    absl::StatusOr<pid_t> pid =
        SpawnProcess({"/bin/sh", "-c", command},
                     {absl::StrCat("MUON_COORDINATOR=127.0.0.1:", *port)});
    if (pid.ok()) job.hosts.push_back(*pid);
  }
  return job;
}

// What the survivors of killing `victim` (for kRank the rank `rank`, for
// kHost the node `rank / 2`) must say, checked on both hosts' output.
std::string CheckNamed(const HostJob& job, HostVictim victim, int rank) {
  std::string missing;
  const int dead_host = rank / 2;
  for (int h = 0; h < 2; ++h) {
    const std::string err = ReadFile(absl::StrCat(job.dir, "/host", h, ".err"));
    std::vector<std::pair<int, std::string>> want;  // (rank or -1, text)
    if (victim == HostVictim::kRank) {
      if (h == dead_host) {
        want.push_back({-1, absl::StrCat("muonrun: rank ", rank,
                                         " (local rank ", rank % 2, ", pid ")});
      }
      // Every other rank, its host's sibling too (muonrun waits for it).
      for (int r = 2 * h; r < 2 * h + 2; ++r) {
        if (r == rank) continue;
        want.push_back(
            {r, absl::StrCat("rank ", rank, " failed: its process (pid ")});
        want.push_back({r, "ended: killed by signal 9 (SIGKILL)"});
      }
    } else if (victim == HostVictim::kHost && h != dead_host) {
      for (int r = 2 * h; r < 2 * h + 2; ++r) {
        want.push_back(
            {r, absl::StrCat("ranks ", 2 * dead_host, ", ", 2 * dead_host + 1,
                             " of host \"node ", dead_host, " (")});
      }
    } else if (victim == HostVictim::kCoordinator) {
      for (int r = 2 * h; r < 2 * h + 2; ++r) {
        want.push_back({r, absl::StrCat("rank ", r,
                                        ": the coordinator has "
                                        "been unreachable")});
      }
    }
    for (const auto& [r, text] : want) {
      const bool said =
          r < 0 ? err.find(text) != std::string::npos : RankSaid(err, r, text);
      if (!said) {
        absl::StrAppend(&missing, "host ", h, (r < 0 ? "" : " rank "),
                        (r < 0 ? "" : std::to_string(r)), " did not say \"",
                        text, "\"; its output ends: ",
                        err.substr(err.size() > 800 ? err.size() - 800 : 0),
                        "\n");
      }
    }
  }
  return missing;
}

// One trial with host agents: kills `victim` `delay` after the start.
TrialResult RunHostTrial(HostVictim victim, int rank, absl::Duration delay,
                         int trial) {
  TrialResult result;
  absl::StatusOr<HostJob> job = StartHostJob(trial);
  if (!job.ok() || job->hosts.size() != 2) {
    if (job.ok()) {
      for (pid_t p : job->hosts) kill(p, SIGKILL);
      WaitAll(job->hosts, absl::Seconds(5));
      kill(job->daemon, SIGKILL);
      WaitAll({job->daemon}, absl::Seconds(5));
    }
    result.named = false;
    result.detail = "could not start the daemon or the hosts";
    return result;
  }
  absl::SleepFor(delay);
  pid_t target = job->daemon;
  if (victim == HostVictim::kRank) {
    target = ChildWithLocalRank(job->hosts[rank / 2], rank % 2);
  } else if (victim == HostVictim::kHost) {
    target = job->hosts[rank / 2];
  }
  if (target <= 0) {
    result.named = false;
    result.detail = "the victim's process was not found";
  } else {
    kill(target, SIGKILL);
  }
  const absl::Time killed = absl::Now();
  std::vector<int> codes;
  if (victim == HostVictim::kCoordinator) {
    // Training goes on: every rank says the coordinator is unreachable
    // (`seconds` is the time until the last one has; the caller bounds it
    // by 2x the heartbeat timeout) and every host still runs; then the job
    // is stopped. Polled every 50 ms for at most 2x the timeout + 3 s.
    const absl::Time give_up =
        killed + absl::Seconds(2 * kHeartbeatTimeoutS + 3.0);
    while (!CheckNamed(*job, victim, rank).empty() && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    result.seconds = absl::ToDoubleSeconds(absl::Now() - killed);
    for (pid_t host : job->hosts) {
      if (kill(host, 0) != 0) {
        result.named = false;
        absl::StrAppend(&result.detail, "a host ended with the coordinator\n");
      }
    }
    WaitAll({job->daemon}, absl::Seconds(5));
    for (pid_t host : job->hosts) kill(host, SIGTERM);
    codes = WaitAll(job->hosts, absl::Seconds(15), absl::Seconds(15));
  } else {
    std::vector<pid_t> waited = job->hosts;
    codes = WaitAll(waited, absl::Seconds(20), absl::Seconds(20));
    result.seconds = absl::ToDoubleSeconds(absl::Now() - killed);
    kill(job->daemon, SIGTERM);
    WaitAll({job->daemon}, absl::Seconds(10));
  }
  for (int code : codes) result.hang |= code == -1;
  const std::string missing = CheckNamed(*job, victim, rank);
  if (!missing.empty()) {
    result.named = false;
    absl::StrAppend(&result.detail, missing);
  }
  return result;
}

int HostTrials() {
  const char* v = std::getenv("KILL_HOST_TRIALS");
  int n = 2;
  if (v != nullptr && (!absl::SimpleAtoi(v, &n) || n < 1)) n = 2;
  return n;
}

void RunHostTrials(HostVictim victim, const char* what, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int trials = HostTrials();
  int hangs = 0, wrong = 0;
  double max_s = 0, sum_s = 0;
  for (int t = 0; t < trials; ++t) {
    const int rank = static_cast<int>(rng() % kWorld);
    const absl::Duration delay =
        absl::Milliseconds(1500 + static_cast<int>(rng() % 2000));
    const TrialResult r = RunHostTrial(victim, rank, delay, t);
    hangs += r.hang;
    wrong += !r.named;
    max_s = std::max(max_s, r.seconds);
    sum_s += r.seconds;
    std::cout << "host trial " << t << ": killed " << what;
    if (victim == HostVictim::kRank) std::cout << " (rank " << rank << ")";
    if (victim == HostVictim::kHost) std::cout << " (node " << rank / 2 << ")";
    std::cout << " after " << absl::FormatDuration(delay) << "; " << r.seconds
              << (victim == HostVictim::kCoordinator
                      ? " s until every rank said so; "
                      : " s to the end; ")
              << (r.hang ? "HANG; " : "") << (r.named ? "named" : "NOT named")
              << "\n"
              << r.detail << std::flush;
    EXPECT_FALSE(r.hang) << "trial " << t;
    EXPECT_TRUE(r.named) << "trial " << t << ": " << r.detail;
    EXPECT_LT(r.seconds, 2 * kHeartbeatTimeoutS + 1.0) << "trial " << t;
  }
  std::cout << "host kill trials (" << what << "): " << trials
            << ", hangs: " << hangs << ", not named: " << wrong
            << ", kill -> end: mean " << sum_s / trials << " s, max " << max_s
            << " s (heartbeat timeout " << kHeartbeatTimeoutS << " s)\n";
}

TEST(KillTrialsTest, HostAgents_KillRank_OtherHostNamesItAndHow) {
  RunHostTrials(HostVictim::kRank, "a rank", 31);
}

TEST(KillTrialsTest, HostAgents_KillHost_OtherHostNamesBothItsRanks) {
  RunHostTrials(HostVictim::kHost, "a host", 37);
}

TEST(KillTrialsTest, HostAgents_KillCoordinator_EveryRankSaysSoTrainingGoesOn) {
  RunHostTrials(HostVictim::kCoordinator, "the coordinator", 41);
}

TEST(KillTrialsTest, KillRandomRank_EverySurvivorNamesItNoHang) {
  const int trials = Trials();
  const char* seed_env = std::getenv("KILL_TRIALS_SEED");
  uint64_t seed = 20261122;
  if (seed_env != nullptr) (void)absl::SimpleAtoi(seed_env, &seed);
  std::mt19937_64 rng(seed);
  int hangs = 0, wrong = 0;
  double max_s = 0, sum_s = 0;
  for (int t = 0; t < trials; ++t) {
    const int victim = static_cast<int>(rng() % kWorld);
    // 1.5 to 3.5 s after the start: after the join, mid-step or between
    // steps, at a random point.
    const absl::Duration delay =
        absl::Milliseconds(1500 + static_cast<int>(rng() % 2000));
    TrialResult r = RunTrial(victim, delay, t);
    hangs += r.hang;
    wrong += !r.named;
    max_s = std::max(max_s, r.seconds);
    sum_s += r.seconds;
    std::cout << "trial " << t << ": killed rank " << victim << " after "
              << absl::FormatDuration(delay) << "; survivors exited "
              << r.seconds << " s later; " << (r.hang ? "HANG; " : "")
              << (r.named ? "named" : "NOT named") << "\n"
              << r.detail << std::flush;
    EXPECT_FALSE(r.hang) << "trial " << t;
    EXPECT_TRUE(r.named) << "trial " << t << ": " << r.detail;
    // 2x the heartbeat timeout for the error, plus process teardown.
    EXPECT_LT(r.seconds, 2 * kHeartbeatTimeoutS + 1.0) << "trial " << t;
  }
  std::cout << "kill trials: " << trials << ", hangs: " << hangs
            << ", wrong or missing rank named: " << wrong
            << ", kill -> survivors exited: mean " << sum_s / trials
            << " s, max " << max_s << " s (heartbeat timeout "
            << kHeartbeatTimeoutS << " s)\n";
}

// A frozen rank (SIGSTOP: alive, sockets open, silent): the survivors'
// blocked collectives are aborted once the coordinator marks it lost; their
// errors name it within 2x the heartbeat timeout (Gloo's own timeout here is
// 60 s).
TEST(KillTrialsTest, StopRandomRank_EverySurvivorNamesItWithinTwiceTimeout) {
  std::mt19937_64 rng(7);
  for (int t = 0; t < 3; ++t) {
    const int victim = static_cast<int>(rng() % kWorld);
    const absl::Duration delay =
        absl::Milliseconds(1500 + static_cast<int>(rng() % 2000));
    TrialResult r = RunTrial(victim, delay, t, SIGSTOP);
    std::cout << "SIGSTOP trial " << t << ": rank " << victim << " after "
              << absl::FormatDuration(delay) << "; survivors exited "
              << r.seconds << " s later; " << (r.named ? "named" : "NOT named")
              << "\n"
              << r.detail << std::flush;
    EXPECT_FALSE(r.hang) << "trial " << t;
    EXPECT_TRUE(r.named) << "trial " << t << ": " << r.detail;
    EXPECT_LT(r.seconds, 2 * kHeartbeatTimeoutS + 1.0) << "trial " << t;
  }
}

// Rank 0 embeds the coordinator (no daemon): killing it takes the
// coordinator along; the survivors find it unreachable and name rank 0
// (JoinResponse.coordinator_rank) instead of waiting out the timeout.
TEST(KillTrialsTest, KillRankHostingCoordinator_SurvivorsNameRankZero) {
  std::mt19937_64 rng(11);
  for (int t = 0; t < 2; ++t) {
    const absl::Duration delay =
        absl::Milliseconds(1500 + static_cast<int>(rng() % 2000));
    TrialResult r = RunTrial(0, delay, t, SIGKILL, /*embedded=*/true);
    std::cout << "embedded trial " << t << ": killed rank 0 after "
              << absl::FormatDuration(delay) << "; survivors exited "
              << r.seconds << " s later; " << (r.named ? "named" : "NOT named")
              << "\n"
              << r.detail << std::flush;
    EXPECT_FALSE(r.hang) << "trial " << t;
    EXPECT_TRUE(r.named) << "trial " << t << ": " << r.detail;
    EXPECT_LT(r.seconds, 10.0) << "trial " << t;  // default timeout 10 s
  }
}

TEST(KillTrialsTest, LaunchRanks_RankKilledFirst_NamedWithItsSignal) {
  absl::StatusOr<std::string> dir = MakeTempDir("launch-");
  ASSERT_TRUE(dir.ok());
  RankLaunchOptions o;
  o.world_size = 4;
  o.coordinator = "127.0.0.1:1";  // unused by these ranks
  o.timeout = absl::Seconds(20);
  o.grace = absl::Seconds(10);
  o.argv = [](int rank) -> std::vector<std::string> {
    // Rank 2 dies of SIGKILL first; the others then fail with exit 1.
    if (rank == 2) return {"/bin/sh", "-c", "sleep 0.2; kill -9 $$"};
    return {"/bin/sh", "-c", "sleep 1; exit 1"};
  };
  absl::Status s = LaunchRanks(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 2 killed by signal 9"));
}

}  // namespace
}  // namespace muon
