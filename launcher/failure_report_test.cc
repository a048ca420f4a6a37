// The failure report: torchrun's error file in each of its forms, the root cause with its
// error file and stderr, and torchrun's summary.
#include "launcher/failure_report.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace muster::launcher {
namespace {

class FailureReport : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("failure-report-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string file(const std::string& name, const std::string& text) {
    auto path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(FailureReport, ErrorFileInEachOfTorchrunsForms) {
  EXPECT_EQ(readErrorFile(file("a.json", R"({"message": "boom", "timestamp": 1})")), "boom");
  EXPECT_EQ(readErrorFile(file("b.json", R"({"message": {"message": "ValueError: x",
      "extraInfo": {"py_callstack": "Traceback:\n  f.py:3\nValueError: x", "timestamp": "1"}}})")),
            "Traceback:\n  f.py:3\nValueError: x");
  EXPECT_EQ(readErrorFile(file("c.json", R"({"message": {"message": "RuntimeError: y"}})")),
            "RuntimeError: y");
  EXPECT_EQ(readErrorFile((dir_ / "missing.json").string()), "");
  EXPECT_NE(readErrorFile(file("d.json", "{truncated")).find("not torchrun's JSON"),
            std::string::npos);
  EXPECT_NE(readErrorFile(file("e.json", R"({"other": 1})")).find("not torchrun's JSON"),
            std::string::npos);
}

TEST_F(FailureReport, NamesTheRootCauseWithItsErrorFileAndStderrThenTorchrunsSummary) {
  Failure root{.globalRank = 3, .localRank = 1, .pid = 4242, .exit = {.code = 7},
               .errorFile = "/logs/attempt_0/1/error.json", .errorMessage = "Traceback\nKeyError: 'x'",
               .lastLines = {"loading", "KeyError: 'x'"}};
  Failure other{.globalRank = 0, .localRank = 0, .pid = 4241, .exit = {.code = -1, .signal = SIGSEGV}};
  std::string text = failureReport("train.py", root, {other}, "node-a");
  for (const char* want : {"launch: root cause: rank 3 (local_rank 1, pid 4242) exited with code 7\n",
                           "  error file /logs/attempt_0/1/error.json:\n    Traceback\n    KeyError: 'x'\n",
                           "  last 2 line(s) of its stderr:\n    loading\n    KeyError: 'x'\n",
                           "train.py FAILED\n",
                           "[1]:\n", "  rank      : 0 (local_rank: 0)\n",
                           "  exitcode  : -11 (SIGSEGV) (pid: 4241)\n",
                           "  traceback : Signal 11 (SIGSEGV) received by PID 4241\n",
                           "Root Cause (first observed failure):\n[0]:\n",
                           "  host      : node-a\n", "  exitcode  : 7 (pid: 4242)\n",
                           "  error_file: /logs/attempt_0/1/error.json\n"}) {
    EXPECT_NE(text.find(want), std::string::npos) << "missing: " << want << "\nin:\n" << text;
  }
  EXPECT_EQ(text.find("<NO_OTHER_FAILURES>"), std::string::npos);
  std::string alone = failureReport("train.py", root, {}, "node-a");
  EXPECT_NE(alone.find("<NO_OTHER_FAILURES>"), std::string::npos);
}

TEST(FailureReportExit, WhatLaunchesOwnStopExplains) {
  EXPECT_TRUE(endedByStop({.code = -1, .signal = SIGTERM}));
  EXPECT_TRUE(endedByStop({.code = -1, .signal = SIGKILL}));
  EXPECT_TRUE(endedByStop({.code = 128 + SIGTERM}));
  EXPECT_FALSE(endedByStop({.code = 1}));
  EXPECT_FALSE(endedByStop({.code = -1, .signal = SIGSEGV}));
  EXPECT_EQ(describeExit({.code = 3}), "exited with code 3");
  EXPECT_EQ(describeExit({.code = -1, .signal = SIGSEGV}), "was killed by SIGSEGV");
}

}  // namespace
}  // namespace muster::launcher
