// A real Slurm cluster on this machine, from Debian's packages: munged, slurmctld and two
// slurmd, each slurmd in a network namespace of its own behind a bridge that slurmctld's
// namespace owns, so that the nodes have distinct addresses. The jobs go through sbatch
// --wait: deploy/slurm/muster.sbatch running a Gloo job on two nodes, a failing rank, a
// preemption notice (USR1, from scancel and from sbatch --signal) reaching every worker, and
// launch reading the allocation itself.
//
// Every address lives inside the namespaces made here; the clients (sbatch, scontrol,
// scancel) run in slurmctld's namespace. Node names do not resolve: Slurm's NodeAddr does.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "tests/support/child.h"
#include "tests/support/programs.h"
#include "tests/support/netns.h"

namespace muster {
namespace {

using testing::buildDir;
using testing::launchPath;
using testing::workerPath;
using testing::sourceDir;
using testing::Child;
namespace fs = std::filesystem;
using std::chrono::milliseconds;

bool onPath(const std::string& name) {
  for (const char* dir : {"/usr/sbin", "/usr/bin", "/sbin", "/bin"}) {
    if (access((std::string(dir) + "/" + name).c_str(), X_OK) == 0) return true;
  }
  return false;
}

std::string readText(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string tail(const fs::path& p, size_t chars = 2000) {
  std::string t = readText(p);
  return t.size() > chars ? t.substr(t.size() - chars) : t;
}

// One word for /bin/sh.
std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

struct JobResult {
  int code = -1;
  std::string id;
  std::string output;  // the job's own output file
  std::string sbatch;  // what sbatch printed
};

// The cluster, shared by every test of the suite (started once, stopped once).
class Cluster {
 public:
  std::string skip;  // non-empty: why the tests cannot run here
  std::string failure;

  void start() {
    if (geteuid() != 0) {
      skip = "a Slurm cluster with network namespaces needs root";
      return;
    }
    for (const char* tool : {"munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel",
                             "sinfo", "nsenter", "ip"}) {
      if (!onPath(tool)) {
        skip = std::string(tool) +
               " is not installed (deploy/setup.sh installs slurm-wlm and munge)";
        return;
      }
    }
    started = true;
    subnet = net.subnet();
    dir = fs::temp_directory_path() / ("muster-slurm-" + std::to_string(getpid()));
    fs::remove_all(dir);
    for (const char* sub : {"sock", "key", "state", "spool", "shared", "out"}) {
      fs::create_directories(dir / sub);
    }
    fs::permissions(dir, fs::perms(0755));
    fs::permissions(dir / "sock", fs::perms(0755));  // munged: the socket's folder is 755
    fs::permissions(dir / "key", fs::perms(0700));
    {
      std::random_device rd;
      std::ofstream key(dir / "key" / "munge.key", std::ios::binary);
      for (int i = 0; i < 1024; ++i) key.put(static_cast<char>(rd() & 0xff));
    }
    fs::permissions(dir / "key" / "munge.key", fs::perms(0600));

    if (!net.create(/*bridgeHasAddress=*/true)) {
      skip = "cannot create network namespaces here";
      return;
    }
    writeConf();

    munged = daemon("munged", {"/usr/sbin/munged", "-F", "--key-file=" + (dir / "key/munge.key").string(),
                               "--socket=" + socket(), "--pid-file=" + (dir / "key/munged.pid").string(),
                               "--log-file=" + (dir / "key/munged.log").string(),
                               "--seed-file=" + (dir / "key/munged.seed").string()});
    if (!waitFor([&] { return fs::exists(socket()); }, milliseconds(10000))) {
      failure = "munged did not come up: " + tail(dir / "munged.out");
      return;
    }
    slurmctld = daemon("slurmctld", {"/usr/bin/nsenter", "--net=" + netns("br"), "--",
                                     "/usr/sbin/slurmctld", "-D", "-f", conf()});
    for (int n = 1; n <= 2; ++n) {
      std::string node = "n" + std::to_string(n);
      fs::create_directories(dir / "spool" / node);
      slurmd.push_back(daemon("slurmd-" + node, {"/usr/bin/nsenter", "--net=" + netns("h" + std::to_string(n)),
                                                 "--", "/usr/sbin/slurmd", "-D", "-N", node, "-f", conf()}));
    }
    // Both nodes idle: slurmctld is up and both slurmd registered.
    bool idle = waitFor(
        [&] {
          std::string out;
          client({"sinfo", "-h", "-N", "-o", "%N=%t"}, &out);
          return out.find("n1=idle") != std::string::npos && out.find("n2=idle") != std::string::npos;
        },
        milliseconds(30000));
    if (!idle) {
      failure = "the nodes never became idle.\nslurmctld: " + tail(dir / "slurmctld.log") +
                "\nslurmd n1: " + tail(dir / "slurmd.n1.log");
    }
  }

  void stop() {
    if (!started) return;
    if (slurmctld) client({"scancel", "--user=root"}, nullptr);
    // Daemons by pid: SIGTERM, then SIGKILL after 10 s.
    for (auto& c : slurmd) terminate(*c);
    slurmd.clear();
    if (slurmctld) terminate(*slurmctld);
    slurmctld.reset();
    if (munged) terminate(*munged);
    munged.reset();
    // What Slurm left in the namespaces made here (a step daemon of a job cut short) dies
    // with them.
    net.remove();
    std::error_code ec;
    fs::remove_all(dir, ec);
  }

  // Runs a Slurm client command in slurmctld's namespace; returns its exit code.
  int client(const std::vector<std::string>& args, std::string* out,
             milliseconds timeout = milliseconds(30000)) {
    std::vector<std::string> argv{"/usr/bin/nsenter", "--net=" + netns("br"), "--"};
    argv.insert(argv.end(), args.begin(), args.end());
    Child c(argv, {"SLURM_CONF=" + conf()});
    auto e = c.wait(timeout);
    if (!e) return -1;
    if (out != nullptr) *out = c.stdoutText() + c.stderrText();
    return e->code;
  }

  // sbatch --wait SCRIPT ARGS from the test's folder (the submit directory), env added.
  JobResult sbatch(const std::vector<std::string>& scriptAndArgs, const std::vector<std::string>& env,
                   milliseconds timeout = milliseconds(180000)) {
    std::string cmd = "cd " + dir.string() + " && exec /usr/bin/nsenter --net=" + netns("br") +
                      " -- sbatch --wait --output=" + (dir / "out" / "job-%j.out").string();
    for (const auto& a : scriptAndArgs) cmd += " " + quote(a);
    std::vector<std::string> fullEnv{"SLURM_CONF=" + conf()};
    fullEnv.insert(fullEnv.end(), env.begin(), env.end());
    Child c({"/bin/sh", "-c", cmd}, fullEnv);
    JobResult r;
    auto e = c.wait(timeout);
    r.sbatch = c.stdoutText() + c.stderrText();
    if (!e) {
      c.kill(SIGKILL);
      r.sbatch += "\n(sbatch --wait did not return)";
      return r;
    }
    r.code = e->code;
    std::smatch m;
    if (std::regex_search(r.sbatch, m, std::regex("Submitted batch job (\\d+)"))) {
      r.id = m[1];
      r.output = readText(dir / "out" / ("job-" + r.id + ".out"));
    }
    return r;
  }

  std::string conf() const { return (dir / "slurm.conf").string(); }
  std::string socket() const { return (dir / "sock" / "munge.sock").string(); }
  std::string netns(const std::string& name) const {
    return name == "br" ? net.bridgePath() : net.path(std::stoi(name.substr(1)));
  }

  testing::NetnsNetwork net{"sl", 215};
  bool started = false;
  std::string subnet;
  fs::path dir;

 private:
  void writeConf() {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    std::string shortHost = host;
    shortHost = shortHost.substr(0, shortHost.find('.'));
    std::string d = dir.string();
    std::ofstream(conf())
        << "ClusterName=muster\n"
        << "SlurmctldHost=" << shortHost << "(" << net.address(254) << ")\n"
        << "SlurmctldPort=6817\n"
        << "AuthType=auth/munge\nCredType=cred/munge\n"
        // A requeued job waits cred_expire (default 120 s) before it runs again.
        << "AuthInfo=socket=" << socket() << ",cred_expire=10\n"
        << "SlurmUser=root\nSlurmdUser=root\n"
        << "StateSaveLocation=" << d << "/state\n"
        << "SlurmdSpoolDir=" << d << "/spool/%n\n"
        << "SlurmctldPidFile=" << d << "/slurmctld.pid\n"
        << "SlurmdPidFile=" << d << "/slurmd.%n.pid\n"
        << "SlurmctldLogFile=" << d << "/slurmctld.log\n"
        << "SlurmdLogFile=" << d << "/slurmd.%n.log\n"
        // Slurm signals a task's process group only: what reaches launch's workers, launch
        // itself passed on (each worker runs in a process group of its own).
        << "ProctrackType=proctrack/pgid\n"
        << "TaskPlugin=task/none\n"
        << "JobAcctGatherType=jobacct_gather/none\n"
        << "AccountingStorageType=accounting_storage/none\n"
        << "JobCompType=jobcomp/none\n"
        << "SchedulerType=sched/builtin\nSelectType=select/linear\n"
        << "MpiDefault=none\nReturnToService=2\nKillWait=5\n"
        // sbatch --wait polls every 2 s while MinJobAge / 2 <= 2 (else 8 s, then 32 s); a
        // finished job stays visible for 5 s, more than one poll.
        << "MinJobAge=5\nSlurmdTimeout=60\n"
        << "NodeName=n1 NodeAddr=" << subnet << ".1 Port=6818 CPUs=2 State=UNKNOWN\n"
        << "NodeName=n2 NodeAddr=" << subnet << ".2 Port=6819 CPUs=2 State=UNKNOWN\n"
        << "PartitionName=main Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP\n";
  }

  // Starts a daemon in the foreground, its output in <dir>/<name>.out; the pid is the daemon's
  // (sh and nsenter exec it).
  std::unique_ptr<Child> daemon(const std::string& name, const std::vector<std::string>& argv) {
    std::string cmd = "exec";
    for (const auto& a : argv) cmd += " " + quote(a);
    cmd += " >" + (dir / (name + ".out")).string() + " 2>&1";
    return std::make_unique<Child>(std::vector<std::string>{"/bin/sh", "-c", cmd},
                                   std::vector<std::string>{"SLURM_CONF=" + conf()});
  }

  static void terminate(Child& c) {
    c.kill(SIGTERM);
    if (!c.wait(milliseconds(10000))) {
      c.kill(SIGKILL);
      c.wait(milliseconds(5000));
    }
  }

  template <typename F>
  static bool waitFor(F ready, milliseconds timeout) {
    auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      if (ready()) return true;
      std::this_thread::sleep_for(milliseconds(200));
    }
    return ready();
  }

  std::unique_ptr<Child> munged, slurmctld;
  std::vector<std::unique_ptr<Child>> slurmd;
};

class Slurm : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cluster_ = new Cluster();
    cluster_->start();
  }
  static void TearDownTestSuite() {
    cluster_->stop();
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override {
    if (!cluster_->skip.empty()) GTEST_SKIP() << cluster_->skip;
    ASSERT_TRUE(cluster_->failure.empty()) << cluster_->failure;
  }

  std::string script(const std::string& name, const std::string& body) {
    fs::path p = cluster_->dir / name;
    std::ofstream(p) << "#!/bin/bash\n" << body;
    chmod(p.c_str(), 0755);
    return p.string();
  }
  std::vector<std::string> deployEnv() {
    return {"MUSTER_LAUNCH=" + launchPath(), "MUSTER_NPROC_PER_NODE=2",
            "MUSTER_SHARED_DIR=" + (cluster_->dir / "shared").string()};
  }
  std::string deployScript() { return sourceDir() + "/deploy/slurm/muster.sbatch"; }
  // A worker that says it is ready (with the job id) and, on SIGUSR1, notes it and exits 0 as
  // a checkpointing program would.
  std::string noticeProgram(const fs::path& marks) {
    fs::create_directories(marks);
    return script("notice.sh", "trap 'echo \"rank $RANK got USR1\" > " + marks.string() +
                                   "/usr1-$RANK; exit 0' USR1\n"
                                   "echo $SLURM_JOB_ID > " + marks.string() + "/ready-$RANK.tmp\n"
                                   "mv " + marks.string() + "/ready-$RANK.tmp " + marks.string() +
                                   "/ready-$RANK\n"
                                   "while true; do sleep 0.1; done\n");
  }
  // How many times launch logged passing `signal` on.
  static size_t forwards(const std::string& output, const std::string& signal) {
    size_t n = 0;
    std::string line = "launch got " + signal + "; forwarding it to the workers";
    for (size_t at = 0; (at = output.find(line, at)) != std::string::npos; ++at) ++n;
    return n;
  }
  static std::string worker() { return workerPath(); }

  static Cluster* cluster_;
};
Cluster* Slurm::cluster_ = nullptr;

TEST_F(Slurm, DeployScriptRunsAGlooJobOnTwoNodes) {
  auto job = cluster_->sbatch({deployScript(), worker(), "--timeout=60"}, deployEnv());
  ASSERT_EQ(job.code, 0) << job.sbatch << job.output;
  EXPECT_NE(job.output.find("self-check passed: 4 rank(s), gloo"), std::string::npos) << job.output;
  // Two ranks on each node, and node 0 found at its NodeAddr.
  EXPECT_NE(job.output.find("(local 0/2, node 1/2)"), std::string::npos) << job.output;
  EXPECT_NE(job.output.find("node 0 is n1 at " + cluster_->subnet + ".1:"), std::string::npos) << job.output;
  EXPECT_NE(job.output.find("workers' store at " + cluster_->subnet + ".1:"), std::string::npos) << job.output;
  // The job's files in the shared directory are gone after success.
  EXPECT_FALSE(fs::exists(cluster_->dir / "shared" / job.id)) << job.output;
}

TEST_F(Slurm, AFailingRankFailsTheJobAndSbatch) {
  auto job = cluster_->sbatch({deployScript(), "/bin/bash", "-c", "[ \"$RANK\" = 3 ] && exit 3; exec sleep 60"},
                              deployEnv());
  EXPECT_NE(job.code, 0) << job.sbatch << job.output;
  EXPECT_NE(job.output.find("rank 3 (local_rank 1, pid "), std::string::npos) << job.output;
  EXPECT_NE(job.output.find("exited with code 3"), std::string::npos) << job.output;
  // The other node heard of it through the rendezvous, not by timing out.
  EXPECT_NE(job.output.find("the job failed: node " + cluster_->subnet + ".2 (group rank 1) failed: rank 3"),
            std::string::npos)
      << job.output;
}

TEST_F(Slurm, APreemptionNoticeReachesEveryWorker) {
  fs::path marks = cluster_->dir / "marks";
  std::string notice = noticeProgram(marks);
  JobResult job;
  std::thread submit([&] { job = cluster_->sbatch({deployScript(), notice}, deployEnv()); });
  auto readyCount = [&] {
    int n = 0;
    for (int r = 0; r < 4; ++r) n += fs::exists(marks / ("ready-" + std::to_string(r)));
    return n;
  };
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (readyCount() < 4 && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(milliseconds(100));
  }
  int ready = readyCount();
  std::string id = ready > 0 ? readText(marks / "ready-0") : "";
  id.erase(id.find_last_not_of(" \n") + 1);
  std::string out;
  if (ready == 4) {
    // What --signal=USR1@120 does before the time limit: slurmctld signals every step's tasks.
    EXPECT_EQ(cluster_->client({"scancel", "--signal=USR1", id}, &out), 0) << out;
  } else {
    cluster_->client({"scancel", id}, &out);
  }
  submit.join();
  ASSERT_EQ(ready, 4) << job.sbatch << job.output;
  EXPECT_EQ(job.code, 0) << job.sbatch << job.output;
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(readText(marks / ("usr1-" + std::to_string(r))), "rank " + std::to_string(r) + " got USR1\n");
  }
  // Slurm signalled launch's process group only (proctrack/pgid): launch passed it on.
  EXPECT_EQ(forwards(job.output, "SIGUSR1"), 2u) << job.output;
}

TEST_F(Slurm, TheTimeLimitNoticeComesFromSbatchSignal) {
  // A one-minute limit with USR1 58 s before it: slurmctld sends the notice at its next
  // time-limit pass (every 30 s), long before the limit itself.
  fs::path marks = cluster_->dir / "limit-marks";
  auto job = cluster_->sbatch({"--time=1", "--signal=USR1@58", deployScript(), noticeProgram(marks)}, deployEnv());
  EXPECT_EQ(job.code, 0) << job.sbatch << job.output;
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(readText(marks / ("usr1-" + std::to_string(r))), "rank " + std::to_string(r) + " got USR1\n");
  }
  EXPECT_EQ(forwards(job.output, "SIGUSR1"), 2u) << job.output;
}

// The coordinated stop under Slurm: tests/python/stop_worker.py in "resume" mode, four ranks on
// two nodes looping until told to stop, and on a resumed start running 20 steps on and ending.
std::vector<std::string> stopWorker(const fs::path& marks) {
  fs::create_directories(marks);
  return {"/usr/bin/python3", sourceDir() + "/tests/python/stop_worker.py", "resume", marks.string(), "0.01"};
}

// Each rank's "<stop step> <steps it was told False>" (.stop) and what it resumed from (.resumed).
std::string stopsOf(const fs::path& marks) {
  std::string all;
  for (int r = 0; r < 4; ++r) all += std::to_string(r) + ":" + readText(marks / (std::to_string(r) + ".stop")) + " ";
  return all;
}

TEST_F(Slurm, TheBatchShellsTimeLimitNoticeStopsEveryRankAtOneStepAndTheRequeuedJobResumes) {
  // --signal=B:USR1@50 with a one-minute limit: slurmctld signals the batch shell at its first
  // time-limit pass under 50 s left; muster.sbatch passes it to srun, srun to both launches.
  fs::path marks = cluster_->dir / "requeue-marks";
  auto program = stopWorker(marks);
  std::vector<std::string> args{"--time=1", "--signal=B:USR1@50", "--requeue", "--open-mode=append", deployScript()};
  args.insert(args.end(), program.begin(), program.end());
  auto env = deployEnv();
  env.push_back("MUSTER_LAUNCH_ARGS=--no_python --requeue --stop_timeout=40");
  env.push_back("PYTHONPATH=" + sourceDir() + "/python");
  auto job = cluster_->sbatch(args, env, milliseconds(300000));
  ASSERT_EQ(job.code, 0) << job.sbatch << job.output;
  // The first run: one stop step for all four ranks, each told False at every step before it.
  std::regex stopLine("(\\d+) (\\d+)");
  std::set<std::string> steps;
  for (int r = 0; r < 4; ++r) {
    std::string text = readText(marks / (std::to_string(r) + ".stop"));
    std::smatch m;
    ASSERT_TRUE(std::regex_match(text, m, stopLine)) << "rank " << r << ": '" << text << "'\n" << job.output;
    EXPECT_EQ(m[1], m[2]) << "rank " << r << " was told False at a step past its stop: " << text;
    steps.insert(m[1]);
  }
  ASSERT_EQ(steps.size(), 1u) << stopsOf(marks) << job.output;
  std::string step = *steps.begin();
  EXPECT_NE(job.output.find("muster: the batch shell got SIGUSR1; passing it to srun"), std::string::npos) << job.output;
  EXPECT_NE(job.output.find("stopped at step " + step + " on request (SIGUSR1); 2 of 2 ranks stopped cleanly"),
            std::string::npos) << job.output;
  EXPECT_NE(job.output.find("launch: requeued Slurm job " + job.id + " (--requeue)"), std::string::npos) << job.output;
  // The second run: every rank was given the step, ran 20 more and ended; the record is gone.
  for (int r = 0; r < 4; ++r) EXPECT_EQ(readText(marks / (std::to_string(r) + ".resumed")), step) << "rank " << r;
  EXPECT_NE(job.output.find("resumes: it stopped at step " + step + " on request (SIGUSR1)"), std::string::npos)
      << job.output;
  EXPECT_FALSE(fs::exists(cluster_->dir / "shared" / (".muster-stopped-" + job.id + ".json")));
}

TEST_F(Slurm, StopAtTheJobsEndLessAMarginStopsEveryRankAtOneStep) {
  // --time=1 and --stop_at=slurm-50: launch asks squeue for the end and stops about 10 s in.
  fs::path marks = cluster_->dir / "stop-at-marks";
  auto program = stopWorker(marks);
  std::vector<std::string> args{"--time=1", deployScript()};
  args.insert(args.end(), program.begin(), program.end());
  auto env = deployEnv();
  env.push_back("MUSTER_LAUNCH_ARGS=--no_python --stop_at=slurm-50");
  env.push_back("PYTHONPATH=" + sourceDir() + "/python");
  auto job = cluster_->sbatch(args, env);
  EXPECT_EQ(job.code, 75) << job.sbatch << job.output;  // stopped on request: neither success nor failure
  std::set<std::string> steps;
  for (int r = 0; r < 4; ++r) steps.insert(readText(marks / (std::to_string(r) + ".stop")));
  EXPECT_EQ(steps.size(), 1u) << stopsOf(marks);
  EXPECT_EQ(steps.count(""), 0u) << stopsOf(marks) << job.output;
  EXPECT_NE(job.output.find("(the Slurm job's end less 50 s) (--stop_at)"), std::string::npos) << job.output;
  EXPECT_NE(job.output.find("on request (--stop_at); 2 of 2 ranks stopped cleanly"), std::string::npos) << job.output;
}

TEST_F(Slurm, LaunchReadsTheAllocationWhenItsFlagsAreAbsent) {
  // No --nnodes, --node_rank, --master_addr, --master_port, --rdzv_id or --shared_dir.
  std::string batch = script("plain.sbatch", "#SBATCH --nodes=2\nsrun --ntasks-per-node=1 " + buildDir() +
                                                 "/launcher/launch --nproc_per_node=2 " + worker() +
                                                 " --timeout=60\n");
  auto job = cluster_->sbatch({batch}, {});
  ASSERT_EQ(job.code, 0) << job.sbatch << job.output;
  EXPECT_NE(job.output.find("self-check passed: 4 rank(s), gloo"), std::string::npos) << job.output;
  for (int node = 0; node < 2; ++node) {
    std::string line = "inside Slurm job " + job.id + ": took --nnodes=2 --node_rank=" + std::to_string(node) +
                       " --master_addr=n1 --master_port=" + std::to_string(29500 + std::stoi(job.id) % 1000) +
                       " --shared_dir=" + (cluster_->dir / ".muster-shared").string() + " --rdzv_id=" + job.id +
                       " (n1's NodeAddr: " + cluster_->subnet + ".1)";
    EXPECT_NE(job.output.find(line), std::string::npos) << line << "\n" << job.output;
  }
  // Explicit flags win, and two launches per node are refused with one line.
  std::string twoPerNode = script("two.sbatch", "#SBATCH --nodes=2\nsrun --ntasks-per-node=2 " + buildDir() +
                                                    "/launcher/launch " + worker() + "\n");
  auto bad = cluster_->sbatch({twoPerNode}, {});
  EXPECT_NE(bad.code, 0) << bad.output;
  EXPECT_NE(bad.output.find("launch runs once per node"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace muster
