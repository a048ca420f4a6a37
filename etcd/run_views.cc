// runsOf, statusOf: a range of the runs' state keys, and of one run's join and status keys.
#include "etcd/run_views.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/net.h"
#include "etcd/run_keys.h"
#include "etcd/run_values.h"
#include "etcd/watch.h"

namespace muster::etcd {

namespace v1 = ::muster::v1;
using nlohmann::json;

namespace {

// A key whose value launch does not write: runsOf and statusOf answer DATA_LOSS naming it.
struct NotLaunchs : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A key's value, checked (etcd/run_values.h) before anything reads it.
json checked(const mvccpb::KeyValue& kv, absl::Status (*check)(const json&)) {
  json value = json::parse(kv.value(), nullptr, /*allow_exceptions=*/false);
  if (auto s = check(value); !s.ok()) throw NotLaunchs(fmt::format("key {}: {}", kv.key(), std::string(s.message())));
  return value;
}

// A node's own key's value (a join, a status), checked: one that launch does not write shows
// that node with nothing of it (an empty object) rather than failing the whole view.
json orEmpty(const mvccpb::KeyValue& kv, absl::Status (*check)(const json&)) {
  json value = json::parse(kv.value(), nullptr, /*allow_exceptions=*/false);
  return check(value).ok() ? value : json::object();
}

// runPrefix's escape undone: "a%2Fb" -> "a/b".
std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      unsigned v = 0;
      if (std::sscanf(s.substr(i + 1, 2).c_str(), "%2x", &v) == 1) {
        out += static_cast<char>(v);
        i += 2;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

// Every key under `prefix` (values too unless `keysOnly`).
absl::StatusOr<pb::RangeResponse> under(Client& client, const std::string& prefix, bool keysOnly, Deadline deadline) {
  pb::RangeRequest read;
  read.set_key(prefix);
  read.set_range_end(prefixEnd(prefix));
  read.set_keys_only(keysOnly);
  return client.range(read, deadline);
}

// The summary of a run from its state key (and the join keys of the round after it, counted
// for a run between rounds).
v1::RunSummary summarize(Client& client, const std::string& runId, const mvccpb::KeyValue& stateKv, Deadline deadline) {
  v1::RunSummary s;
  s.set_run_id(runId);
  json state = checked(stateKv, checkState);
  std::string phase = state.value("phase", std::string());
  s.set_round(state.value("round", uint64_t{0}));
  s.set_min_nodes(state.value("min", 1));
  s.set_max_nodes(state.value("max", 1));
  if (int64_t since = state.value("since", int64_t{0}); since > 0) {
    s.set_age_ms(static_cast<uint64_t>(std::max<int64_t>(0, unixMs() - since)));
  }
  int ranks = 0, nodes = 0;
  for (const auto& n : state.value("nodes", json::array())) {
    ranks += n.value("local_world_size", 1);
    ++nodes;
  }
  if (phase == "running" || phase == "finished") {
    s.set_nodes(nodes);
    s.set_ranks(ranks);
  }
  std::string prefix = runPrefix(runId, client.options().runsPrefix);
  // Join keys live on their nodes' leases: none left in the round or the next is no node left.
  auto left = [&](uint64_t round) -> int {
    auto keys = under(client, prefix + joinKey(round, ""), true, deadline);
    return keys.ok() ? static_cast<int>(keys->kvs_size()) : -1;
  };
  int next = phase == "finished" ? -1 : left(s.round() + 1);  // the nodes waiting for the next round
  if ((phase == "running" || phase == "ended") && next == 0 && left(s.round()) == 0) {
    s.set_state(v1::RunSummary::STOPPED);  // every node gone (killed, or given up after a failure)
  } else if (phase == "running") {
    s.set_state(v1::RunSummary::RUNNING);
  } else if (phase == "finished") {
    s.set_state(v1::RunSummary::FINISHED);
    if (stateKv.lease() != 0) {
      if (auto left = client.leaseTimeToLive(stateKv.lease(), deadline); left.ok() && *left > 0) {
        s.set_forgotten_in_ms(static_cast<uint64_t>(*left) * 1000);
      }
    }
  } else {
    s.set_state(v1::RunSummary::WAITING);
    if (next >= 0) s.set_nodes(next);
  }
  return s;
}

// A node waiting to join a round, as its join key's value tells.
void addWaiting(v1::StatusReply& reply, const std::string& id, const json& join) {
  const json node = join.is_object() ? join : json::object();
  auto* v = reply.add_nodes();
  v->set_node_id(id);
  v->set_host(node.value("host", std::string()));
  v->set_group_rank(-1);
  v->set_first_rank(-1);
  v->set_local_world_size(node.value("local_world_size", 1));
  v->set_heartbeat_age_ms(-1);
}

// A run whose first round is still gathering has join keys and no state key yet: waiting,
// with its nodes (and --nnodes from their joins). nullopt: no such keys either.
absl::StatusOr<std::optional<v1::StatusReply>> gathering(Client& client, const std::string& runId, Deadline deadline) {
  std::string prefix = runPrefix(runId, client.options().runsPrefix);
  auto joins = under(client, prefix + joinKey(0, ""), false, deadline);
  if (!joins.ok()) return joins.status();
  if (joins->kvs_size() == 0) return std::optional<v1::StatusReply>();
  v1::StatusReply reply;
  auto* run = reply.mutable_run();
  run->set_run_id(runId);
  run->set_state(v1::RunSummary::WAITING);
  run->set_nodes(static_cast<int>(joins->kvs_size()));
  for (const auto& kv : joins->kvs()) {
    json node = orEmpty(kv, checkJoin);
    run->set_min_nodes(node.value("min", 1));
    run->set_max_nodes(node.value("max", 1));
    addWaiting(reply, kv.key().substr(prefix.size() + joinKey(0, "").size()), node);
  }
  return std::optional<v1::StatusReply>(std::move(reply));
}

// The runs' ids: those with a state key, and those with only join keys (a first round gathering).
std::pair<std::set<std::string>, std::set<std::string>> runIds(const pb::RangeResponse& keys, const std::string& root) {
  std::set<std::string> withState, joining;
  std::string state = std::string("/") + kStateKey;
  std::string join = std::string("/") + kJoinDir;
  for (const auto& kv : keys.kvs()) {
    const std::string& k = kv.key();
    if (k.size() <= root.size()) continue;
    size_t slash = k.find('/', root.size());
    if (slash == std::string::npos || slash == root.size()) continue;
    std::string rest = k.substr(slash);
    std::string id = unescape(k.substr(root.size(), slash - root.size()));
    if (rest == state) withState.insert(id);
    if (rest.rfind(join, 0) == 0) joining.insert(id);
  }
  for (const auto& id : withState) joining.erase(id);
  return {withState, joining};
}

absl::StatusOr<v1::RunsReply> runsOfKeys(Client& client, Deadline deadline);
absl::StatusOr<v1::StatusReply> statusOfKeys(Client& client, const std::string& runId, Deadline deadline);

}  // namespace

// A key that holds what launch never writes (another program's, a hand edit) is one clear
// error naming it, not a crash: nlohmann's value() throws on a wrong type.
absl::StatusOr<v1::RunsReply> runsOf(Client& client, Deadline deadline) {
  auto notLaunchs = [&](const char* what) {
    return absl::DataLossError(fmt::format("etcd at {}: a run's keys under {}/ hold what launch does not write ({})",
                                           client.endpointList(), client.options().runsPrefix, what));
  };
  try {
    return runsOfKeys(client, deadline);
  } catch (const NotLaunchs& e) {
    return notLaunchs(e.what());
  } catch (const json::exception& e) {
    return notLaunchs(e.what());
  }
}

absl::StatusOr<v1::StatusReply> statusOf(Client& client, const std::string& runId, Deadline deadline) {
  auto notLaunchs = [&](const char* what) {
    return absl::DataLossError(fmt::format("etcd at {}: run '{}''s keys hold what launch does not write ({})",
                                           client.endpointList(), runId, what));
  };
  try {
    return statusOfKeys(client, runId, deadline);
  } catch (const NotLaunchs& e) {
    return notLaunchs(e.what());
  } catch (const json::exception& e) {
    return notLaunchs(e.what());
  }
}

absl::StatusOr<RunningStore> runningStoreOf(Client& client, const std::string& runId, Deadline deadline) {
  pb::RangeRequest read;
  read.set_key(runPrefix(runId, client.options().runsPrefix) + kStateKey);
  auto state = client.range(read, deadline);
  if (!state.ok()) return state.status();
  if (state->kvs_size() == 0) {
    return absl::NotFoundError(fmt::format("no running round of run '{}' in etcd at {} (gathering, never started, "
                                           "or forgotten)", runId, client.endpointList()));
  }
  json st = json::parse(state->kvs(0).value(), nullptr, /*allow_exceptions=*/false);
  if (auto s = checkState(st); !s.ok()) {
    return absl::DataLossError(fmt::format("etcd at {}: run '{}''s state holds what launch does not write ({})",
                                           client.endpointList(), runId, std::string(s.message())));
  }
  std::string phase = st.value("phase", std::string());
  if (phase != "running") {
    return absl::FailedPreconditionError(fmt::format("run '{}' is not running a round in etcd at {} (it is {})", runId,
                                                     client.endpointList(), phase));
  }
  const json& first = st["nodes"][0];  // checkState: not empty while running
  int port = first.value("store_port", 0);
  if (port <= 0) {
    return absl::FailedPreconditionError(
        fmt::format("run '{}''s node 0 ({}) serves no store (a launch older than the coordinated stop)", runId,
                    first.value("host", std::string())));
  }
  return RunningStore{.round = st.value("round", uint64_t{0}),
                      .endpoint = net::joinHostPort(first.value("host", std::string()), port)};
}

namespace {

absl::StatusOr<v1::RunsReply> runsOfKeys(Client& client, Deadline deadline) {
  std::string root = client.options().runsPrefix + "/";
  // The runs' keys, names only: a run is there when its state key is.
  auto keys = under(client, root, true, deadline);
  if (!keys.ok()) return keys.status();
  auto [ids, joining] = runIds(*keys, root);
  v1::RunsReply reply;
  for (const auto& id : joining) {
    auto first = gathering(client, id, deadline);
    if (!first.ok()) return first.status();
    if (*first) *reply.add_runs() = (*first)->run();
  }
  for (const auto& id : ids) {
    pb::RangeRequest read;
    read.set_key(runPrefix(id, client.options().runsPrefix) + kStateKey);
    auto state = client.range(read, deadline);
    if (!state.ok()) return state.status();
    if (state->kvs_size() == 0) continue;  // gone meanwhile
    *reply.add_runs() = summarize(client, id, state->kvs(0), deadline);
  }
  std::sort(reply.mutable_runs()->begin(), reply.mutable_runs()->end(),
            [](const auto& a, const auto& b) { return a.run_id() < b.run_id(); });
  return reply;
}

absl::StatusOr<v1::StatusReply> statusOfKeys(Client& client, const std::string& runId, Deadline deadline) {
  std::string prefix = runPrefix(runId, client.options().runsPrefix);
  pb::RangeRequest read;
  read.set_key(prefix + kStateKey);
  auto state = client.range(read, deadline);
  if (!state.ok()) return state.status();
  if (state->kvs_size() == 0) {
    auto first = gathering(client, runId, deadline);
    if (!first.ok()) return first.status();
    if (*first) return std::move(**first);
    return absl::NotFoundError(fmt::format("no run '{}' in etcd at {} (never started, or forgotten)", runId,
                                           client.endpointList()));
  }
  v1::StatusReply reply;
  *reply.mutable_run() = summarize(client, runId, state->kvs(0), deadline);
  json st = checked(state->kvs(0), checkState);
  uint64_t round = st.value("round", uint64_t{0});
  std::string phase = st.value("phase", std::string());
  // Who is there (join keys of this round and the next) and what each said of itself.
  auto joins = under(client, prefix + kJoinDir, false, deadline);
  if (!joins.ok()) return joins.status();
  auto statuses = under(client, prefix + kStatusDir, false, deadline);
  if (!statuses.ok()) return statuses.status();
  std::set<std::string> present;
  std::map<std::string, json> waiting;  // node id -> its join value, of the next round
  for (const auto& kv : joins->kvs()) {
    std::string rest = kv.key().substr(prefix.size());
    for (uint64_t r : {round, round + 1}) {
      std::string dir = joinKey(r, "");
      if (rest.rfind(dir, 0) != 0) continue;
      std::string node = rest.substr(dir.size());
      if (r == round) present.insert(node);
      if (r == round + 1) waiting[node] = orEmpty(kv, checkJoin);
    }
  }
  std::map<std::string, json> said;
  for (const auto& kv : statuses->kvs()) {
    said[kv.key().substr(prefix.size() + std::string(kStatusDir).size())] = orEmpty(kv, checkStatus);
  }
  auto fill = [&](v1::NodeView* v, const std::string& id) {
    auto s = said.find(id);
    if (s == said.end() || !s->second.contains("unix_ms")) {  // none, or not launch's
      v->set_heartbeat_age_ms(-1);
      return;
    }
    v->set_heartbeat_age_ms(std::max<int64_t>(0, unixMs() - s->second.value("unix_ms", int64_t{0})));
    if (s->second.contains("status")) {
      google::protobuf::util::JsonParseOptions options;
      options.ignore_unknown_fields = true;
      v1::NodeStatus status;
      if (google::protobuf::util::JsonStringToMessage(s->second["status"].dump(), &status, options).ok()) {
        *v->mutable_status() = std::move(status);
      }
    }
  };
  int first = 0, rank = 0;
  bool live = phase == "running";
  for (const auto& n : st.value("nodes", json::array())) {
    std::string id = n.value("id", std::string());
    auto* v = reply.add_nodes();
    v->set_node_id(id);
    v->set_host(n.value("host", std::string()));
    v->set_group_rank(rank++);
    v->set_first_rank(first);
    v->set_local_world_size(n.value("local_world_size", 1));
    first += n.value("local_world_size", 1);
    if (!live || present.count(id)) {
      fill(v, id);
    } else {
      v->set_heartbeat_age_ms(-1);  // its lease, and with it its keys, are gone
    }
  }
  for (const auto& [id, node] : waiting) addWaiting(reply, id, node);
  return reply;
}

}  // namespace

}  // namespace muster::etcd
