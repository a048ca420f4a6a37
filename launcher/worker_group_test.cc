// WorkerGroup with real processes: when its round is over, and only once.
#include "launcher/worker_group.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "launcher/reaper.h"

namespace muster::launcher {
namespace {

using std::chrono::milliseconds;

// Runs `group`'s loop, reaping as launch does on SIGCHLD, until `done` or 10 s.
template <typename Done>
void runUntil(boost::asio::io_context& io, WorkerGroup& group, Done done) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    group.reap();
    io.poll();
    io.restart();
    std::this_thread::sleep_for(milliseconds(5));
  }
}

// launch reaps its group on every SIGCHLD, and a round's leftovers (a worker's own children,
// which launch reaps as child subreaper) send theirs after the round has settled, even once the
// next round's rendezvous has begun. The round's end must be seen once: a second "settled" was
// taken for the next round's success before its workers started.
TEST(WorkerGroup, SettlesOnceThoughReapedAgainAfterwards) {
  boost::asio::io_context io;
  Reaper reaper;
  ASSERT_TRUE(reaper.start().ok());
  WorkerGroup group(io, reaper, [](const WorkerState&) {}, {});
  int settled = 0;
  group.onSettled([&] { ++settled; });
  WorkerSpec spec;
  spec.argv = {"/bin/sh", "-c", "echo out; echo err >&2"};
  spec.env = {{"PATH", "/usr/bin:/bin"}};
  spec.stdoutToConsole = spec.stderrToConsole = false;
  std::vector<WorkerSpec> specs{spec, spec};
  specs[1].localRank = specs[1].globalRank = 1;
  ASSERT_TRUE(group.start(specs).ok());
  runUntil(io, group, [&] { return settled > 0; });
  ASSERT_EQ(settled, 1);
  ASSERT_TRUE(group.settled());
  for (int i = 0; i < 3; ++i) {
    group.reap();  // another SIGCHLD
    io.poll();
    io.restart();
  }
  EXPECT_EQ(settled, 1);
}

}  // namespace
}  // namespace muster::launcher
