// groupRanks, the summary and the whole report, and their JSON.
#include <algorithm>
#include <limits>
#include <map>
#include <set>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include "stacks/stacks.h"

namespace muster::stacks {

namespace {

// The thread a rank's group is judged by: the one that took the signal (the main thread).
const Thread* mainThread(const RankStacks& r) {
  for (const auto& t : r.threads) {
    if (t.current) return &t;
  }
  return r.threads.empty() ? nullptr : &r.threads.front();
}

// Frames of the C and C++ runtime (and of a sanitizer's, whose interceptors sit above libc's
// calls) say little about where a program is: the summary starts at the first frame of anything
// else.
bool runtimeFrame(const Frame& f) {
  if (!f.native) return false;
  static const char* kRuntime[] = {"libc.so",   "libpthread.so", "ld-linux",   "libstdc++.so", "libgcc_s.so",
                                   "libtsan.so", "libasan.so",   "libubsan.so", "liblsan.so",  "libclang_rt."};
  return std::any_of(std::begin(kRuntime), std::end(kRuntime),
                     [&](const char* m) { return f.file.find(m) != std::string::npos; });
}

constexpr size_t kWhereFrames = 3;

std::string where(const RankStacks& r) {
  switch (r.answer) {
    case Answer::kNoHandler:
      return "no stacks: it installed no handler (not Python with launch's hook, nor linked with the "
             "worker library); " + r.state;
    case Answer::kNoAnswer:
      return "did not answer within the deadline: " + r.state;
    case Answer::kGone:
      return "had exited";
    case Answer::kAnswered:
      break;
  }
  const Thread* t = mainThread(r);
  if (t == nullptr) return "answered with no thread";
  std::vector<std::string> parts;
  bool skipping = true;
  for (const auto& f : t->frames) {
    if (skipping && runtimeFrame(f)) continue;
    skipping = false;
    parts.push_back(frameText(f));
    if (parts.size() == kWhereFrames) break;
  }
  if (parts.empty() && !t->frames.empty()) parts.push_back(frameText(t->frames.front()));
  if (parts.empty()) return t->note.empty() ? "no frame" : t->note;
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : " <- ") + p;
  return out;
}

// Ranks stand together when their main threads show the same frames (all of them).
std::string signature(const RankStacks& r) {
  if (r.answer != Answer::kAnswered) return fmt::format("{}|{}", static_cast<int>(r.answer), r.state);
  const Thread* t = mainThread(r);
  std::string key = "a|";
  if (t == nullptr) return key;
  for (const auto& f : t->frames) key += fmt::format("{}|{}|{}|{};", f.function, f.file, f.line, f.offset);
  return key + t->note;
}

std::string threadText(const Thread& t) {
  std::string out = fmt::format("  thread {}{}{}{}:\n", t.id, t.name.empty() ? "" : " (" + t.name + ")",
                                t.current ? " (main, took the signal)" : "",
                                t.note.empty() ? "" : " [" + t.note + "]");
  for (const auto& f : t.frames) out += fmt::format("    {}{}\n", frameText(f, true), f.native ? f.offset : "");
  return out;
}

}  // namespace

std::vector<Group> groupRanks(const std::vector<RankStacks>& ranks) {
  std::map<std::string, Group> bySignature;
  for (size_t i = 0; i < ranks.size(); ++i) {
    auto& g = bySignature[signature(ranks[i])];
    if (g.ranks.empty()) g.where = where(ranks[i]);
    g.ranks.push_back(static_cast<int>(i));
  }
  std::vector<Group> groups;
  for (auto& [key, g] : bySignature) groups.push_back(std::move(g));
  auto lowest = [&](const Group& g) {
    int low = INT32_MAX;
    for (int i : g.ranks) low = std::min(low, ranks[i].rank);
    return low;
  };
  std::sort(groups.begin(), groups.end(), [&](const Group& a, const Group& b) {
    if (a.ranks.size() != b.ranks.size()) return a.ranks.size() < b.ranks.size();
    return lowest(a) < lowest(b);
  });
  return groups;
}

std::string rankList(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    out += out.empty() ? "" : ",";
    out += j > i + 1 ? fmt::format("{}-{}", ranks[i], ranks[j])
           : j == i  ? std::to_string(ranks[i])
                     : fmt::format("{},{}", ranks[i], ranks[j]);
    i = j + 1;
  }
  return out;
}

std::string describeGroup(const std::vector<RankStacks>& ranks, const Group& g) {
  std::vector<int> numbers;
  for (int i : g.ranks) numbers.push_back(ranks[i].rank);
  return fmt::format("{} {}: {}", numbers.size() == 1 ? "rank" : "ranks", rankList(numbers), g.where);
}

std::string summary(const std::vector<RankStacks>& ranks, const std::string& reason) {
  std::set<std::string> hosts;
  for (const auto& r : ranks) hosts.insert(r.host);
  std::string out = fmt::format("stack roll-call ({}): {} rank(s) on {} node(s)\n", reason, ranks.size(),
                                hosts.size());
  for (const auto& g : groupRanks(ranks)) out += "  " + describeGroup(ranks, g) + "\n";
  return out;
}

std::string fullReport(const std::vector<RankStacks>& ranks, const std::string& reason) {
  std::string out = fmt::format("muster stack roll-call: {}\ntaken {:%Y-%m-%d %H:%M:%S} UTC\n\n", reason,
                                fmt::gmtime(std::time(nullptr)));
  out += summary(ranks, reason);
  for (const auto& g : groupRanks(ranks)) {
    out += "\n== " + describeGroup(ranks, g) + "\n";
    for (int i : g.ranks) {
      const auto& r = ranks[i];
      out += fmt::format("  rank {} (local_rank {}, pid {}, host {}{}{})\n", r.rank, r.localRank, r.pid, r.host,
                         r.kind.empty() ? "" : ", " + r.kind,
                         r.state.empty() || r.answer == Answer::kAnswered ? "" : ", " + r.state);
    }
    const auto& first = ranks[g.ranks.front()];
    if (first.answer != Answer::kAnswered) continue;
    out += fmt::format(" every thread of rank {}:\n", first.rank);
    for (const auto& t : first.threads) out += threadText(t);
  }
  return out;
}

nlohmann::json toJson(const std::vector<RankStacks>& ranks) {
  auto out = nlohmann::json::array();
  for (const auto& r : ranks) {
    auto threads = nlohmann::json::array();
    for (const auto& t : r.threads) {
      auto frames = nlohmann::json::array();
      for (const auto& f : t.frames) {
        frames.push_back({{"function", f.function}, {"file", f.file}, {"line", f.line},
                          {"offset", f.offset}, {"native", f.native}});
      }
      threads.push_back({{"id", t.id}, {"name", t.name}, {"current", t.current}, {"note", t.note},
                         {"frames", std::move(frames)}});
    }
    out.push_back({{"rank", r.rank}, {"local_rank", r.localRank}, {"pid", r.pid}, {"host", r.host},
                   {"answer", static_cast<int>(r.answer)}, {"kind", r.kind}, {"state", r.state},
                   {"threads", std::move(threads)}});
  }
  return out;
}

namespace {
// An int field as toJson writes it: a JSON integer within int's range. nlohmann's get<int>
// converts a float (1e300) or a larger integer with a cast, undefined out of range (UBSan,
// fuzz/stacks).
int intAt(const nlohmann::json& j, const char* key) {
  const auto& v = j.at(key);
  if (!v.is_number_integer()) {
    throw nlohmann::json::type_error::create(302, fmt::format("'{}' is not an integer", key), &v);
  }
  if (v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int>::max())
                             : (v.get<int64_t>() < std::numeric_limits<int>::min() ||
                                v.get<int64_t>() > std::numeric_limits<int>::max())) {
    throw nlohmann::json::out_of_range::create(406, fmt::format("'{}' is out of range", key), &v);
  }
  return static_cast<int>(v.get<int64_t>());
}
}  // namespace

std::vector<RankStacks> fromJson(const nlohmann::json& json) {
  std::vector<RankStacks> out;
  for (const auto& j : json) {
    RankStacks r;
    r.rank = intAt(j, "rank");
    r.localRank = intAt(j, "local_rank");
    r.pid = intAt(j, "pid");
    r.host = j.at("host").get<std::string>();
    int answer = intAt(j, "answer");
    if (answer < 0 || answer > static_cast<int>(Answer::kGone)) {
      throw nlohmann::json::other_error::create(501, "unknown answer", &j);
    }
    r.answer = static_cast<Answer>(answer);
    r.kind = j.at("kind").get<std::string>();
    r.state = j.at("state").get<std::string>();
    for (const auto& jt : j.at("threads")) {
      Thread t;
      t.id = jt.at("id").get<std::string>();
      t.name = jt.at("name").get<std::string>();
      t.current = jt.at("current").get<bool>();
      t.note = jt.at("note").get<std::string>();
      for (const auto& jf : jt.at("frames")) {
        Frame f;
        f.function = jf.at("function").get<std::string>();
        f.file = jf.at("file").get<std::string>();
        f.line = intAt(jf, "line");
        f.offset = jf.at("offset").get<std::string>();
        f.native = jf.at("native").get<bool>();
        t.frames.push_back(std::move(f));
      }
      r.threads.push_back(std::move(t));
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace muster::stacks
