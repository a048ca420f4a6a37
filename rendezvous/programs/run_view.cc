// The text and JSON of rendezvousctl runs and status.
#include "rendezvous/programs/run_view.h"


#include <algorithm>
#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace muster::rendezvous::view {

namespace pb = ::muster::v1;

namespace {

std::string stateName(const pb::RunSummary& run) {
  switch (run.state()) {
    case pb::RunSummary::WAITING: return "waiting";
    case pb::RunSummary::RUNNING: return "running";
    case pb::RunSummary::FINISHED: return fmt::format("finished, forgotten in {}", age(static_cast<int64_t>(run.forgotten_in_ms())));
    case pb::RunSummary::STOPPED:
      // etcd keeps a stopped run's state until its keys are deleted: no time to tell.
      if (run.forgotten_in_ms() == 0) return "stopped";
      return fmt::format("stopped, forgotten in {}", age(static_cast<int64_t>(run.forgotten_in_ms())));
    default: return "?";
  }
}

std::string rankState(pb::RankStatus::State s) {
  switch (s) {
    case pb::RankStatus::RUNNING: return "running";
    case pb::RankStatus::STOPPING: return "stopping";
    case pb::RankStatus::SUCCEEDED: return "succeeded";
    case pb::RankStatus::FAILED: return "failed";
    default: return "?";
  }
}

std::string ageOrDash(int64_t ms) { return ms < 0 ? "-" : age(ms); }

// Control bytes (ids, hosts and versions are any bytes a client sent) would reach the terminal
// as escape sequences: each becomes '?'.
std::string printable(std::string text) {
  for (char& c : text) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  return text;
}

// Columns padded to the widest cell; each line cut at `width`.
std::string table(const std::vector<std::vector<std::string>>& rows, int width, const std::string& indent = "") {
  std::vector<size_t> w;
  for (const auto& row : rows) {
    if (w.size() < row.size()) w.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) w[i] = std::max(w[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line = indent;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(w[i] - row[i].size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    line = printable(std::move(line));
    if (width > 0 && static_cast<int>(line.size()) > width) line.resize(static_cast<size_t>(width));
    out += line + "\n";
  }
  return out;
}

std::string cut(std::string line, int width) {
  line = printable(std::move(line));
  if (width > 0 && static_cast<int>(line.size()) > width) line.resize(static_cast<size_t>(width));
  return line + "\n";
}

// The run's stop, as its nodes tell it: a failed one first, then one agreed, then one asked;
// empty when no node has one.
std::string stopLine(const pb::StatusReply& status) {
  const pb::StopStatus* seen = nullptr;
  auto rankOf = [](const pb::StopStatus& s) { return !s.failed().empty() ? 2 : s.agreed() ? 1 : 0; };
  for (const auto& n : status.nodes()) {
    if (!n.has_status() || !n.status().has_stop()) continue;
    const auto& s = n.status().stop();
    if (!seen || rankOf(s) > rankOf(*seen)) seen = &s;
  }
  if (!seen) return "";
  if (!seen->failed().empty()) {
    return fmt::format("the stop on request ({}) failed: {}", seen->reason(), seen->failed());
  }
  // Step 0 is posted only before any rank asked (a notice kept over a restart).
  if (seen->agreed() && seen->step() == 0) {
    return fmt::format("stopping on request ({}): every rank stops at the first step it asks", seen->reason());
  }
  if (seen->agreed()) return fmt::format("stopping on request ({}): every rank stops at step {}", seen->reason(), seen->step());
  return fmt::format("stopping on request ({}): the nodes are agreeing on a step", seen->reason());
}

}  // namespace

std::string age(int64_t ms) {
  if (ms < 0) ms = 0;
  if (ms < 1000) return fmt::format("{} ms", ms);
  if (ms < 60000) return fmt::format("{:.1f} s", ms / 1000.0);
  int64_t s = ms / 1000;
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  if (s < 86400) return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
  return fmt::format("{}d{:02}h", s / 86400, (s % 86400) / 3600);
}

std::string bytes(uint64_t n) {
  if (n >= (uint64_t{1} << 30)) return fmt::format("{:.1f} GiB", n / double(uint64_t{1} << 30));
  if (n >= (uint64_t{1} << 20)) return fmt::format("{} MiB", n >> 20);
  return fmt::format("{} KiB", n >> 10);
}

std::string runsTable(const pb::RunsReply& runs, int width) {
  std::vector<std::vector<std::string>> rows{{"RUN", "STATE", "ROUND", "NODES", "MIN", "MAX", "RANKS", "AGE"}};
  for (const auto& r : runs.runs()) {
    rows.push_back({r.run_id(), stateName(r), std::to_string(r.round()), std::to_string(r.nodes()),
                    std::to_string(r.min_nodes()), std::to_string(r.max_nodes()),
                    r.ranks() > 0 ? std::to_string(r.ranks()) : "-", age(static_cast<int64_t>(r.age_ms()))});
  }
  if (runs.runs_size() == 0) return cut("no runs", width);
  return table(rows, width);
}

std::string statusText(const pb::StatusReply& status, int width) {
  const auto& r = status.run();
  std::string out = cut(fmt::format("run {}: {}, round {}, {} node(s) (min {}, max {}), {} rank(s), age {}", r.run_id(),
                                    stateName(r), r.round(), r.nodes(), r.min_nodes(), r.max_nodes(), r.ranks(),
                                    age(static_cast<int64_t>(r.age_ms()))),
                        width);
  if (status.nodes_size() == 0) return out;
  if (auto stop = stopLine(status); !stop.empty()) out += cut(stop, width);
  for (const auto& n : status.nodes()) {
    std::string ranks = n.group_rank() < 0 ? "waiting"
                                           : fmt::format("{}-{}", n.first_rank(), n.first_rank() + n.local_world_size() - 1);
    std::string line = fmt::format("node {}  {}  ranks {}", n.group_rank() < 0 ? "-" : std::to_string(n.group_rank()),
                                   n.host(), ranks);
    if (n.has_status()) {
      line += fmt::format("  launch pid {} ({})  restarts left {}", n.status().launch_pid(), n.status().version(),
                          n.status().restarts_left());
    }
    if (n.heartbeat_age_ms() >= 0) line += fmt::format("  heartbeat {} ago", age(n.heartbeat_age_ms()));
    out += cut(line, width);
    if (!n.has_status() || n.status().ranks_size() == 0) continue;
    std::vector<std::vector<std::string>> rows{{"RANK", "LOCAL", "PID", "STATE", "OUTPUT", "TIMER", "RSS", "EXIT", "UP"}};
    for (const auto& k : n.status().ranks()) {
      bool ended = k.state() == pb::RankStatus::SUCCEEDED || k.state() == pb::RankStatus::FAILED;
      rows.push_back({std::to_string(k.rank()), std::to_string(k.local_rank()), std::to_string(k.pid()),
                      rankState(k.state()), ageOrDash(k.output_age_ms()), ageOrDash(k.timer_age_ms()),
                      k.rss_bytes() > 0 ? bytes(k.rss_bytes()) : "-", ended ? std::to_string(k.exit_code()) : "-",
                      age(k.age_ms())});
    }
    out += table(rows, width, "  ");
  }
  return out;
}

namespace {

nlohmann::json runJson(const pb::RunSummary& r) {
  return {{"run_id", r.run_id()},
          {"state", pb::RunSummary::State_Name(r.state())},
          {"round", r.round()},
          {"nodes", r.nodes()},
          {"min_nodes", r.min_nodes()},
          {"max_nodes", r.max_nodes()},
          {"ranks", r.ranks()},
          {"age_ms", r.age_ms()},
          {"forgotten_in_ms", r.forgotten_in_ms()}};
}

}  // namespace

std::string runsJson(const pb::RunsReply& runs) {
  nlohmann::json out = {{"runs", nlohmann::json::array()}};
  for (const auto& r : runs.runs()) out["runs"].push_back(runJson(r));
  return out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::string statusJson(const pb::StatusReply& status) {
  nlohmann::json out = {{"run", runJson(status.run())}, {"nodes", nlohmann::json::array()}};
  for (const auto& n : status.nodes()) {
    nlohmann::json node = {{"node_id", n.node_id()},
                           {"host", n.host()},
                           {"group_rank", n.group_rank()},
                           {"first_rank", n.first_rank()},
                           {"local_world_size", n.local_world_size()},
                           {"heartbeat_age_ms", n.heartbeat_age_ms()}};
    if (n.has_status()) {
      const auto& st = n.status();
      nlohmann::json ranks = nlohmann::json::array();
      for (const auto& k : st.ranks()) {
        ranks.push_back({{"rank", k.rank()},
                         {"local_rank", k.local_rank()},
                         {"pid", k.pid()},
                         {"state", pb::RankStatus::State_Name(k.state())},
                         {"output_age_ms", k.output_age_ms()},
                         {"timer_age_ms", k.timer_age_ms()},
                         {"rss_bytes", k.rss_bytes()},
                         {"exit_code", k.exit_code()},
                         {"age_ms", k.age_ms()}});
      }
      node["status"] = {{"launch_pid", st.launch_pid()},
                        {"version", st.version()},
                        {"restarts_left", st.restarts_left()},
                        {"ranks", std::move(ranks)}};
      if (st.has_stop()) {
        node["status"]["stop"] = {{"reason", st.stop().reason()},
                                  {"agreed", st.stop().agreed()},
                                  {"step", st.stop().step()},
                                  {"failed", st.stop().failed()}};
      }
    }
    out["nodes"].push_back(std::move(node));
  }
  return out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

void asOfNow(pb::StatusReply& status) {
  for (auto& node : *status.mutable_nodes()) {
    int64_t since = node.heartbeat_age_ms();
    if (since <= 0 || !node.has_status()) continue;
    for (auto& r : *node.mutable_status()->mutable_ranks()) {
      if (r.state() != pb::RankStatus::RUNNING && r.state() != pb::RankStatus::STOPPING) continue;
      r.set_age_ms(r.age_ms() + since);
      if (r.output_age_ms() >= 0) r.set_output_age_ms(r.output_age_ms() + since);
      if (r.timer_age_ms() >= 0) r.set_timer_age_ms(r.timer_age_ms() + since);
    }
  }
}

}  // namespace muster::rendezvous::view
