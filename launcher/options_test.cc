// launch's flag parsing: both spellings, = and space, PET_* defaults, the program boundary,
// torch.distributed.launch's switch, and one clear error for bad input.
#include "launcher/numa.h"
#include "launcher/devices.h"
#include "launcher/options.h"
#include "launcher/slurm.h"
#include "launcher/worker_command.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

namespace muster::launcher {
namespace {

using Env = std::map<std::string, std::string>;

LaunchOptions parse(const std::vector<std::string>& args, const Env& env = {}) {
  auto o = parseLaunchOptions(args, env);
  EXPECT_TRUE(o.ok()) << o.status();
  return o.ok() ? *o : LaunchOptions{};
}

std::string error(const std::vector<std::string>& args, const Env& env = {}) {
  auto o = parseLaunchOptions(args, env);
  EXPECT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(o.status().message());
}

TEST(LaunchOptions, BothSpellingsAndBothValueForms) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--nproc_per_node=4", "--master_port", "1234", "--master-addr=10.0.0.1", "p"},
           {"--nproc-per-node", "4", "--master-port=1234", "--master_addr", "10.0.0.1", "p"}}) {
    auto o = parse(args);
    EXPECT_EQ(o.localWorldSize, 4);
    EXPECT_EQ(o.masterPort, 1234);
    EXPECT_EQ(o.masterAddr, "10.0.0.1");
    EXPECT_EQ(o.program, "p");
  }
}

// torchrun 2.14's defaults (launch's): one node with neither a port nor an endpoint is
// --standalone, the c10d rendezvous on a free port; a port given, by flag, PET_MASTER_PORT or
// Slurm, keeps the static rendezvous, as do several nodes and a node rank.
TEST(LaunchOptions, OneNodeWithoutAPortIsStandaloneAsInTorchrun214) {
  auto o = parse({"train.py"});
  EXPECT_TRUE(o.standalone);
  EXPECT_EQ(o.rdzvBackend, "c10d");
  EXPECT_EQ(o.torchrun.str(), "2.14");
  EXPECT_FALSE(parse({"--master_port=29500", "train.py"}).standalone);
  EXPECT_FALSE(parse({"train.py"}, {{"PET_MASTER_PORT", "29501"}}).standalone);
  EXPECT_FALSE(parse({"--nnodes=2", "train.py"}).standalone);
  EXPECT_FALSE(parse({"--rdzv_endpoint=localhost:29400", "train.py"}).standalone);
  EXPECT_FALSE(parse({"--torchrun_version=2.6", "train.py"}).standalone);
  EXPECT_FALSE(parse({"--legacy_launch=1.13", "train.py"}).standalone);
  EXPECT_EQ(parse({"--legacy_launch=1.13", "train.py"}).torchrun.str(), "1.13");
  EXPECT_EQ(parse({"--legacy_launch=1.13", "--torchrun_version=2.14", "train.py"}).torchrun.str(), "2.14");
  EXPECT_EQ(parse({"train.py"}, {{"MUSTER_TORCHRUN_VERSION", "1.13.0a0"}}).torchrun.str(), "1.13");
  // A version of 100 KB was a stack overflow in std::regex (SIGSEGV); now one line.
  std::string huge = "2.6.0+" + std::string(100000, 'a');
  std::string said = error({"train.py"}, {{"MUSTER_TORCHRUN_VERSION", huge}});
  EXPECT_NE(said.find("100006 characters; a torch version is at most 128"), std::string::npos) << said;
  EXPECT_LT(said.size(), 400u) << said;
  EXPECT_NE(error({"--torchrun_version=2." + std::string(100000, '1'), "train.py"}).find("at most 128"), std::string::npos);
}

TEST(LaunchOptions, DefaultsAreTorchrunsDefaults) {
  auto o = parse({"--torchrun_version=2.6", "train.py"});
  EXPECT_EQ(o.minNodes, 1);
  EXPECT_EQ(o.maxNodes, 1);
  EXPECT_EQ(o.localWorldSize, 1);
  EXPECT_EQ(o.rdzvBackend, "static");
  EXPECT_EQ(o.rdzvId, "none");
  EXPECT_EQ(o.masterAddr, "127.0.0.1");
  EXPECT_EQ(o.masterPort, 29500);
  EXPECT_EQ(o.role, "default");
  EXPECT_EQ(o.maxRestarts, 0);
  EXPECT_EQ(o.gracePeriodS, 30);
}

TEST(LaunchOptions, EverythingAfterTheProgramIsItsOwn) {
  auto o = parse({"--nproc_per_node=2", "train.py", "--nproc_per_node=8", "--bogus", "-m", "x"});
  EXPECT_EQ(o.localWorldSize, 2);
  EXPECT_EQ(o.program, "train.py");
  EXPECT_EQ(o.programArgs,
            (std::vector<std::string>{"--nproc_per_node=8", "--bogus", "-m", "x"}));
  auto dashed = parse({"--", "-weird-name", "a"});
  EXPECT_EQ(dashed.program, "-weird-name");
}

TEST(LaunchOptions, VersionBeforeTheProgramIsLaunchsOwn) {
  auto o = parseLaunchFlags({"--nproc_per_node=2", "--version"}, {});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->showVersion);
  // Nothing after it is read: a bad flag there is no error.
  o = parseLaunchFlags({"--version", "--bogus"}, {});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->showVersion);
  auto program = parse({"train.py", "--version"});
  EXPECT_FALSE(program.showVersion);
  EXPECT_EQ(program.programArgs, (std::vector<std::string>{"--version"}));
}

TEST(LaunchOptions, PetVariablesAreDefaultsThatFlagsOverride) {
  Env env{{"PET_NPROC_PER_NODE", "3"}, {"PET_MASTER_PORT", "4000"}, {"PET_NO_PYTHON", "1"},
          {"PET_MODULE", "0"}};
  auto o = parse({"prog"}, env);
  EXPECT_EQ(o.localWorldSize, 3);
  EXPECT_EQ(o.masterPort, 4000);
  EXPECT_TRUE(o.noPython);
  EXPECT_FALSE(o.module);
  EXPECT_EQ(parse({"--nproc_per_node=5", "prog"}, env).localWorldSize, 5);
  EXPECT_NE(error({"prog"}, {{"PET_MAX_RESTARTS", "x"}}).find("PET_MAX_RESTARTS=x"),
            std::string::npos);
}

// gpu and auto on hosts of each kind: devices_test.cc.
TEST(LaunchOptions, NprocPerNodeCpuGpuAuto) {
  EXPECT_EQ(parse({"--nproc_per_node=cpu", "p"}).localWorldSize, countCpus());
  Env none{{"CUDA_VISIBLE_DEVICES", ""}};
  EXPECT_NE(error({"--nproc_per_node=gpu", "p"}, none).find("CUDA shows no GPU here (CUDA_VISIBLE_DEVICES is empty)"),
            std::string::npos);
  EXPECT_EQ(parse({"--nproc_per_node=auto", "p"}, none).localWorldSize, countCpus());
}

TEST(LaunchOptions, RedirectsTeeAndFilter) {
  auto o = parse({"-r", "3", "--tee=0:1,1:2", "--local-ranks-filter=0,2", "p"});
  EXPECT_TRUE(o.redirectFor(5).out);
  EXPECT_TRUE(o.redirectFor(5).err);
  EXPECT_TRUE(o.teeFor(0).out);
  EXPECT_FALSE(o.teeFor(0).err);
  EXPECT_TRUE(o.teeFor(1).err);
  EXPECT_FALSE(o.teeFor(2).out);
  EXPECT_TRUE(o.consoleShows(2));
  EXPECT_FALSE(o.consoleShows(1));
}

TEST(LaunchOptions, StandaloneAndElasticSettings) {
  auto o = parse({"--standalone", "--nproc_per_node=2", "p"});
  EXPECT_EQ(o.rdzvBackend, "c10d");
  auto e = parse({"--nnodes=2:4", "--rdzv_backend=c10d", "--rdzv_endpoint=h:1",
                  "--rdzv_conf=join_timeout=5,last_call_timeout=1", "p"});
  EXPECT_EQ(e.minNodes, 2);
  EXPECT_EQ(e.maxNodes, 4);
  EXPECT_EQ(e.rdzvConf.joinTimeout, muster::Millis(5000));
  EXPECT_EQ(e.rdzvConf.lastCall, muster::Millis(1000));
  EXPECT_EQ(e.rdzvConf.given.at("join_timeout"), "5");
}

// --rdzv_conf is typed at parse time: a bad value is one line before anything starts (it was
// found only when the rendezvous began, and keep_alive_max_attempt went through atoi).
TEST(LaunchOptions, RdzvConfValuesAreCheckedAtParseTime) {
  auto o = parse({"--rdzv_conf=keep_alive_interval=0.5,keep_alive_max_attempt=4,is_host=yes,custom=x", "p"});
  EXPECT_EQ(o.rdzvConf.keepAliveInterval, muster::Millis(500));
  EXPECT_EQ(o.rdzvConf.keepAliveMaxAttempt, 4);
  EXPECT_EQ(o.rdzvConf.isHost, true);
  EXPECT_EQ(o.rdzvConf.given.at("custom"), "x");
  EXPECT_FALSE(parse({"p"}).rdzvConf.isHost.has_value());
  EXPECT_NE(error({"--rdzv_conf=join_timeout=x", "p"}).find("--rdzv_conf join_timeout=x is invalid; expected seconds > 0"),
            std::string::npos);
  EXPECT_NE(error({"--rdzv_conf=last_call_timeout=-1", "p"}).find("last_call_timeout=-1 is invalid"), std::string::npos);
  EXPECT_NE(error({"--rdzv_conf=keep_alive_max_attempt=2x", "p"}).find("keep_alive_max_attempt=2x is invalid"),
            std::string::npos);
  EXPECT_NE(error({"--rdzv_conf=is_host=maybe", "p"}).find("is_host=maybe is invalid"), std::string::npos);
  EXPECT_NE(error({"p"}, {{"PET_RDZV_CONF", "join_timeout=inf"}}).find("join_timeout=inf is invalid"),
            std::string::npos);
}

// A prefix of one flag's names is that flag, as torchrun's argparse (allow_abbrev) takes it:
// PyTorch's own test_capture_logs_using_default_logs_specs passes --redirect=3, which launch
// refused as an unknown flag. A prefix of several flags is ambiguous, naming them.
TEST(LaunchOptions, AUniquePrefixOfAFlagIsThatFlag) {
  auto o = parse({"--redirect=3", "--nproc-per=2", "--max_r", "4", "p"});
  EXPECT_TRUE(o.redirects.at(-1).out && o.redirects.at(-1).err);
  EXPECT_EQ(o.localWorldSize, 2);
  EXPECT_EQ(o.maxRestarts, 4);
  EXPECT_TRUE(parse({"--no_pyth", "p"}).noPython);
  auto e = error({"--ma=1", "p"});
  EXPECT_NE(e.find("ambiguous flag --ma: it could be "), std::string::npos) << e;
  EXPECT_NE(e.find("--master_addr, --master-addr"), std::string::npos) << e;
  EXPECT_NE(e.find("--max_restarts"), std::string::npos) << e;
  EXPECT_NE(error({"--nproc_per_nodes=2", "p"}).find("unknown flag --nproc_per_nodes"), std::string::npos);
}

// --rdzv_conf as torchrun reads it (torch.distributed.elastic.rendezvous.utils, whose tests
// elastic_parity.py runs against launch): spaces are not the keys' or values', blank is no
// pair, and a key without a value is refused (both were taken, and " join_timeout = x " was a
// key launch did not know, silently).
TEST(LaunchOptions, RdzvConfIsReadAsTorchrunReadsIt) {
  auto o = parse({"--rdzv_conf= join_timeout = 7 , custom= a b ", "p"});
  EXPECT_EQ(o.rdzvConf.joinTimeout, muster::Millis(7000));
  EXPECT_EQ(o.rdzvConf.given.at("custom"), "a b");
  EXPECT_TRUE(parse({"--rdzv_conf=   ", "p"}).rdzvConf.given.empty());
  EXPECT_EQ(parse({"--rdzv_conf=k=1,k=2", "p"}).rdzvConf.given.at("k"), "2");
  EXPECT_NE(error({"--rdzv_conf= join_timeout = x ", "p"}).find("join_timeout=x is invalid; expected seconds > 0"),
            std::string::npos);
  EXPECT_NE(error({"--rdzv_conf=a=", "p"}).find("--rdzv_conf=a= is invalid: 'a' has no value"), std::string::npos);
  EXPECT_NE(error({"--rdzv_conf=a", "p"}).find("'a' has no value"), std::string::npos);
  EXPECT_NE(error({"--rdzv_conf=a=1,,b=2", "p"}).find("expected KEY=VALUE pairs separated by commas"),
            std::string::npos);
  EXPECT_NE(error({"--rdzv_conf= =1", "p"}).find("expected KEY=VALUE pairs separated by commas"), std::string::npos);
}

// Flags of current torchrun (torch/distributed/run.py on PyTorch's main branch).
TEST(LaunchOptions, CurrentTorchrunFlags) {
  auto o = parse({"--signals-to-handle=SIGTERM, SIGUSR1", "--shutdown-timeout=7",
                  "--virtual-local-rank", "--event-log-handler=console",
                  "--duplicate-stdout-filters=loss,,acc,step", "--duplicate_stderr_filters=",
                  "--log-line-prefix-template=${rank}: ", "p"});
  EXPECT_EQ(o.stopSignals, (std::vector<int>{SIGTERM, SIGUSR1}));
  EXPECT_EQ(o.gracePeriodS, 7);
  EXPECT_TRUE(o.virtualLocalRank);
  EXPECT_EQ(o.eventLogHandler, "console");
  EXPECT_EQ(o.duplicateStdoutFilters, (std::vector<std::string>{"loss,acc", "step"}));
  EXPECT_EQ(o.duplicateStderrFilters, (std::vector<std::string>{""})) << "'' copies every line";
  EXPECT_FALSE(o.duplicateStderrFilters.empty()) << "given, so on";
  EXPECT_EQ(o.logLinePrefixTemplate, "${rank}: ");
  // Defaults, and torch's own environment variables below PET_* and the flags.
  auto d = parse({"p"});
  EXPECT_EQ(d.stopSignals, (std::vector<int>{SIGTERM, SIGINT, SIGHUP, SIGQUIT}));
  EXPECT_EQ(d.gracePeriodS, 30);
  EXPECT_TRUE(d.duplicateStdoutFilters.empty()) << "not given, so off";
  EXPECT_EQ(parse({"p"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "12"}}).gracePeriodS, 12);
  EXPECT_EQ(parse({"p"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "12"}, {"PET_SHUTDOWN_TIMEOUT", "3"}})
                .gracePeriodS, 3);
  EXPECT_EQ(parse({"--shutdown_timeout=1", "p"}, {{"PET_SHUTDOWN_TIMEOUT", "3"}}).gracePeriodS, 1);
  EXPECT_EQ(parse({"p"}, {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[${role_name}]"}})
                .logLinePrefixTemplate, "[${role_name}]");
  EXPECT_EQ(parse({"p"}, {{"PET_SIGNALS_TO_HANDLE", "SIGINT"}}).stopSignals, std::vector<int>{SIGINT});
  EXPECT_FALSE(parse({"p"}, {{"TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1"}}).agentStore);
  // --virtual-local-rank with enough devices.
  EXPECT_TRUE(parse({"--virtual-local-rank", "--nproc-per-node=2", "p"},
                    {{"CUDA_VISIBLE_DEVICES", "3,5"}}).virtualLocalRank);
}

TEST(LaunchOptions, RendezvousEndpointsAsTorchrunParsesThem) {
  auto v6 = parse({"--rdzv_backend=c10d", "--rdzv_endpoint=[::1]:29401", "p"});
  EXPECT_EQ(v6.rdzvHost, "::1");
  EXPECT_EQ(v6.rdzvPort, 29401);
  auto bare = parse({"--rdzv_backend=c10d", "--rdzv_endpoint=node0", "p"});
  EXPECT_EQ(bare.rdzvHost, "node0");
  EXPECT_EQ(bare.rdzvPort, 29400);
  auto free = parse({"--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0", "p"});
  EXPECT_EQ(free.rdzvPort, 0);
  EXPECT_EQ(free.rdzvId, "none");
  EXPECT_EQ(parse({"--rdzv_backend=c10d", "--rdzv_endpoint=[fe80::1]", "p"}).rdzvHost, "fe80::1");
}

struct BadCase {
  std::vector<std::string> args;
  std::string mentions;
};

class LaunchBadFlags : public ::testing::TestWithParam<BadCase> {};

TEST_P(LaunchBadFlags, OneLineNamingTheProblem) {
  std::string message = error(GetParam().args);
  EXPECT_NE(message.find(GetParam().mentions), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

INSTANTIATE_TEST_SUITE_P(
    Flags, LaunchBadFlags,
    ::testing::Values(BadCase{{"--bogus", "p"}, "unknown flag --bogus"},
                      BadCase{{"--rdzv_tls_ca=/etc/ssl/ca.pem", "p"}, "--rdzv_tls_ca joins a rendezvousd"},
                      BadCase{{"--nproc_per_node=0", "p"}, "--nproc_per_node=0"},
                      BadCase{{"--nproc_per_node=many", "p"}, "--nproc_per_node=many"},
                      BadCase{{"--nnodes=a:b", "p"}, "--nnodes=a:b is invalid"},
                      BadCase{{"--nnodes=4:2", "p"}, "--nnodes=4:2"},
                      BadCase{{"--nnodes=1:2:3", "p"}, "--nnodes"},
                      BadCase{{"--nnodes=1:4", "p"}, "elastic rendezvous"},
                      BadCase{{"--master_port=99999", "p"}, "--master_port=99999"},
                      BadCase{{"--max_restarts=-1", "p"}, "--max_restarts"},
                      BadCase{{"--redirects=7", "p"}, "--redirects=7"},
                      BadCase{{"--rdzv_backend=etcd", "p"}, "etcd"},
                      BadCase{{"--node_rank=3", "p"}, "--node_rank=3"},
                      BadCase{{"--torchrun_version=two", "p"}, "--torchrun_version=two"},
                      BadCase{{"--torchrun_version=1.8", "p"}, "torch 1.9"},
                      BadCase{{"--torchrun_version=2", "p"}, "such as 1.13"},
                      BadCase{{"--nproc_per_node"}, "needs a value"},
                      BadCase{{"--nproc_per_node=2"}, "no PROGRAM"},
                      BadCase{{"-m", "--no_python", "p"}, "--module and --no_python"},
                      BadCase{{"--legacy_launch=3", "p"}, "--legacy_launch"},
                      BadCase{{"--signals_to_handle=SIGBOGUS", "p"}, "'SIGBOGUS' is none"},
                      BadCase{{"--signals_to_handle=TERM", "p"}, "--signals_to_handle=TERM"},
                      BadCase{{"--signals-to-handle=SIGKILL", "p"}, "SIGKILL cannot be handled"},
                      BadCase{{"--shutdown-timeout=-1", "p"}, "--shutdown_timeout=-1"},
                      BadCase{{"--event-log-handler=file", "p"}, "null, console or dynamic_rendezvous"},
                      BadCase{{"--numa-binding=everything", "p"}, "node, socket, exclusive"},
                      BadCase{{"--worker_store=daemon", "p"}, "agent or rank0"},
                      BadCase{{"--rdzv_backend=c10d", "--rdzv_endpoint=::1:29400", "p"},
                              "needs brackets"},
                      BadCase{{"--rdzv_backend=c10d", "--rdzv_endpoint=h:port", "p"},
                              "--rdzv_endpoint=h:port"},
                      BadCase{{"--rdzv_backend=c10d", "--rdzv_endpoint=[::1", "p"}, "[IPV6]"},
                      BadCase{{"--rdzv_backend=c10d", "--rdzv_endpoint=h:", "p"}, "a port 0-65535"},
                      BadCase{{"--rdzv_backend=c10d", "--rdzv_endpoint=h:65536", "p"}, "a port 0-65535"},
                      BadCase{{"--rdzv_backend=c10d", "--rdzv_endpoint=[::1]x", "p"}, "[IPV6]"},
                      BadCase{{"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=h:0", "p"},
                              "one-node job only"},
                      // etcd: the members' list, TLS and auth in --rdzv_conf, as torchrun names them.
                      BadCase{{"--rdzv_backend=etcd", "--rdzv_endpoint=h1:2379,h2:x", "p"},
                              "'h2:x' is not an etcd endpoint"},
                      BadCase{{"--rdzv_backend=etcd-v2", "--rdzv_endpoint=h1:2379/v2", "p"}, "is not an etcd endpoint"},
                      BadCase{{"--rdzv_backend=etcd", "--rdzv_endpoint=h1", "--rdzv_conf=protocol=ftp", "p"},
                              "--rdzv_conf protocol=ftp is invalid; expected http or https"},
                      BadCase{{"--rdzv_backend=etcd", "--rdzv_endpoint=h1", "--rdzv_conf=cacert=/ca.pem", "p"},
                              "cacert= is for TLS to etcd; add protocol=https"},
                      BadCase{{"--rdzv_backend=etcd", "--rdzv_endpoint=https://h1", "--rdzv_conf=cert=/c.pem", "p"},
                              "cert= and key= go together"},
                      BadCase{{"--rdzv_backend=etcd", "--rdzv_endpoint=h1", "--rdzv_conf=password_file=/p", "p"},
                              "password_file= needs user="},
                      BadCase{{"--rdzv_backend=etcd", "--rdzv_endpoint=h1", "--rdzv_conf=is_host=1", "p"},
                              "with etcd no node hosts the rendezvous"},
                      BadCase{{"--rdzv_backend=etcd", "--rdzv_endpoint=h1", "--rdzv_tls_ca=/ca.pem", "p"},
                              "--rdzv_tls_ca is for a rendezvousd"},
                      BadCase{{"--rdzv_backend=etcd", "--rdzv_endpoint=https://h1",
                               "--rdzv_conf=cacert=/a.pem,ca_cert=/b.pem", "p"},
                              "ca_cert= and cacert= name the same file differently"},
                      BadCase{{"--rdzv_backend=etcd-v2", "--rdzv_endpoint=h1", "--rdzv_conf=ssl_cert=/c.pem", "p"},
                              "cert= is for TLS to etcd"},
                      BadCase{{"--rdzv_backend=etcd", "--rdzv_endpoint=h1", "--rdzv_conf=etcd_prefix=jobs", "p"},
                              "etcd_prefix=jobs is invalid"}));

// etcd's members: every one kept, the scheme read (https:// everywhere: TLS), etcd's port by
// default; torchrun's key names for TLS.
TEST(LaunchOptions, EtcdTakesEveryMemberAndTorchrunsTlsKeys) {
  auto o = parse({"--nnodes=2", "--rdzv_backend=etcd", "--rdzv_endpoint=https://h1,https://h2:2380,h3:12379",
                  "--rdzv_conf=cacert=/ca.pem,cert=/c.pem,key=/k.pem,user=u,password_file=/p", "p"});
  EXPECT_EQ(o.rdzvHost, "h1");
  EXPECT_EQ(o.rdzvPort, 2379);
  EXPECT_EQ(parse({"--rdzv_backend=etcd-v2", "--rdzv_endpoint=h1:2379", "p"}).rdzvBackend, "etcd-v2");
}

// Hardware this machine may lack: each missing piece is one line saying what to do.
TEST(LaunchOptions, AcceleratorFlagsWithoutTheHardwareSaySo) {
  Env noGpu{{"CUDA_VISIBLE_DEVICES", ""}, {"ZE_AFFINITY_MASK", ""}};
  EXPECT_NE(error({"--nproc-per-node=xpu", "p"}, noGpu).find("no usable Intel GPU"), std::string::npos);
  EXPECT_NE(error({"--numa-binding=node", "p"}, noGpu).find("has no usable GPU"), std::string::npos);
  EXPECT_NE(error({"--virtual-local-rank", "--nproc_per_node=3", "p"}, {{"CUDA_VISIBLE_DEVICES", "0,1"}})
                .find("lists 2 for 3 workers"),
            std::string::npos);
}

class WorkerCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("muster-cmd-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
    write("train.py", "print(1)\n", false);
    write("tool", "#!/bin/sh\necho hi\n", true);
    write("script", "#!/usr/bin/env python3\nprint(1)\n", true);
    write("data.txt", "x", false);
    write("python3", "#!/bin/sh\n", true);
    env_ = {{"PATH", dir_.string() + ":/usr/bin:/bin"}};
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& name, const std::string& text, bool executable) {
    std::ofstream(dir_ / name) << text;
    if (executable) chmod((dir_ / name).c_str(), 0755);
  }
  std::string path(const std::string& name) { return (dir_ / name).string(); }
  std::vector<std::string> command(std::vector<std::string> args) {
    auto o = parseLaunchOptions(args, env_);
    EXPECT_TRUE(o.ok()) << o.status();
    auto c = workerCommand(*o, env_);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : std::vector<std::string>{};
  }
  std::string commandError(std::vector<std::string> args) {
    auto o = parseLaunchOptions(args, env_);
    EXPECT_TRUE(o.ok()) << o.status();
    auto c = workerCommand(*o, env_);
    EXPECT_FALSE(c.ok());
    return std::string(c.status().message());
  }
  std::filesystem::path dir_;
  Env env_;
};

TEST_F(WorkerCommandTest, PythonScriptsRunUnderPythonWithUnbufferedOutput) {
  EXPECT_EQ(command({path("train.py"), "--lr", "1"}),
            (std::vector<std::string>{path("python3"), "-u", path("train.py"), "--lr", "1"}));
  EXPECT_EQ(command({path("script")}),
            (std::vector<std::string>{path("python3"), "-u", path("script")}));
  env_["PYTHON_EXEC"] = "/bin/sh";
  EXPECT_EQ(command({path("train.py")})[0], "/bin/sh");
}

TEST_F(WorkerCommandTest, ExecutablesRunDirectlyAndModulesUnderPythonM) {
  EXPECT_EQ(command({path("tool"), "x"}), (std::vector<std::string>{path("tool"), "x"}));
  EXPECT_EQ(command({"--no_python", "tool"}), (std::vector<std::string>{path("tool")}));
  EXPECT_EQ(command({"-m", "pkg.mod", "a"}),
            (std::vector<std::string>{path("python3"), "-u", "-m", "pkg.mod", "a"}));
}

TEST_F(WorkerCommandTest, AFolderOfTheProgramsNameInTheWorkingFolderDoesNotHideItOnPath) {
  // `launch worker` in a source tree, whose worker/ is a folder: the worker on PATH runs.
  auto here = std::filesystem::current_path();
  std::filesystem::create_directories(dir_ / "cwd" / "tool");
  std::filesystem::current_path(dir_ / "cwd");
  auto found = command({"tool", "x"});
  auto folderOnly = commandError({"nothing-like-it"});
  std::filesystem::create_directories(dir_ / "cwd" / "only-a-folder");
  auto folder = commandError({"only-a-folder"});
  std::filesystem::current_path(here);
  EXPECT_EQ(found, (std::vector<std::string>{path("tool"), "x"}));
  // A Python script on PATH runs under Python by its path, not by the bare name (which Python
  // would look for here, and find the folder).
  std::filesystem::create_directories(dir_ / "cwd" / "script");
  std::filesystem::current_path(dir_ / "cwd");
  auto script = command({"script"});
  std::filesystem::current_path(here);
  EXPECT_EQ(script, (std::vector<std::string>{path("python3"), "-u", path("script")}));
  EXPECT_NE(folderOnly.find("not found"), std::string::npos) << folderOnly;
  EXPECT_NE(folder.find("is a directory"), std::string::npos) << folder;
}

TEST_F(WorkerCommandTest, LegacyLaunchAppendsLocalRankUnlessUseEnv) {
  EXPECT_EQ(command({"--legacy_launch=1.13", path("train.py"), "a"}),
            (std::vector<std::string>{path("python3"), "-u", path("train.py"),
                                      "--local_rank=${local_rank}", "a"}));
  EXPECT_EQ(command({"--legacy-launch=2", path("tool")}),
            (std::vector<std::string>{path("tool"), "--local-rank=${local_rank}"}));
  EXPECT_EQ(command({"--legacy_launch=1.13", "--use_env", path("tool")}),
            (std::vector<std::string>{path("tool")}));
}

TEST_F(WorkerCommandTest, MissingOrNonExecutableProgramsAreErrors) {
  EXPECT_NE(commandError({path("nope.py")}).find("not found"), std::string::npos);
  EXPECT_NE(commandError({"--no_python", path("data.txt")}).find("not executable"),
            std::string::npos);
  EXPECT_NE(commandError({dir_.string()}).find("directory"), std::string::npos);
  env_["PYTHON_EXEC"] = "no-such-python";
  EXPECT_NE(commandError({path("train.py")}).find("PYTHON_EXEC"), std::string::npos);
}

}  // namespace
}  // namespace muster::launcher

namespace muster::launcher {
namespace {

// srun's variables for task `node` of a 2-node, 1-task-per-node step of job 4242.
Env srunEnv(int node) {
  return {{"SLURM_JOB_ID", "4242"},          {"SLURM_STEP_ID", "0"},
          {"SLURM_NNODES", "2"},             {"SLURM_STEP_NUM_NODES", "2"},
          {"SLURM_STEP_NUM_TASKS", "2"},     {"SLURM_NODEID", std::to_string(node)},
          {"SLURM_JOB_NODELIST", "n[1-2]"},  {"SLURM_STEP_NODELIST", "n[1-2]"},
          {"SLURM_SUBMIT_DIR", "/home/u/job"}};
}

TEST(Slurm, FirstHostOfAHostList) {
  EXPECT_EQ(*firstSlurmHost("n1"), "n1");
  EXPECT_EQ(*firstSlurmHost("n[1-2]"), "n1");
  EXPECT_EQ(*firstSlurmHost("gpu[08-11,20],cpu3"), "gpu08");
  EXPECT_EQ(*firstSlurmHost("rack[2,4]-node[003-004]"), "rack2-node003");
  EXPECT_EQ(*firstSlurmHost("a-b,c[1-3]"), "a-b");
  for (const char* bad : {"", "n[", "n[]", "n]1", "n[x-y]", ",n1"}) {
    EXPECT_FALSE(firstSlurmHost(bad).ok()) << bad;
  }
}

TEST(Slurm, InsideSrunTheAbsentFlagsComeFromTheStep) {
  auto o = parse({"--nproc_per_node=2", "train.py"}, srunEnv(1));
  EXPECT_EQ(o.minNodes, 2);
  EXPECT_EQ(o.maxNodes, 2);
  EXPECT_EQ(o.nodeRank, 1);
  EXPECT_EQ(o.masterAddr, "n1");
  EXPECT_TRUE(o.masterAddrFromSlurm);
  EXPECT_EQ(o.masterPort, 29500 + 4242 % 1000);
  EXPECT_EQ(o.rdzvId, "4242");
  EXPECT_EQ(o.slurmJob, "4242");
  EXPECT_EQ(o.sharedDir, "/home/u/job/.muster-shared");
  EXPECT_TRUE(o.sharedDirFromSlurm);
  EXPECT_EQ(o.fromSlurm.size(), 6u);
}

// A one-node step: the port Slurm gives counts as given, so the rendezvous stays static.
TEST(Slurm, AOneNodeStepKeepsTheStaticRendezvousOnItsPort) {
  auto env = srunEnv(0);
  env["SLURM_NNODES"] = env["SLURM_STEP_NUM_NODES"] = env["SLURM_STEP_NUM_TASKS"] = "1";
  env["SLURM_JOB_NODELIST"] = env["SLURM_STEP_NODELIST"] = "n1";
  auto o = parse({"train.py"}, env);
  EXPECT_FALSE(o.standalone);
  EXPECT_EQ(o.rdzvBackend, "static");
  EXPECT_EQ(o.masterPort, 29500 + 4242 % 1000);
}

TEST(Slurm, FlagsGivenWin) {
  auto env = srunEnv(1);
  env["PET_MASTER_PORT"] = "1234";
  env["MUSTER_SHARED_DIR"] = "/nfs/s";
  auto o = parse({"--nnodes=2", "--node-rank=0", "--master_addr=10.1.2.3", "--rdzv_id=x", "p"}, env);
  EXPECT_EQ(o.sharedDir, "/nfs/s");
  EXPECT_EQ(o.nodeRank, 0);
  EXPECT_EQ(o.masterAddr, "10.1.2.3");
  EXPECT_FALSE(o.masterAddrFromSlurm);
  EXPECT_EQ(o.masterPort, 1234);
  EXPECT_EQ(o.rdzvId, "x");
  EXPECT_TRUE(o.fromSlurm.empty());
}

TEST(Slurm, OffIgnoresSlurmAndOutsideSlurmNothingChanges) {
  auto o = parse({"--slurm=off", "p"}, srunEnv(1));
  EXPECT_EQ(o.maxNodes, 1);
  EXPECT_EQ(o.nodeRank, 0);
  EXPECT_TRUE(o.slurmJob.empty());
  auto off = parse({"p"}, {{"MUSTER_SLURM", "off"}, {"SLURM_JOB_ID", "1"}, {"SLURM_NNODES", "4"}});
  EXPECT_EQ(off.maxNodes, 1);
  auto outside = parse({"p"});
  EXPECT_TRUE(outside.slurmJob.empty());
  EXPECT_EQ(outside.masterPort, 29500);
  EXPECT_NE(error({"--slurm=maybe", "p"}).find("--slurm=maybe is invalid"), std::string::npos);
}

TEST(Slurm, ElasticRendezvousTakesOnlyTheSizeAndId) {
  auto o = parse({"--rdzv_backend=c10d", "--rdzv_endpoint=head:29400", "p"}, srunEnv(1));
  EXPECT_EQ(o.maxNodes, 2);
  EXPECT_EQ(o.rdzvId, "4242");
  EXPECT_EQ(o.nodeRank, 0);
  EXPECT_EQ(o.masterAddr, "127.0.0.1");
}

TEST(Slurm, WrongUseIsOneClearLine) {
  // The batch script's own shell of a 2-node job: no srun.
  Env batch = {{"SLURM_JOB_ID", "7"}, {"SLURM_JOB_NUM_NODES", "2"}, {"SLURM_NODEID", "0"},
               {"SLURM_JOB_NODELIST", "n[1-2]"}};
  EXPECT_NE(error({"p"}, batch).find("not running under srun"), std::string::npos);
  // One node needs no srun, and keeps the loopback master with the job's own port.
  batch["SLURM_JOB_NUM_NODES"] = "1";
  auto single = parse({"p"}, batch);
  EXPECT_EQ(single.maxNodes, 1);
  EXPECT_EQ(single.masterAddr, "127.0.0.1");
  EXPECT_FALSE(single.masterAddrFromSlurm);
  EXPECT_EQ(single.masterPort, 29507);
  // srun -n 4 on 2 nodes: two launches per node.
  auto many = srunEnv(0);
  many["SLURM_STEP_NUM_TASKS"] = "4";
  EXPECT_NE(error({"p"}, many).find("--ntasks-per-node=1"), std::string::npos);
  auto bad = srunEnv(0);
  bad["SLURM_NODEID"] = "x";
  EXPECT_NE(error({"p"}, bad).find("SLURM_NODEID=x"), std::string::npos);
  bad = srunEnv(0);
  bad["SLURM_STEP_NODELIST"] = "n[1-";
  EXPECT_NE(error({"p"}, bad).find("n[1-"), std::string::npos);
}

TEST(Slurm, WhatSlurmFillsInIsValidatedLikeWhatWasTyped) {
  // Parsing alone accepts a hosted endpoint on port 0; the node count Slurm gives (2) makes it
  // invalid, and the step after Slurm says so, naming the count.
  std::vector<std::string> args{"--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0", "p"};
  auto env = srunEnv(0);
  auto o = parseLaunchFlags(args, env);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->maxNodes, 1);
  ASSERT_TRUE(validateLaunchOptions(*o, env).ok());
  o = parseLaunchFlags(args, env);
  ASSERT_TRUE(takeFromSlurm(*o, env).ok());
  EXPECT_EQ(o->maxNodes, 2);
  EXPECT_EQ(o->slurmJob, "4242");
  auto invalid = validateLaunchOptions(*o, env);
  EXPECT_EQ(invalid.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(invalid.message().find("--nnodes=2"), std::string::npos) << invalid;
  EXPECT_NE(error(args, env).find("--nnodes=2"), std::string::npos);
}

TEST(Slurm, NodeAddrFromScontrol) {
  EXPECT_EQ(nodeAddrFromScontrol("NodeName=n1 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.9.0.2 "
                                 "NodeHostName=n1 Version=22.05.8\n"),
            "10.9.0.2");
  EXPECT_EQ(nodeAddrFromScontrol("NodeName=n1 NodeHostName=n1\n"), "");
  EXPECT_EQ(nodeAddrFromScontrol("X_NodeAddr=1 NodeAddr=n1.cluster\n"), "n1.cluster");
  // Without scontrol (or without the node) the host name is the answer.
  EXPECT_EQ(slurmNodeAddress("no-such-node-here"), "no-such-node-here");
}

// --numa_binding's choice of CPUs on a made-up /sys: two NUMA nodes of 8 CPUs (4 cores with
// 2 threads each, two L3 complexes of 2 cores), two GPUs on each node, one socket per node.
class Numa : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() / ("muster-sys-" + std::to_string(getpid()));
    std::filesystem::remove_all(root_);
    const char* gpus[] = {"0000:17:00.0", "0000:3a:00.0", "0000:8a:00.0", "0000:bb:00.0"};
    for (int g = 0; g < 4; ++g) {
      auto dev = root_ / "bus/pci/devices" / gpus[g];
      write(dev / "vendor", "0x10de");
      write(dev / "class", "0x030200");
      write(dev / "numa_node", g < 2 ? "0" : "1");
    }
    write(root_ / "bus/pci/devices/0000:00:1f.0/vendor", "0x8086");  // not a GPU
    write(root_ / "bus/pci/devices/0000:00:1f.0/class", "0x060100");
    write(root_ / "devices/system/node/possible", "0-1");
    for (int n = 0; n < 2; ++n) {
      write(root_ / ("devices/system/node/node" + std::to_string(n)) / "cpulist",
            n == 0 ? "0-3,16-19" : "8-11,24-27");
    }
    for (int c : {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27}) {
      auto cpu = root_ / ("devices/system/cpu/cpu" + std::to_string(c));
      int core = c % 16, sibling = core + 16;
      write(cpu / "topology/thread_siblings_list", std::to_string(core) + "," + std::to_string(sibling));
      write(cpu / "topology/physical_package_id", c % 16 < 8 ? "0" : "1");
      int base = (core / 2) * 2;  // complexes of 2 cores: {0,1}, {2,3}, {8,9}, {10,11}
      write(cpu / "cache/index3/type", "Unified");
      write(cpu / "cache/index3/level", "3");
      write(cpu / "cache/index3/shared_cpu_list",
            std::to_string(base) + "-" + std::to_string(base + 1) + "," + std::to_string(base + 16) +
                "-" + std::to_string(base + 17));
    }
    for (int c = 0; c < 32; ++c) all_.insert(c);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  void write(const std::filesystem::path& p, const std::string& text) {
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text << "\n";
  }
  std::string cpus(const std::string& mode, int gpu, const Env& env = {}) {
    auto r = numaCpusForGpu({.mode = mode, .gpu = gpu, .sysRoot = root_.string(), .allowed = all_}, env);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.value_or("");
  }
  std::filesystem::path root_;
  std::set<int> all_;
};

TEST_F(Numa, EachModePicksTheCpusNearTheGpu) {
  EXPECT_EQ(cpus("node", 0), "0-3,16-19");
  EXPECT_EQ(cpus("node", 3), "8-11,24-27");
  EXPECT_EQ(cpus("socket", 2), "8-11,24-27");
  // Two GPUs share node 0's 4 cores: 2 cores (4 threads) each.
  EXPECT_EQ(cpus("exclusive", 0), "0-1,16-17");
  EXPECT_EQ(cpus("exclusive", 1), "2-3,18-19");
  EXPECT_EQ(cpus("core-complex", 1), "2-3,18-19");
  // CUDA_VISIBLE_DEVICES renumbers: GPU 0 of this process is the machine's third.
  EXPECT_EQ(cpus("node", 0, {{"CUDA_VISIBLE_DEVICES", "2,3"}}), "8-11,24-27");
  // The process's own affinity narrows the choice.
  auto narrowed = numaCpusForGpu({.mode = "node", .gpu = 0, .sysRoot = root_.string(),
                                  .allowed = std::set<int>{1, 2, 30}}, {});
  EXPECT_EQ(narrowed.value_or(""), "1-2");
}

TEST_F(Numa, WhatCannotBeBoundIsOneLine) {
  auto missing = numaCpusForGpu({.mode = "node", .gpu = 4, .sysRoot = root_.string(), .allowed = all_}, {});
  EXPECT_NE(missing.status().message().find("local rank 4 has no GPU (4 visible)"), std::string::npos);
  auto uuid = numaCpusForGpu({.mode = "node", .gpu = 0, .sysRoot = root_.string(), .allowed = all_},
                             {{"CUDA_VISIBLE_DEVICES", "GPU-5f2a"}});
  EXPECT_NE(uuid.status().message().find("by UUID"), std::string::npos);
  auto none = numaCpusForGpu({.mode = "node", .gpu = 0, .sysRoot = root_.string(), .allowed = std::set<int>{5}}, {});
  EXPECT_NE(none.status().message().find("has no CPU this process may use"), std::string::npos);
}

TEST(CpuList, ParsesAndFormatsRanges) {
  EXPECT_EQ(parseCpuList("0-2,8, 10-11\n"), (std::set<int>{0, 1, 2, 8, 10, 11}));
  EXPECT_EQ(formatCpuList({0, 1, 2, 8, 10, 11}), "0-2,8,10-11");
}

}  // namespace
}  // namespace muster::launcher

namespace muster::launcher {
namespace {

TEST(StopAt, TakesUnixSecondsALocalOrUtcTimeAndSlurmsEndLessAMargin) {
  auto o = parse({"--stop_at=1795000000", "p"});
  ASSERT_TRUE(o.stopAt.has_value());
  EXPECT_EQ(o.stopAt->unixS, 1795000000);
  EXPECT_FALSE(o.stopAt->slurm);
  EXPECT_EQ(parse({"--stop-at", "2026-11-28T06:00:00Z", "p"}).stopAt->unixS, 1795845600);
  // A local time is the one the machine's clock shows: back through localTimeText.
  auto local = parse({"--stop_at=2026-11-28T06:00:00", "p"}).stopAt->unixS;
  ASSERT_TRUE(local.has_value());
  EXPECT_EQ(localTimeText(*local), "2026-11-28T06:00:00");
  auto slurm = parseStopAt("slurm");
  ASSERT_TRUE(slurm.ok());
  EXPECT_TRUE(slurm->slurm);
  EXPECT_EQ(slurm->marginS, 300);
  EXPECT_EQ(parseStopAt("slurm-90")->marginS, 90);
  // Slurm's end time and --requeue outside Slurm: one line.
  EXPECT_EQ(error({"p"}, {{"MUSTER_STOP_AT", "slurm"}}),
            "--stop_at=slurm: launch is not inside a Slurm job (no SLURM_JOB_ID)");
  EXPECT_EQ(error({"--requeue", "--slurm=off", "p"}, {{"SLURM_JOB_ID", "7"}}),
            "--requeue: launch is not inside a Slurm job (no SLURM_JOB_ID, or --slurm=off)");
  EXPECT_FALSE(parse({"p"}).stopAt.has_value());
  for (const char* bad : {"tomorrow", "slurm-", "slurm-x", "slurm--5", "-5", "+5", "2026-13-40T99:00:00", "2026-11-28",
                          "2026-11-28T06:00:00+01", "7258118401", "2200-01-02T00:00:00Z"}) {
    std::string why = error({std::string("--stop_at=") + bad, "p"});
    EXPECT_NE(why.find("--stop_at '"), std::string::npos) << bad << ": " << why;
    EXPECT_NE(why.find("it takes Unix seconds"), std::string::npos) << why;
  }
}

TEST(StopAt, SlurmTimesAndTheWordsForNone) {
  auto t = parseSlurmTime("2026-11-28T06:00:00\n");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE(t->has_value());
  EXPECT_EQ(localTimeText(**t), "2026-11-28T06:00:00");
  for (const char* none : {"Unknown", "N/A", "NONE", "INVALID"}) {
    auto n = parseSlurmTime(none);
    ASSERT_TRUE(n.ok()) << none;
    EXPECT_FALSE(n->has_value()) << none;
  }
  EXPECT_FALSE(parseSlurmTime("soon").ok());
  // Outside Slurm, slurm is refused in one line; a time given is taken as it is.
  auto outside = stopTime(StopAt{.slurm = true}, "");
  ASSERT_FALSE(outside.ok());
  EXPECT_EQ(outside.status().message(), "--stop_at=slurm: launch is not inside a Slurm job (no SLURM_JOB_ID)");
  EXPECT_EQ(*stopTime(StopAt{.unixS = 42}, ""), 42);
}

}  // namespace
}  // namespace muster::launcher
