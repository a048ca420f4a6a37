// A flood of connections on rendezvousd's port while two jobs rendezvous and run. The daemon
// used to exit when its descriptors ran out (gRPC 1.51's listener stops for good after a failed
// accept), taking every job's rendezvous with it; anyone who could reach the port, without a
// token, could do that. Now the port is the daemon's own (ConnectionGate): a stranger's
// connections past the caps give way, oldest first, and the members' work goes on.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "common/deadline.h"
#include "tests/support/child.h"
#include "tests/support/programs.h"
#include "tests/support/metrics.h"

namespace muster {
namespace {

using testing::buildDir;
using testing::ctlPath;
using testing::launchPath;
using testing::rendezvousdPath;
using testing::Child;
namespace fs = std::filesystem;
constexpr Millis kRun{120000};

// 5,000 connections from 127.0.0.2, opened as fast as they go and held, then all closed; and
// again, until `stop` exists (at most 60 s). Prints "flooding" once the first 1,000 are open and
// the total opened at the end. Their own ports are 10000-14999, below the kernel's ephemeral
// range: the flood takes none of the ports other tests get from bind(0) and bind again later on
// every address (torch's TCPStore server listens on 0.0.0.0), which an ephemeral port held on
// 127.0.0.2 would refuse.
constexpr char kFlooder[] = R"PY(
import os, socket, sys, time
port, stop = int(sys.argv[1]), sys.argv[2]
opened, said, start = 0, False, time.time()
while not os.path.exists(stop) and time.time() - start < 60:
    held = []
    for i in range(5000):
        try:
            s = socket.socket()
        except OSError:  # out of descriptors here: hold what is open
            break
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # last round's in TIME_WAIT
            s.bind(("127.0.0.2", 10000 + i))
            s.connect(("127.0.0.1", port))
            held.append(s)
            opened += 1
        except OSError:
            s.close()
        if opened == 1000 and not said:
            print("flooding", file=sys.stderr, flush=True)
            said = True
    for s in held:
        s.close()
print("opened", opened, file=sys.stderr, flush=True)
)PY";

TEST(ConnectionFlood, TwoJobsRendezvousAndFinishThroughFiveThousandConnections) {
  fs::path dir = testing::freshTestDir("muster-flood");
  fs::path token = dir / "token";
  std::ofstream(token) << "flood-test-token\n";
  chmod(token.c_str(), 0600);
  // 1,024 descriptors: the flood is four times what the daemon can hold (768 connections).
  Child daemon({"/usr/bin/prlimit", "--nofile=1024:1024", "--", rendezvousdPath(),
                "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0", "--token-file", token.string(),
                "--max-connections-per-peer", "256"});
  auto store = daemon.waitForLine(R"(store listening on (127\.0\.0\.1:(\d+)))", kRun);
  auto metrics = daemon.waitForLine(R"(metrics on http://127\.0\.0\.1:(\d+)/metrics)", kRun);
  ASSERT_TRUE(store && metrics) << daemon.stderrText();
  std::string address = (*store)[1];
  int metricsPort = std::stoi((*metrics)[1]);

  std::ofstream(dir / "flooder.py") << kFlooder;
  fs::path stop = dir / "stop";
  Child flooder(std::vector<std::string>{"/usr/bin/python3", (dir / "flooder.py").string(), std::string((*store)[2]), stop.string()});
  ASSERT_TRUE(flooder.waitForLine("flooding", kRun)) << flooder.stderrText();

  // Each rank leaves its key in its job's namespace on the daemon, and runs a while.
  fs::path worker = dir / "worker.sh";
  std::ofstream(worker) << "#!/bin/bash\nset -e\nsleep 0.5\nexec " << buildDir()
                        << "/rendezvous/rendezvousctl --addr \"$MUSTER_STORE_ADDR\" --ns "
                           "\"$MUSTER_STORE_NAMESPACE\" --token-file \"$MUSTER_STORE_TOKEN_FILE\" "
                           "set rank$RANK done\n";
  chmod(worker.c_str(), 0755);
  std::vector<std::unique_ptr<Child>> nodes;
  for (std::string job : {"flood-a", "flood-b"}) {
    for (int node = 0; node < 2; ++node) {
      nodes.push_back(std::make_unique<Child>(
          std::vector<std::string>{launchPath(), "--nnodes=2", "--nproc_per_node=2",
                                   "--rdzv_backend=c10d", "--rdzv_endpoint=" + address,
                                   "--rdzv_id=" + job, worker.string()},
          std::vector<std::string>{"MUSTER_STORE_TOKEN_FILE=" + token.string()}));
    }
  }
  for (auto& node : nodes) {
    auto exit = node->wait(kRun);
    ASSERT_TRUE(exit.has_value()) << node->stderrText();
    EXPECT_EQ(exit->code, 0) << node->stderrText();
  }
  std::ofstream(stop) << "";
  ASSERT_TRUE(flooder.wait(kRun).has_value());
  auto opened = flooder.waitForLine(R"(opened (\d+))", Millis(1000));
  ASSERT_TRUE(opened) << flooder.stderrText();
  EXPECT_GE(std::stoi((*opened)[1]), 5000);

  // Nothing lost: every rank's key is in its job's namespace (round 0: no restart).
  for (std::string job : {"flood-a", "flood-b"}) {
    for (int rank = 0; rank < 4; ++rank) {
      Child get({ctlPath(), "--addr", address, "--token-file", token.string(),
                 "--ns", job + "/0", "get", "rank" + std::to_string(rank)});
      ASSERT_EQ(get.wait(kRun)->code, 0) << job << " rank " << rank << ": " << get.stderrText();
      EXPECT_EQ(get.stdoutText(), "done\n");
    }
  }
  // The flood met the cap, and the daemon is up and serving.
  std::string scraped = testing::httpBody(testing::httpGet(metricsPort, "/metrics"));
  EXPECT_GT(testing::metricValue(scraped, "muster_connections_closed_total{why=\"evicted\"}").value_or(0), 0)
      << scraped;
  Child health({ctlPath(), "--addr", address, "--timeout", "1", "health"});
  ASSERT_EQ(health.wait(kRun)->code, 0) << health.stderrText() << daemon.stderrText();
  EXPECT_EQ(health.stdoutText(), "SERVING\n");
  EXPECT_FALSE(daemon.wait(Millis(0)).has_value()) << daemon.stderrText();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace muster
