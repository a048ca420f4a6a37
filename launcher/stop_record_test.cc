// The stop record: its path, its JSON both ways, and files launch does not write.
#include "launcher/stop_record.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace muster::launcher {
namespace {

namespace fs = std::filesystem;

TEST(StopRecord, ThePathIsTheOneGivenElseInTheSharedDirNamedByTheRunId) {
  EXPECT_EQ(stopRecordPath("/kept/here.json", "/shared", "job"), "/kept/here.json");
  EXPECT_EQ(stopRecordPath("", "/shared", "1234"), "/shared/.muster-stopped-1234.json");
  EXPECT_EQ(stopRecordPath("", "/shared", "a/b c%"), "/shared/.muster-stopped-a%2Fb%20c%25.json");
  EXPECT_EQ(stopRecordPath("", "", "job"), "");
}

TEST(StopRecord, WrittenWholeAndReadBack) {
  fs::path dir = fs::temp_directory_path() / ("muster-stop-record-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::string path = (dir / "r.json").string();
  EXPECT_EQ(readStopRecord(path).status().code(), absl::StatusCode::kNotFound);
  StopRecord r{.runId = "job\"1\n", .step = (int64_t{1} << 62), .reason = "SIGUSR1", .unixMs = 1795845600000};
  ASSERT_TRUE(writeStopRecord(path, r).ok());
  auto back = readStopRecord(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->runId, r.runId);
  EXPECT_EQ(back->step, r.step);
  EXPECT_EQ(back->reason, r.reason);
  EXPECT_EQ(back->unixMs, r.unixMs);
  // No temporary file is left beside it.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
  std::ofstream(path) << std::string(70000, ' ');
  auto huge = readStopRecord(path);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(huge.status().message().find("larger than a stop record"), std::string::npos);
  fs::remove_all(dir);
}

TEST(StopRecord, WhatLaunchDoesNotWriteIsOneLineNamingWhy) {
  for (const auto& [text, why] : std::vector<std::pair<std::string, std::string>>{
           {"", "not a JSON object"},
           {"[1]", "not a JSON object"},
           {"{\"step\": 12", "not a JSON object"},
           {"{\"run_id\": \"j\", \"reason\": \"r\", \"unix_ms\": 0}", "no field 'step'"},
           {"{\"run_id\": \"j\", \"step\": \"7\", \"reason\": \"r\", \"unix_ms\": 0}", "field 'step' is of another type"},
           {"{\"run_id\": \"j\", \"step\": 1.5, \"reason\": \"r\", \"unix_ms\": 0}", "field 'step' is of another type"},
           {"{\"run_id\": \"j\", \"step\": -1, \"reason\": \"r\", \"unix_ms\": 0}", "a negative step"},
           {"{\"run_id\": \"j\", \"step\": 9223372036854775808, \"reason\": \"r\", \"unix_ms\": 0}", "a step past 2^63"},
           {"{\"run_id\": 5, \"step\": 1, \"reason\": \"r\", \"unix_ms\": 0}", "field 'run_id' is of another type"},
       }) {
    auto r = parseStopRecord(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << text;
    EXPECT_EQ(r.status().message(), why) << text;
  }
  // Fields of a later version are no error.
  auto later = parseStopRecord("{\"run_id\": \"j\", \"step\": 3, \"reason\": \"r\", \"unix_ms\": 9, \"more\": [1]}");
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(later->step, 3);
}

}  // namespace
}  // namespace muster::launcher
