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
  root.traceback = "Traceback\n  KeyError: 'x'";
  std::string text = failureReport("train.py", root, {other}, "node-a");
  for (const char* want : {"launch: root cause: rank 3 (local_rank 1, pid 4242) exited with code 7\n",
                           "  error file /logs/attempt_0/1/error.json:\n    Traceback\n    KeyError: 'x'\n",
                           "  last 2 line(s) of its stderr:\n    loading\n    KeyError: 'x'\n",
                           "train.py FAILED\n",
                           "[1]:\n", "  rank      : 0 (local_rank: 0)\n",
                           "  exitcode  : -11 (pid: 4241)  (SIGSEGV)\n",
                           "  traceback : Signal 11 (SIGSEGV) received by PID 4241\n",
                           "Root Cause (first observed failure):\n[0]:\n",
                           "  host      : node-a\n", "  exitcode  : 7 (pid: 4242) \n",
                           "  error_file: /logs/attempt_0/1/error.json\n",
                           "  traceback : Traceback\n  KeyError: 'x'\n"}) {
    EXPECT_NE(text.find(want), std::string::npos) << "missing: " << want << "\nin:\n" << text;
  }
  // Before 2.14 torchrun does not name the signal; a rank with an exit code and no error file
  // gets torchrun's hint.
  Failure bare{.globalRank = 2, .localRank = 0, .pid = 11, .exit = {.code = 3}};
  std::string old = failureReport("train.py", bare, {other}, "node-a", *TorchrunVersion::parse("2.6"));
  for (const char* want : {"  exitcode  : -11 (pid: 4241)\n", "  exitcode  : 3 (pid: 11)\n",
                           "  traceback : To enable traceback see: "
                           "https://pytorch.org/docs/stable/elastic/errors.html\n"}) {
    EXPECT_NE(old.find(want), std::string::npos) << "missing: " << want << "\nin:\n" << old;
  }
  EXPECT_EQ(text.find("<NO_OTHER_FAILURES>"), std::string::npos);
  std::string alone = failureReport("train.py", root, {}, "node-a");
  EXPECT_NE(alone.find("<NO_OTHER_FAILURES>"), std::string::npos);
}

// torchrun's _format_failure: a structured file's stack indented under "traceback :", a plain
// message as it is.
TEST_F(FailureReport, SummaryTracebackAsTorchrunShowsIt) {
  EXPECT_EQ(summaryTraceback(file("a.json", R"({"message": {"message": "ValueError: x",
      "extraInfo": {"py_callstack": "Traceback:\n  f.py:3\nValueError: x\n", "timestamp": "1"}}})")),
            "Traceback:\n    f.py:3\n  ValueError: x\n  ");
  EXPECT_EQ(summaryTraceback(file("b.json", R"({"message": "one\ntwo", "timestamp": 1})")), "one\ntwo");
  EXPECT_EQ(summaryTraceback((dir_ / "missing.json").string()), "");
  EXPECT_NE(summaryTraceback(file("c.json", "{")).find("not torchrun's JSON"), std::string::npos);
}

// The launcher's TORCHELASTIC_ERROR_FILE gets the root cause's file with its exit code, as
// torchrun's @record writes it; without a worker's file, nothing.
TEST_F(FailureReport, HandsTheRootCausesErrorFileOver) {
  std::string dest = (dir_ / "launcher.json").string();
  Failure root{.globalRank = 1, .localRank = 1, .pid = 9, .exit = {.code = -1, .signal = SIGSEGV},
               .errorFile = file("e.json", R"({"message": {"message": "RuntimeError: y", "extraInfo": {"py_callstack": "tb", "timestamp": "5"}}})")};
  std::ofstream(dest) << "old";
  ASSERT_TRUE(handOverErrorFile(root, dest).ok());
  std::ifstream in(dest);
  std::string got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(got, R"({"message": {"message": "RuntimeError: y", "extraInfo": {"py_callstack": "tb", "timestamp": "5"}, "errorCode": -11}})");
  // A plain message has no place for the code; it is copied as it is.
  root.errorFile = file("p.json", R"({"message": "plain", "timestamp": 3})");
  ASSERT_TRUE(handOverErrorFile(root, dest).ok());
  std::ifstream in2(dest);
  got.assign(std::istreambuf_iterator<char>(in2), std::istreambuf_iterator<char>());
  EXPECT_EQ(got, R"({"message": "plain", "timestamp": 3})");
  Failure none{.globalRank = 0, .exit = {.code = 2}};
  std::filesystem::remove(dest);
  ASSERT_TRUE(handOverErrorFile(none, dest).ok());
  EXPECT_FALSE(std::filesystem::exists(dest));
  root.errorFile = file("bad.json", "{trunc");
  auto bad = handOverErrorFile(root, dest);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("bad.json"), std::string::npos) << bad.message();
  Failure unwritable{.errorFile = file("ok.json", "{}")};
  EXPECT_FALSE(handOverErrorFile(unwritable, (dir_ / "no" / "such" / "x.json").string()).ok());
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
