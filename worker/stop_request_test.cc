// stopRequested() against a real board (common/stop_board.h): a fast loop is promised about a
// millisecond of steps at a time (not one step a lock), a slow one a step; without launch, false.
#include "worker/stop_request.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "common/stop_board.h"

namespace muster::worker {
namespace {

TEST(StopRequested, AFastLoopIsPromisedMoreThanOneStepAtATimeAndASlowOneOne) {
  char dir[] = "/tmp/muster-stoprequest-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  std::string board = std::string(dir) + "/board";
  ASSERT_TRUE(stopboard::create(board, 1).ok());
  setenv("MUSTER_STOP_FILE", board.c_str(), 1);
  setenv("MUSTER_STOP_SLOT", "0", 1);
  // A slow loop first: a step every 3 ms is promised one step at a time.
  int64_t step = 0;
  for (; step < 5; ++step) {
    EXPECT_FALSE(stopRequested(step));
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
  }
  EXPECT_EQ(stopboard::read(board)->horizon, step) << "a slow loop was promised more than its next step";
  // Then as fast as it goes for 20 ms: the horizon runs ahead of the step (one lock a step
  // would keep it at most one step ahead), by at most 256.
  int64_t lead = 0;
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
  for (int i = 0; std::chrono::steady_clock::now() < until; ++i) {
    EXPECT_FALSE(stopRequested(step));
    if (i % 64 == 0) lead = std::max(lead, stopboard::read(board)->horizon - step);
    ++step;
  }
  EXPECT_GT(lead, 2) << "a fast loop locks the board at every step";
  EXPECT_LE(lead, 256);
  std::filesystem::remove_all(dir);
}

TEST(ResumedFromStep, TheStepLaunchGaveOrNoneAndAValueThatIsNoStepIsAnError) {
  unsetenv("MUSTER_RESUMED_FROM_STEP");
  EXPECT_FALSE(resumedFromStep().has_value());
  setenv("MUSTER_RESUMED_FROM_STEP", "4611686018427387904", 1);
  EXPECT_EQ(resumedFromStep(), int64_t{1} << 62);
  for (const char* bad : {"", "-1", "12x", " 3", "9223372036854775808"}) {
    setenv("MUSTER_RESUMED_FROM_STEP", bad, 1);
    try {
      resumedFromStep();
      ADD_FAILURE() << "taken: '" << bad << "'";
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()), "MUSTER_RESUMED_FROM_STEP='" + std::string(bad) + "' is not a step");
    }
  }
  unsetenv("MUSTER_RESUMED_FROM_STEP");
}

}  // namespace
}  // namespace muster::worker
