// askForStacks: a question key on a lease of the asker's, a watch of the answers' prefix from
// the question's revision on, and the keys removed afterwards.
#include "etcd/roll_call.h"

#include <condition_variable>
#include <map>
#include <mutex>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "etcd/run_keys.h"
#include "etcd/run_values.h"
#include "etcd/watch.h"

namespace muster::etcd {

namespace {

constexpr Millis kCallDeadline{10000};

// A roll-call id no other asker picks by chance (the nodes take any decimal number).
uint64_t newId() {
  std::random_device device;
  std::uniform_int_distribution<uint64_t> pick(1, (uint64_t{1} << 53) - 1);
  return pick(device);
}

}  // namespace

absl::StatusOr<RollCallAnswers> askForStacks(Client& client, const std::string& runId, Millis timeout) {
  std::string prefix = runPrefix(runId, client.options().runsPrefix);
  pb::RangeRequest read;
  read.set_key(prefix + kStateKey);
  auto state = client.range(read, deadlineAfter(kCallDeadline));
  if (!state.ok()) return state.status();
  if (state->kvs_size() == 0) {
    return absl::NotFoundError(fmt::format("etcd at {} holds no run '{}' (no key {}{})", client.endpointList(), runId,
                                           prefix, kStateKey));
  }
  auto run = nlohmann::json::parse(state->kvs(0).value(), nullptr, /*allow_exceptions=*/false);
  if (auto shape = checkState(run); !shape.ok()) {
    return absl::FailedPreconditionError(
        fmt::format("key {}{} is not muster's run state ({})", prefix, kStateKey, std::string(shape.message())));
  }
  if (run.value("phase", std::string()) != "running") {
    return absl::FailedPreconditionError(fmt::format("run '{}' has no running round: round {} {}", runId,
                                                     run.value("round", uint64_t{0}), run.value("phase", std::string("?"))));
  }
  RollCallAnswers out;
  std::map<std::string, std::string> hosts;  // node id -> host, of the running round
  for (const auto& node : run["nodes"]) {
    hosts[node.value("id", std::string())] = node.value("host", std::string("?"));
  }
  out.nodes = static_cast<int>(hosts.size());

  // The question lives on a lease of its own: an asker that dies leaves nothing for long.
  auto seconds = std::chrono::ceil<std::chrono::seconds>(timeout).count() + 10;
  auto lease = client.grantLease(seconds, deadlineAfter(kCallDeadline));
  if (!lease.ok()) return lease.status();
  uint64_t id = newId();
  std::string answers = prefix + stacksAnswersDir(id);
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::string> got;  // node id -> its answer
  std::string watchError;
  pb::PutRequest ask;
  ask.set_key(prefix + stacksAskedKey(id));
  ask.set_value("{}");
  ask.set_lease(*lease);
  auto asked = client.put(ask, deadlineAfter(kCallDeadline));
  if (!asked.ok()) {
    (void)client.revokeLease(*lease, deadlineAfter(Millis(2000)));
    return asked.status();
  }
  {
    // From the question's revision on: no answer can come before it.
    Watch watch(
        client, answers, asked->header().revision() + 1, timeout,
        [&](Watch::Events events, int64_t) {
          std::lock_guard lock(mu);
          for (auto& e : events) {
            if (e.type() != ::mvccpb::Event::PUT) continue;
            got[e.kv().key().substr(answers.size())] = e.kv().value();
          }
          cv.notify_all();
        },
        [&](const std::string& why) {
          std::lock_guard lock(mu);
          watchError = why;
          cv.notify_all();
        });
    std::unique_lock lock(mu);
    cv.wait_until(lock, deadlineAfter(timeout), [&] {
      if (!watchError.empty()) return true;
      for (const auto& [id, host] : hosts) {
        if (!got.count(id)) return false;
      }
      return true;
    });
  }
  // The question and its answers go; the lease's end would take the question anyway.
  pb::TxnRequest clean;
  clean.add_success()->mutable_request_delete_range()->set_key(prefix + stacksAskedKey(id));
  auto* all = clean.add_success()->mutable_request_delete_range();
  all->set_key(answers);
  all->set_range_end(prefixEnd(answers));
  (void)client.txn(clean, deadlineAfter(kCallDeadline));
  (void)client.revokeLease(*lease, deadlineAfter(Millis(2000)));
  if (!watchError.empty() && got.empty()) return absl::UnavailableError(watchError);
  for (const auto& [node, host] : hosts) {
    auto answer = got.find(node);
    if (answer == got.end()) {
      out.missing.push_back(fmt::format("{} ({})", host, node));
    } else {
      out.answered.push_back({node, host, answer->second});
    }
  }
  return out;
}

}  // namespace muster::etcd
