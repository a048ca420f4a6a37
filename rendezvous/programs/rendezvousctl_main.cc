// rendezvousctl: a command-line client of the store, for scripts, demos and debugging.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <algorithm>
#include <cstdio>
#include <iostream>

#include <grpcpp/grpcpp.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "common/build_info.h"
#include "common/contract.h"
#include "common/files.h"
#include "common/log.h"
#include "common/stop_board.h"
#include "etcd/options.h"
#include "etcd/roll_call.h"
#include "etcd/run_views.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "rendezvous/rpc/grpc_channel.h"
#include "rendezvous/client/rendezvous_client.h"
#include "rendezvous/programs/run_view.h"
#include "rendezvous/programs/watch_screen.h"
#include "stacks/stacks.h"
#include "rendezvous/client/store_client.h"

using muster::rendezvous::ClientOptions;
using muster::rendezvous::StoreClient;

namespace {

int failed(const absl::Status& status) {
  std::fprintf(stderr, "rendezvousctl: %s\n", status.ToString().c_str());
  return 1;
}

// One Check call, without the store's own handshake: what a liveness probe wants.
int checkHealth(const ClientOptions& options, double timeoutS) {
  auto channel = muster::rendezvous::makeChannel(
      {.target = options.target, .tlsCaPem = options.tlsCaPem, .tlsServerName = options.tlsServerName});
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(timeoutS * 1000)));
  context.set_wait_for_ready(true);
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  auto status = stub->Check(&context, request, &response);
  if (!status.ok()) {
    std::fprintf(stderr, "rendezvousctl: health check of %s failed: %s\n", options.target.c_str(),
                 status.error_message().c_str());
    return 1;
  }
  std::cout << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status())
            << std::endl;
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
}

// `stacks --pid PID`: asks a launch on this host, through its control socket, for every rank's
// stack, and prints the report.
int launchStacks(long pid, double timeoutS) {
  std::string name = muster::contract::launchControlSocket(pid);
  sockaddr_un at{};
  at.sun_family = AF_UNIX;
  std::memcpy(at.sun_path, name.data(), std::min(name.size(), sizeof at.sun_path));
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&at), length) != 0) {
    std::fprintf(stderr, "rendezvousctl: no launch with pid %ld answers on this host (is it running, in this "
                 "network namespace, as your user?)\n", pid);
    if (fd >= 0) close(fd);
    return 1;
  }
  const char command[] = "stacks\n";
  if (write(fd, command, sizeof command - 1) != static_cast<ssize_t>(sizeof command - 1)) {
    std::fprintf(stderr, "rendezvousctl: launch %ld closed its control socket\n", pid);
    close(fd);
    return 1;
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeoutS * 1000));
  std::string out;
  char buf[65536];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0) {
      std::fprintf(stderr, "rendezvousctl: launch %ld did not answer within %g s (--timeout)\n", pid, timeoutS);
      close(fd);
      return 1;
    }
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  if (out.empty()) {
    std::fprintf(stderr, "rendezvousctl: launch %ld closed the connection without an answer\n", pid);
    return 1;
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return out.rfind("launch: ", 0) == 0 ? 1 : 0;
}

// One report of a run's roll-call: every answering node's ranks, the nodes that did not answer.
struct NodeAnswer {
  std::string host, json;
};
int printRollCall(const std::string& runId, const std::vector<NodeAnswer>& answers,
                  const std::vector<std::string>& missing, double timeoutS) {
  std::vector<muster::stacks::RankStacks> ranks;
  for (const auto& node : answers) {
    try {
      auto more = muster::stacks::fromJson(nlohmann::json::parse(node.json));
      ranks.insert(ranks.end(), more.begin(), more.end());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rendezvousctl: node %s sent stacks that are not muster's: %s\n", node.host.c_str(), e.what());
    }
  }
  std::sort(ranks.begin(), ranks.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  std::string out = muster::stacks::fullReport(
      ranks, fmt::format("run '{}', {} node(s), asked for through the rendezvous", runId, answers.size()));
  for (const auto& who : missing) out += fmt::format("\nnode {} did not answer within {:g} s\n", who, timeoutS);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return answers.empty() ? 1 : 0;
}

// `stacks --run ID`: a roll-call of every node of a run through the rendezvous service.
int runStacks(const ClientOptions& options, const std::string& runId, double timeoutS) {
  muster::rendezvous::RendezvousClient client(options.target, options.token, options.tlsCaPem, options.tlsServerName);
  muster::v1::StacksRequest request;
  request.set_run_id(runId);
  // The service waits for the nodes a little less than we wait for it.
  request.set_timeout_ms(static_cast<uint32_t>(std::max(0.1, timeoutS * 0.9) * 1000));
  auto reply = client.stacks(request, muster::deadlineAfter(muster::Millis(static_cast<int64_t>(timeoutS * 1000) + 2000)));
  if (!reply.ok()) {
    std::fprintf(stderr, "rendezvousctl: stack roll-call of run '%s' at %s failed: %s\n", runId.c_str(),
                 options.target.c_str(), std::string(reply.status().message()).c_str());
    return 1;
  }
  std::vector<NodeAnswer> answers;
  for (const auto& node : reply->nodes()) answers.push_back({node.host(), node.json()});
  std::vector<std::string> missing(reply->missing().begin(), reply->missing().end());
  return printRollCall(runId, answers, missing, timeoutS);
}

// An etcd client for --etcd ENDPOINTS with --etcd-conf CONF (TLS, auth, prefix).
absl::StatusOr<std::unique_ptr<muster::etcd::Client>> connectEtcd(const std::string& endpoints,
                                                                  const std::string& conf,
                                                                  muster::Deadline deadline) {
  auto parsed = muster::etcd::parseConf(conf, "--etcd-conf");
  if (!parsed.ok()) return parsed.status();
  auto options = muster::etcd::clientOptions(endpoints, *parsed, "--etcd-conf");
  if (!options.ok()) return options.status();
  return muster::etcd::Client::connect(*options, deadline);
}

// `stacks --run ID --etcd ENDPOINTS`: the same roll-call where the run's rendezvous is etcd.
int etcdStacks(const std::string& endpoints, const std::string& conf, const std::string& runId, double timeoutS) {
  auto timeout = muster::Millis(static_cast<int64_t>(timeoutS * 1000));
  auto client = connectEtcd(endpoints, conf, muster::deadlineAfter(std::max(timeout, muster::Millis(5000))));
  if (!client.ok()) return failed(client.status());
  auto reply = muster::etcd::askForStacks(**client, runId, timeout);
  if (!reply.ok()) {
    std::fprintf(stderr, "rendezvousctl: stack roll-call of run '%s' at etcd %s failed: %s\n", runId.c_str(),
                 (*client)->endpointList().c_str(), std::string(reply.status().message()).c_str());
    return 1;
  }
  std::vector<NodeAnswer> answers;
  for (const auto& node : reply->answered) answers.push_back({node.host, node.json});
  return printRollCall(runId, answers, reply->missing, timeoutS);
}

// `runs` and `status`: one call each time a view is drawn; a failure is the view's text
// ("rendezvousctl: ..." and ok false), so that --watch shows it and goes on.
struct RunViews {
  const ClientOptions& options;
  double timeoutS;
  std::string etcdEndpoints, etcdConf;  // not empty: the runs are in etcd
  std::unique_ptr<muster::rendezvous::RendezvousClient> client;
  std::unique_ptr<muster::etcd::Client> etcd;

  // The etcd client, connected once; its error as the view's text.
  absl::Status connectEtcd() {
    if (etcd) return absl::OkStatus();
    auto c = ::connectEtcd(etcdEndpoints, etcdConf, deadline());  // the free function
    if (!c.ok()) return c.status();
    etcd = std::move(*c);
    return absl::OkStatus();
  }
  std::string where() const { return etcdEndpoints.empty() ? options.target : "etcd " + etcdEndpoints; }
  absl::StatusOr<muster::v1::RunsReply> fetchRuns() {
    if (etcdEndpoints.empty()) return connect().runs(deadline());
    if (auto s = connectEtcd(); !s.ok()) return s;
    return muster::etcd::runsOf(*etcd, deadline());
  }
  absl::StatusOr<muster::v1::StatusReply> fetchStatus(const std::string& run) {
    if (etcdEndpoints.empty()) return connect().status(run, deadline());
    if (auto s = connectEtcd(); !s.ok()) return s;
    return muster::etcd::statusOf(*etcd, run, deadline());
  }

  muster::rendezvous::RendezvousClient& connect() {
    if (!client) {
      client = std::make_unique<muster::rendezvous::RendezvousClient>(options.target, options.token, options.tlsCaPem,
                                                                      options.tlsServerName);
    }
    return *client;
  }
  muster::Deadline deadline() const {
    return muster::deadlineAfter(muster::Millis(static_cast<int64_t>(std::max(0.1, timeoutS) * 1000)));
  }
  std::string runs(int width, bool json, bool& ok) {
    auto reply = fetchRuns();
    ok = reply.ok();
    if (!ok) return fmt::format("rendezvousctl: runs at {}: {}\n", where(), std::string(reply.status().message()));
    return json ? muster::rendezvous::view::runsJson(*reply) : muster::rendezvous::view::runsTable(*reply, width);
  }
  std::string status(const std::string& run, int width, bool json, bool& ok) {
    auto reply = fetchStatus(run);
    ok = reply.ok();
    if (!ok) {
      return fmt::format("rendezvousctl: status of run '{}' at {}: {}\n", run, where(),
                         std::string(reply.status().message()));
    }
    muster::rendezvous::view::asOfNow(*reply);
    return json ? muster::rendezvous::view::statusJson(*reply) : muster::rendezvous::view::statusText(*reply, width);
  }
};

// `stop --run ID`: asks a running job to stop at one step (launch's coordinated stop,
// common/stop_board.h), as a notice to one of its nodes would: the request goes to the running
// round's stop namespace in the job's store (the service at --addr, or with --etcd the store
// node 0's launch serves). Its nodes agree on the step, its ranks stop there, launch exits 75.
int stopRun(RunViews& views, const std::string& runId) {
  auto cannot = [&](const absl::Status& s) {
    std::fprintf(stderr, "rendezvousctl: cannot ask run '%s' at %s to stop: %s\n", runId.c_str(), views.where().c_str(),
                 std::string(s.message()).c_str());
    return 1;
  };
  uint64_t round = 0;
  ClientOptions store = views.options;
  if (views.etcdEndpoints.empty()) {
    auto status = views.fetchStatus(runId);
    if (!status.ok()) return cannot(status.status());
    if (status->run().state() != muster::v1::RunSummary::RUNNING) {
      return cannot(absl::FailedPreconditionError(
          fmt::format("it is not running a round (it is {}): nothing to stop",
                      absl::AsciiStrToLower(muster::v1::RunSummary::State_Name(status->run().state())))));
    }
    round = status->run().round();
  } else {
    if (auto s = views.connectEtcd(); !s.ok()) return cannot(s);
    auto running = muster::etcd::runningStoreOf(*views.etcd, runId, views.deadline());
    if (!running.ok()) return cannot(running.status());
    round = running->round;
    store.target = running->endpoint;
  }
  store.ns = muster::stopboard::storeNamespace(runId, round);
  auto client = StoreClient::connect(store, views.deadline());
  if (!client.ok()) return cannot(client.status());
  std::string reason = std::to_string(muster::stopboard::kReasonRequest);
  auto now = (*client)->compareSet(muster::stopboard::kRequestKey, "", reason);
  if (!now.ok()) return cannot(now.status());
  if (*now != reason) {
    std::printf("run '%s' (round %llu) was already asked to stop (reason %s); its ranks stop at one step\n",
                runId.c_str(), static_cast<unsigned long long>(round), now->c_str());
    return 0;
  }
  std::printf("asked run '%s' (round %llu) to stop: every rank stops at one step (stop_requested), then launch "
              "exits 75; `rendezvousctl status --run %s` shows the step\n",
              runId.c_str(), static_cast<unsigned long long>(round), runId.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ClientOptions options;
  options.target = "127.0.0.1:29400";
  std::string tokenFile, caFile;
  double timeoutS = 30;
  CLI::App app{"rendezvousctl: talk to a muster store (rendezvousd or launch's own)"};
  app.set_version_flag("--version", muster::build::versionText("rendezvousctl"));
  app.add_option("--addr", options.target, "store address HOST:PORT")->capture_default_str();
  app.add_option("--ns", options.ns, "namespace (run id / round)");
  app.add_option("--token-file", tokenFile, "file holding the shared token")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-ca", caFile, "PEM CA that signed the store's certificate")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-server-name", options.tlsServerName, "name to check in the certificate");
  std::string etcdEndpoints, etcdConf;
  auto* etcdFlag = app.add_option("--etcd", etcdEndpoints,
                                  "runs, status, stacks --run: the runs' rendezvous is in this etcd cluster (HOST:PORT,...), "
                                  "as launch --rdzv_backend=etcd --rdzv_endpoint gave it");
  app.add_option("--etcd-conf", etcdConf,
                 "etcd's TLS and auth as launch's --rdzv_conf names them: protocol=https,cacert=,cert=,key=,"
                 "user=,password_file= (or MUSTER_ETCD_PASSWORD)")
      ->needs(etcdFlag);
  app.add_option("--timeout", timeoutS, "seconds to wait for connecting and for keys")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  bool escaped = false;
  app.add_flag("--escaped", escaped,
               "keys and values given are C-escaped (\\xff, \\0, \\n, \\\\) and values printed are "
               "escaped the same way: any byte string, unambiguously");
  // At most one; none is said below, after unknown flags have been (CLI11 checks a required
  // subcommand first, and `--bogus` alone would read "A subcommand is required").
  app.require_subcommand(0, 1);
  // --addr, --etcd and the like also after the subcommand: `stacks --run ID --etcd ...`.
  app.fallthrough();
  std::string key, value, expected;
  std::vector<std::string> keys;
  int64_t delta = 1;
  auto* set = app.add_subcommand("set", "set KEY VALUE");
  set->add_option("key", key)->required();
  set->add_option("value", value)->required();
  auto* get = app.add_subcommand("get", "get KEY: wait for it and print its value");
  get->add_option("key", key)->required();
  auto* add = app.add_subcommand("add", "add KEY [DELTA]: print the new value");
  add->add_option("key", key)->required();
  add->add_option("delta", delta);
  auto* cas = app.add_subcommand("compare-set", "compare-set KEY EXPECTED DESIRED");
  cas->add_option("key", key)->required();
  cas->add_option("expected", expected)->required();
  cas->add_option("desired", value)->required();
  auto* check = app.add_subcommand("check", "check KEY...: print true if all exist");
  check->add_option("keys", keys)->required();
  auto* wait = app.add_subcommand("wait", "wait KEY...: until all exist");
  wait->add_option("keys", keys)->required();
  auto* del = app.add_subcommand("delete", "delete KEY");
  del->add_option("key", key)->required();
  auto* num = app.add_subcommand("num-keys", "print how many keys the namespace holds");
  auto* append = app.add_subcommand("append", "append KEY VALUE");
  append->add_option("key", key)->required();
  append->add_option("value", value)->required();
  auto* health = app.add_subcommand(
      "health", "ask the grpc.health.v1 service; print SERVING (exit 0) or why not (exit 1)");
  bool json = false, watch = false;
  double intervalS = 2;
  auto* runsCmd = app.add_subcommand("runs", "every run the service knows: state, round, nodes, ranks, age");
  auto* statusCmd = app.add_subcommand(
      "status", "one run's nodes (host, ranks, launch's pid and version, last heartbeat, restarts left) and their "
                "ranks (pid, state, last output and file-timer request, memory, exit code)");
  std::string statusRun;
  statusCmd->add_option("--run", statusRun, "the run (--rdzv_id)")->required();
  for (auto* view : {runsCmd, statusCmd}) {
    view->add_flag("--json", json, "JSON, for scripts");
    view->add_flag("--watch", watch, "redraw in place every --interval, as watch(1); q or Ctrl-C ends it");
    view->add_option("--interval", intervalS, "seconds between redraws with --watch")
        ->capture_default_str()
        ->check(CLI::Range(0.1, 3600.0));
  }
  std::string stopRunId;
  auto* stopCmd = app.add_subcommand(
      "stop", "ask a running job to stop at one step: every rank that asks stop_requested(step) is told True at "
              "the same step, saves and exits; launch exits 75 (its ranks that never ask are stopped after "
              "launch's --stop_timeout)");
  stopCmd->add_option("--run", stopRunId, "the run (--rdzv_id)")->required();
  long launchPid = 0;
  auto* stacks = app.add_subcommand(
      "stacks", "print the stack of every thread of every rank of a running job (a roll-call); the "
                "job runs on");
  std::string runId;
  auto* byPid = stacks->add_option("--pid", launchPid, "a launch on this host: its pid")->check(CLI::PositiveNumber);
  auto* byRun = stacks->add_option("--run", runId,
                                   "every node of this run (--rdzv_id), through the rendezvous at --addr (or --etcd)");
  byPid->excludes(byRun);
  stacks->require_option(1);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "rendezvousctl: %s (see --help)\n", e.what());
    return 2;
  }
  if (app.get_subcommands().empty()) {
    std::fprintf(stderr, "rendezvousctl: a subcommand is required: set, get, add, compare-set, "
                 "check, wait, delete, num-keys, append, health, runs, status, stop or stacks (see --help)\n");
    return 2;
  }
  if (!etcdEndpoints.empty() && !(*stacks && !runId.empty()) && !*runsCmd && !*statusCmd && !*stopCmd) {
    std::fprintf(stderr, "rendezvousctl: --etcd is for runs, status, stop and stacks --run (runs whose rendezvous is in "
                 "etcd)\n");
    return 2;
  }
  if (escaped) {
    std::string error;
    auto unescape = [&](const char* what, std::string& text) {
      if (!error.empty()) return;
      std::string raw, why;
      if (absl::CUnescape(text, &raw, &why)) {
        text = std::move(raw);
      } else {
        error = fmt::format("{} '{}': {}", what, text, why);
      }
    };
    unescape("key", key);
    unescape("value", value);
    unescape("expected value", expected);
    for (auto& k : keys) unescape("key", k);
    if (!error.empty()) {
      std::fprintf(stderr, "rendezvousctl: --escaped: %s\n", error.c_str());
      return 2;
    }
  }
  auto show = [escaped](const std::string& bytes) {
    return escaped ? absl::CHexEscape(bytes) : bytes;
  };
  if (!tokenFile.empty()) {
    auto token = muster::readToken(tokenFile);
    if (!token.ok()) return failed(token.status());
    options.token = *token;
  }
  if (!caFile.empty()) {
    auto ca = muster::readFile(caFile, "TLS CA");
    if (!ca.ok()) return failed(ca.status());
    options.tlsCaPem = *ca;
  }
  auto deadline = muster::deadlineAfter(muster::Millis(static_cast<int64_t>(timeoutS * 1000)));
  if (*health) return checkHealth(options, timeoutS);
  if (*stacks && launchPid > 0) return launchStacks(launchPid, timeoutS);
  if (*runsCmd || *statusCmd) {
    if (json && watch) {
      std::fprintf(stderr, "rendezvousctl: --json and --watch do not go together\n");
      return 2;
    }
    RunViews views{options, timeoutS, etcdEndpoints, etcdConf};
    // Whatever goes wrong while a view is made is the view's one line (under --watch too, whose
    // terminal must be given back), never an exception out of main.
    std::function<std::string(int, bool&)> render = [&](int width, bool& ok) {
      try {
        return *runsCmd ? views.runs(width, json, ok) : views.status(statusRun, width, json, ok);
      } catch (const std::exception& e) {
        ok = false;
        return fmt::format("rendezvousctl: {}: {}\n", *runsCmd ? "runs" : "status", e.what());
      }
    };
    if (watch) {
      return muster::rendezvous::watchScreen([&](int width) {
        bool ok = true;
        return render(width, ok);
      }, intervalS);
    }
    bool ok = true;
    std::string out = render(0, ok);
    std::fwrite(out.data(), 1, out.size(), ok ? stdout : stderr);
    return ok ? 0 : 1;
  }
  if (*stopCmd) {
    RunViews views{options, timeoutS, etcdEndpoints, etcdConf};
    return stopRun(views, stopRunId);
  }
  if (*stacks && !etcdEndpoints.empty()) return etcdStacks(etcdEndpoints, etcdConf, runId, timeoutS);
  if (*stacks) return runStacks(options, runId, timeoutS);
  auto client = StoreClient::connect(options, deadline);
  if (!client.ok()) return failed(client.status());
  auto& store = **client;
  if (*set) {
    // A set is posted without waiting; the tool's answer is whether the store took it.
    auto s = store.set(key, value);
    if (s.ok()) s = store.flush(deadline);
    return s.ok() ? 0 : failed(s);
  }
  if (*get) {
    auto v = store.get(key, deadline);
    if (!v.ok()) return failed(v.status());
    std::cout << show(*v) << std::endl;
    return 0;
  }
  if (*add) {
    auto v = store.add(key, delta);
    if (!v.ok()) return failed(v.status());
    std::cout << *v << std::endl;
    return 0;
  }
  if (*cas) {
    auto v = store.compareSet(key, expected, value);
    if (!v.ok()) return failed(v.status());
    std::cout << show(*v) << std::endl;
    return 0;
  }
  if (*check) {
    auto v = store.check(keys);
    if (!v.ok()) return failed(v.status());
    std::cout << (*v ? "true" : "false") << std::endl;
    return 0;
  }
  if (*wait) {
    auto s = store.wait(keys, deadline);
    return s.ok() ? 0 : failed(s);
  }
  if (*del) {
    auto v = store.deleteKey(key);
    if (!v.ok()) return failed(v.status());
    std::cout << (*v ? "deleted" : "absent") << std::endl;
    return 0;
  }
  if (*num) {
    auto v = store.numKeys();
    if (!v.ok()) return failed(v.status());
    std::cout << *v << std::endl;
    return 0;
  }
  if (*append) {
    auto v = store.append(key, value);
    if (!v.ok()) return failed(v.status());
    std::cout << *v << std::endl;
    return 0;
  }
  return 2;
}
