// parseDump on faulthandler's and the native handler's text; grouping and the report.
#include "stacks/stacks.h"

#include <gtest/gtest.h>

namespace muster::stacks {
namespace {

// What Python 3.11's faulthandler wrote for a process whose main thread called train_step
// while a thread slept in loader.
constexpr const char* kPython = R"(muster-stacks pid=4242 python
Thread 0x00007f9e27f4b6c0 (most recent call first):
  File "/tmp/fh.py", line 5 in loader
  File "/usr/lib/python3.11/threading.py", line 975 in run

Current thread 0x00007f9e283a8040 (most recent call first):
  File "/tmp/fh.py", line 8 in train_step
  File "/tmp/fh.py", line 10 in <module>
)";

constexpr const char* kNative = R"(muster-stacks pid=77 native
Thread 77 (worker) current:
/lib/x86_64-linux-gnu/libc.so.6(clock_nanosleep+0xa3)[0x7f0000000001]
/lib/x86_64-linux-gnu/libc.so.6(nanosleep+0x13)[0x7f0000000002]
/opt/muster/worker(_ZN6muster5stuckEi+0x1e)[0x55d0c2f1a2b3]
/opt/muster/worker(+0x1234)[0x55d0c2f1a2b4]
[0x7f0000000009]

Thread 78 (gloo):
/lib/x86_64-linux-gnu/libc.so.6(+0x8f2a1)[0x7f00000000a1]

Thread 79 did not answer

muster-stacks end
)";

TEST(Stacks, ParsesFaulthandlerText) {
  auto threads = parseDump(kPython);
  ASSERT_EQ(threads.size(), 2u);
  EXPECT_FALSE(threads[0].current);
  EXPECT_EQ(threads[0].id, "0x00007f9e27f4b6c0");
  ASSERT_EQ(threads[0].frames.size(), 2u);
  EXPECT_EQ(threads[0].frames[0].function, "loader");
  EXPECT_TRUE(threads[1].current);
  ASSERT_EQ(threads[1].frames.size(), 2u);
  EXPECT_EQ(frameText(threads[1].frames[0]), "train_step (fh.py:8)");
  EXPECT_EQ(threads[1].frames[1].line, 10);
}

TEST(Stacks, ParsesNativeFramesAndDemangles) {
  auto threads = parseDump(kNative);
  ASSERT_EQ(threads.size(), 3u);
  EXPECT_TRUE(threads[0].current);
  EXPECT_EQ(threads[0].id, "77");
  EXPECT_EQ(threads[0].name, "worker");
  ASSERT_EQ(threads[0].frames.size(), 5u);
  EXPECT_EQ(threads[0].frames[2].function, "muster::stuck(int)");
  EXPECT_EQ(frameText(threads[0].frames[2]), "muster::stuck(int) (worker)");
  EXPECT_EQ(frameText(threads[0].frames[3]), "?? (worker+0x1234)");
  EXPECT_EQ(threads[0].frames[4].function, "??");
  EXPECT_EQ(threads[1].name, "gloo");
  EXPECT_EQ(threads[2].id, "79");
  EXPECT_EQ(threads[2].note, "did not answer");
}

TEST(Stacks, GarbageIsSkippedNotFatal) {
  EXPECT_TRUE(parseDump("").empty());
  EXPECT_TRUE(parseDump("\x01\x02 nonsense\n(\n)[\n  File \"x\", line y in z\n").empty());
  auto t = parseDump("Thread 1 (a):\n(\n  File \"x\", line 9\n");
  ASSERT_EQ(t.size(), 1u);
  EXPECT_TRUE(t[0].frames.empty());
}

RankStacks rank(int r, const char* dump) {
  RankStacks s;
  s.rank = r;
  s.localRank = r;
  s.pid = 100 + r;
  s.host = "h";
  s.kind = "python";
  s.threads = parseDump(dump);
  return s;
}

TEST(Stacks, TheOddGroupComesFirstAndEachGroupIsPrintedOnce) {
  const char* inReduce = "Current thread 0x1 (most recent call first):\n"
                         "  File \"/t/distributed_c10d.py\", line 1536 in all_reduce\n"
                         "  File \"/t/train.py\", line 88 in train_step\n"
                         "  File \"/t/train.py\", line 100 in main\n"
                         "  File \"/t/train.py\", line 104 in <module>\n";
  const char* inLoader = "Current thread 0x1 (most recent call first):\n"
                         "  File \"/t/data.py\", line 40 in stuck_in_loader\n"
                         "  File \"/t/train.py\", line 87 in train_step\n";
  std::vector<RankStacks> ranks = {rank(0, inReduce), rank(1, inLoader), rank(2, inReduce), rank(3, inReduce)};
  RankStacks stopped;
  stopped.rank = 4;
  stopped.answer = Answer::kNoAnswer;
  stopped.state = "T (stopped), in do_signal_stop";
  ranks.push_back(stopped);
  auto groups = groupRanks(ranks);
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(groups[0].where, "stuck_in_loader (data.py:40) <- train_step (train.py:87)");
  EXPECT_EQ(groups[1].where, "did not answer within the deadline: T (stopped), in do_signal_stop");
  EXPECT_EQ(groups[2].ranks, (std::vector<int>{0, 2, 3}));
  std::string text = summary(ranks, "test");
  EXPECT_NE(text.find("  rank 1: stuck_in_loader (data.py:40)"), std::string::npos) << text;
  EXPECT_NE(text.find("  ranks 0,2,3: all_reduce (distributed_c10d.py:1536) <- train_step (train.py:88) "
                      "<- main (train.py:100)\n"),
            std::string::npos)
      << text;
  EXPECT_LT(text.find("rank 1:"), text.find("ranks 0,2,3"));
  std::string full = fullReport(ranks, "test");
  // The group's stack once, not once per rank.
  size_t first = full.find("/t/distributed_c10d.py:1536");
  ASSERT_NE(first, std::string::npos) << full;
  EXPECT_EQ(full.find("/t/distributed_c10d.py:1536", first + 1), std::string::npos) << full;
  EXPECT_NE(full.find("rank 3 (local_rank 3, pid 103, host h, python)"), std::string::npos) << full;
}

TEST(Stacks, NativeRuntimeFramesAreLeftOutOfTheSummary) {
  std::vector<RankStacks> ranks = {rank(0, kNative)};
  EXPECT_EQ(groupRanks(ranks)[0].where, "muster::stuck(int) (worker) <- ?? (worker+0x1234) <- ?? (0x7f0000000009)");
}

// A program run under a sanitizer: its runtime's interceptor (TSan's usleep) is no more where the
// program is than libc's nanosleep under it (found by the stacks tests under tests/sanitize.sh tsan).
TEST(Stacks, SanitizerRuntimeFramesAreLeftOutOfTheSummaryToo) {
  std::string dump = kNative;
  dump.replace(dump.find("/opt/muster/worker(_ZN6muster5stuckEi"), 0,
               "/lib/x86_64-linux-gnu/libtsan.so.2(__interceptor_usleep+0x100)[0x7f0000000003]\n");
  std::vector<RankStacks> ranks = {rank(0, dump.c_str())};
  EXPECT_EQ(groupRanks(ranks)[0].where, "muster::stuck(int) (worker) <- ?? (worker+0x1234) <- ?? (0x7f0000000009)");
}

TEST(Stacks, RankListsCompressRuns) {
  EXPECT_EQ(rankList({0, 2, 3, 4, 7, 8}), "0,2-4,7,8");
  EXPECT_EQ(rankList({5}), "5");
  EXPECT_EQ(rankList({}), "");
}

TEST(Stacks, JsonRoundTrips) {
  std::vector<RankStacks> ranks = {rank(0, kPython), rank(1, kNative)};
  ranks[1].answer = Answer::kNoAnswer;
  ranks[1].state = "T (stopped)";
  auto back = fromJson(nlohmann::json::parse(toJson(ranks).dump()));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(toJson(back), toJson(ranks));
  EXPECT_THROW(fromJson(nlohmann::json::parse(R"([{"rank": 1}])")), nlohmann::json::exception);
  // Numbers that are not ints (found by fuzz/stacks: get<int> cast 1e300, undefined behaviour).
  for (const char* number : {"1e300", "1.5", "4294967296", "-2147483649", "18446744073709551615"}) {
    std::string text = std::string(R"([{"rank":)") + number +
                       R"(,"local_rank":0,"pid":1,"host":"","answer":0,"kind":"","state":"","threads":[]}])";
    EXPECT_THROW(fromJson(nlohmann::json::parse(text)), nlohmann::json::exception) << number;
  }
  EXPECT_THROW(fromJson(nlohmann::json::parse(
                   R"([{"rank":1,"local_rank":0,"pid":1,"host":"","answer":9,"kind":"","state":"","threads":[]}])")),
               nlohmann::json::exception);
}

// Found by fuzz/stacks_fuzz: a native thread's name as the kernel keeps it (15 bytes, cut
// mid-character) made toJson(...).dump() throw, and launch sends that JSON to the rendezvous
// from its event loop when a roll-call is asked through it. Bytes that are not UTF-8 read as
// U+FFFD, in names, files and functions (a mangled name's bytes come through the demangler).
TEST(Stacks, BytesThatAreNotUtf8ReadAsTheReplacementCharacter) {
  std::string dump =
      "muster-stacks pid=5 native\n"
      "Thread 5 (loader-gl\xC3\xB6\xC3) current:\n"
      "/opt/m\xFF/worker(_Z1\xC3v+0x1e)[0x55d0c2f1a2b3]\n"
      "/opt/ok/worker(\xED\xA0\x80+0x2)[0x55d0c2f1a2b4]\n"
      "muster-stacks end\n";
  auto threads = parseDump(dump);
  ASSERT_EQ(threads.size(), 1u);
  EXPECT_EQ(threads[0].name, "loader-gl\xC3\xB6\xEF\xBF\xBD");
  ASSERT_EQ(threads[0].frames.size(), 2u);
  EXPECT_EQ(threads[0].frames[0].file, "/opt/m\xEF\xBF\xBD/worker");
  EXPECT_EQ(threads[0].frames[1].function, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate is not UTF-8
  RankStacks r = rank(0, "");
  r.threads = threads;
  std::string wire;
  ASSERT_NO_THROW(wire = toJson({r}).dump());
  auto back = fromJson(nlohmann::json::parse(wire));
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].threads[0].name, threads[0].name);
  EXPECT_NE(fullReport({r}, "test").find("loader-gl\xC3\xB6\xEF\xBF\xBD"), std::string::npos);
}

}  // namespace
}  // namespace muster::stacks
