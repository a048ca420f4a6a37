// The stop board's rule (common/stop_board.h), on real files: the answers, the freeze and the
// post, bad files, and ranks in separate processes racing a freeze.
#include "common/stop_board.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <thread>

#include <gtest/gtest.h>

namespace muster::stopboard {
namespace {

namespace fs = std::filesystem;

class StopBoard : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/muster-stopboard-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/board";
  }
  void TearDown() override { fs::remove_all(dir_); }
  int openBoard() {
    int fd = open(path_.c_str(), O_RDWR | O_CLOEXEC);
    EXPECT_GE(fd, 0);
    return fd;
  }
  std::string dir_, path_;
};

TEST_F(StopBoard, RanksGoOnBelowTheHorizonAndWaitPastAFrozenOneUntilTheStepIsPosted) {
  ASSERT_TRUE(create(path_, 2).ok());
  int fd = openBoard();
  auto a = ask(fd, 0, 0, 1);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->answer, Answer::kGoOn);
  EXPECT_EQ(a->horizon, 1);
  a = ask(fd, 1, 5, 10);  // another rank, further on, asking ten steps ahead
  EXPECT_EQ(a->answer, Answer::kGoOn);
  EXPECT_EQ(a->horizon, 15);
  auto b = read(path_);
  EXPECT_EQ(b->asked, (std::vector<int64_t>{0, 5}));
  auto frozen = freeze(path_);
  ASSERT_TRUE(frozen.ok());
  EXPECT_TRUE(frozen->frozen);
  EXPECT_EQ(frozen->horizon, 15);
  EXPECT_EQ(ask(fd, 0, 14, 1)->answer, Answer::kGoOn);  // below the horizon: already promised
  EXPECT_EQ(ask(fd, 0, 15, 1)->answer, Answer::kWait);
  EXPECT_EQ(read(path_)->horizon, 15) << "a frozen horizon never moves";
  auto posted = post(path_, 15, 10);
  ASSERT_TRUE(posted.ok()) << posted.status();
  EXPECT_EQ(ask(fd, 0, 14, 1)->answer, Answer::kGoOn);
  EXPECT_EQ(ask(fd, 0, 15, 1)->answer, Answer::kStop);
  EXPECT_EQ(ask(fd, 1, 16, 1)->answer, Answer::kStop);
  EXPECT_EQ(ask(fd, 1, 16, 1)->stopStep, 15);
  EXPECT_EQ(read(path_)->reason, 10);
  close(fd);
}

TEST_F(StopBoard, AStopStepBelowTheHorizonOrOnABoardNotFrozenIsRefusedAndTheFirstPostStays) {
  ASSERT_TRUE(create(path_, 1).ok());
  int fd = openBoard();
  ASSERT_TRUE(ask(fd, 0, 7, 1).ok());
  EXPECT_EQ(post(path_, 8, 10).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(freeze(path_).ok());
  EXPECT_EQ(post(path_, 7, 10).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(post(path_, 9, 10)->stopStep, 9);
  EXPECT_EQ(post(path_, 12, 15)->stopStep, 9);
  EXPECT_EQ(read(path_)->reason, 10);
  close(fd);
}

TEST_F(StopBoard, ForeignShortAndUnknownSlotsAreOneLineErrorsNotCrashes) {
  EXPECT_EQ(read(path_).status().code(), absl::StatusCode::kNotFound);
  { std::ofstream(path_) << "not a board at all, but long enough to fill a header of 64 bytes....."; }
  auto bad = read(path_);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(bad.status().message()).find("is not a stop board"), std::string::npos);
  ASSERT_TRUE(create(path_, 4).ok());
  fs::resize_file(path_, 8 * 8 + 8);  // two of four slots cut off
  EXPECT_EQ(read(path_).status().code(), absl::StatusCode::kDataLoss);
  ASSERT_TRUE(create(path_, 2).ok());
  int fd = openBoard();
  EXPECT_EQ(ask(fd, 2, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ask(fd, 0, -1, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ask(fd, 0, INT64_MAX - 1, 8)->horizon, INT64_MAX) << "no overflow";
  close(fd);
  EXPECT_EQ(create(path_, kMaxSlots + 1).code(), absl::StatusCode::kInvalidArgument);
}

// Ranks in processes of their own, each asking every step as fast as it can (keeping the
// horizon it was given, as stopRequested does) with random pauses, while the test freezes and
// posts at a random moment: every rank stops at the same step, told go-on at every step before.
TEST_F(StopBoard, RanksRacingAFreezeAllStopAtOneStep) {
  constexpr int kRanks = 6;
  for (int trial = 0; trial < 20; ++trial) {
    ASSERT_TRUE(create(path_, kRanks).ok());
    std::vector<pid_t> pids;
    std::vector<int> pipes;
    for (int r = 0; r < kRanks; ++r) {
      int p[2];
      ASSERT_EQ(pipe(p), 0);
      pid_t pid = fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        close(p[0]);
        int fd = open(path_.c_str(), O_RDWR);
        std::mt19937 rng(trial * 100 + r);
        int64_t horizon = 0, goOn = 0;
        for (int64_t step = 0;; ++step) {
          Answer answer = Answer::kGoOn;
          if (step >= horizon) {
            while (true) {
              auto a = ask(fd, r, step, 1 + rng() % 4);
              if (!a.ok()) _exit(3);
              if (a->answer != Answer::kWait) {
                answer = a->answer;
                horizon = a->horizon;
                break;
              }
              usleep(200);
            }
          }
          if (answer == Answer::kStop || step > 20'000'000) {  // the cap: never told, the test fails
            int64_t out[2] = {answer == Answer::kStop ? step : -1, goOn};
            if (write(p[1], out, sizeof out) != sizeof out) _exit(4);
            _exit(0);
          }
          ++goOn;
          if (rng() % 50 == 0) usleep(rng() % 300);
        }
      }
      close(p[1]);
      pids.push_back(pid);
      pipes.push_back(p[0]);
    }
    // Every rank has asked (on a loaded machine a freeze before any rank ran races nothing),
    // then the freeze comes at a random moment.
    auto started = std::chrono::steady_clock::now();
    while (true) {
      auto b = read(path_);
      ASSERT_TRUE(b.ok());
      if (std::all_of(b->asked.begin(), b->asked.end(), [](int64_t s) { return s != kNone; })) break;
      if (std::chrono::steady_clock::now() - started > std::chrono::seconds(60)) {
        for (pid_t pid : pids) kill(pid, SIGKILL);
        for (pid_t pid : pids) waitpid(pid, nullptr, 0);
        FAIL() << "trial " << trial << ": the ranks did not start";
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(std::mt19937(trial)() % 20000));
    auto frozen = freeze(path_);
    auto posted = frozen.ok() ? post(path_, frozen->horizon, 10) : frozen.status();
    if (!posted.ok()) {
      for (pid_t pid : pids) kill(pid, SIGKILL);
      for (pid_t pid : pids) waitpid(pid, nullptr, 0);
      FAIL() << "trial " << trial << ": " << posted.status();
    }
    std::set<int64_t> steps;
    for (int r = 0; r < kRanks; ++r) {
      int64_t got[2] = {-1, -1};
      ssize_t n = ::read(pipes[r], got, sizeof got);  // a rank ends at the stop, or its cap
      close(pipes[r]);
      int status = 0;
      waitpid(pids[r], &status, 0);
      EXPECT_EQ(n, static_cast<ssize_t>(sizeof got)) << "rank " << r;
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      EXPECT_EQ(got[1], got[0]) << "rank " << r << " was told go-on " << got[1] << " times before step " << got[0];
      steps.insert(got[0]);
    }
    EXPECT_EQ(steps.size(), 1u) << "trial " << trial;
    EXPECT_EQ(*steps.begin(), frozen->horizon);
  }
}

}  // namespace
}  // namespace muster::stopboard
