// The store's state machine: c10d::Store semantics, namespaces, parked waiters, limits.
#include "rendezvous/store/memory_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>

#include "absl/strings/escaping.h"
#include "absl/strings/str_join.h"

namespace muster::rendezvous {
namespace {

constexpr int kOk = 0;
constexpr int kInvalidArgument = 3;
constexpr int kDeadlineExceeded = 4;
constexpr int kNotFound = 5;
constexpr int kAborted = 10;
constexpr int kOutOfRange = 11;
constexpr int kResourceExhausted = 8;
constexpr int kUnavailable = 14;
constexpr char kStoreVersion[] = "muster.v1 store 0.1";

bool fail(pb::StoreResponse& resp, int code, std::string message) {
  resp.set_code(code);
  resp.set_message(std::move(message));
  return false;
}

// A key in a message: C-escaped (keys are any bytes), the first 64 bytes of a long one.
std::string quoted(const std::string& key) {
  constexpr size_t kShown = 64;
  if (key.size() <= kShown) return "'" + absl::CHexEscape(key) + "'";
  return "'" + absl::CHexEscape(key.substr(0, kShown)) + "...'";
}

}  // namespace

Leading leadingInteger(std::string_view text, int64_t& out) {
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  bool plus = i < text.size() && text[i] == '+';
  if (plus) ++i;
  const char* begin = text.data() + i;
  const char* end = text.data() + text.size();
  if (plus && begin != end && *begin == '-') return Leading::kNoDigits;  // "+-1"
  auto [stop, ec] = std::from_chars(begin, end, out);
  if (ec == std::errc::result_out_of_range) return Leading::kOutOfRange;
  return ec == std::errc() ? Leading::kNumber : Leading::kNoDigits;
}

namespace {

std::string keyList(const std::vector<std::string>& keys) {
  constexpr size_t kShown = 5;
  std::vector<std::string> shown;
  for (size_t i = 0; i < keys.size() && i < kShown; ++i) shown.push_back(quoted(keys[i]));
  std::string out = absl::StrJoin(shown, ", ");
  if (keys.size() > kShown) out += fmt::format(" and {} more", keys.size() - kShown);
  return out;
}

}  // namespace

size_t largestRequest(const StoreLimits& limits) {
  auto add = [](size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; };
  auto times = [](size_t a, size_t b) { return b != 0 && a > SIZE_MAX / b ? SIZE_MAX : a * b; };
  // A compare_set (key, expected, desired) or a list of keys (wait, check, multi_get), each
  // key or value with a few bytes of framing; in the longest namespace.
  size_t compareSet = times(2, add(limits.maxKeyBytes, limits.maxValueBytes));
  size_t keyList = times(limits.maxKeysPerCall, add(limits.maxKeyBytes, 8));
  return add(add(std::max(compareSet, keyList), limits.maxKeyBytes), 4096);
}

absl::Status validateRequest(const pb::StoreRequest& req, const StoreLimits& limits) {
  if (req.ns().size() > limits.maxKeyBytes) {
    return absl::InvalidArgumentError(fmt::format("namespace of {} bytes exceeds max_key_bytes={}",
                                                  req.ns().size(), limits.maxKeyBytes));
  }
  auto key = [&](const std::string& k) {
    if (k.size() <= limits.maxKeyBytes) return absl::OkStatus();
    return absl::InvalidArgumentError(fmt::format("key of {} bytes exceeds max_key_bytes={}",
                                                  k.size(), limits.maxKeyBytes));
  };
  auto value = [&](const std::string& k, size_t bytes) {
    if (bytes <= limits.maxValueBytes) return absl::OkStatus();
    return absl::InvalidArgumentError(
        fmt::format("value of {} bytes for key {} exceeds max_value_bytes={}", bytes, quoted(k),
                    limits.maxValueBytes));
  };
  auto keys = [&](const auto& list) {
    if (static_cast<size_t>(list.size()) > limits.maxKeysPerCall) {
      return absl::InvalidArgumentError(fmt::format(
          "{} keys in one call exceed max_keys_per_call={}", list.size(), limits.maxKeysPerCall));
    }
    for (const auto& k : list) {
      if (auto s = key(k); !s.ok()) return s;
    }
    return absl::OkStatus();
  };
  switch (req.op_case()) {
    case pb::StoreRequest::kSet: {
      if (auto s = key(req.set().key()); !s.ok()) return s;
      return value(req.set().key(), req.set().value().size());
    }
    case pb::StoreRequest::kGet: return key(req.get().key());
    case pb::StoreRequest::kAdd: return key(req.add().key());
    case pb::StoreRequest::kCompareSet: {
      const auto& op = req.compare_set();
      if (auto s = key(op.key()); !s.ok()) return s;
      if (auto s = value(op.key(), op.expected().size()); !s.ok()) return s;
      return value(op.key(), op.desired().size());
    }
    case pb::StoreRequest::kCheck: return keys(req.check().keys());
    case pb::StoreRequest::kWait: return keys(req.wait().keys());
    case pb::StoreRequest::kDeleteKey: return key(req.delete_key().key());
    case pb::StoreRequest::kMultiGet: return keys(req.multi_get().keys());
    case pb::StoreRequest::kMultiSet: {
      const auto& op = req.multi_set();
      if (op.keys_size() != op.values_size()) {
        return absl::InvalidArgumentError(
            fmt::format("multi_set: {} keys but {} values", op.keys_size(), op.values_size()));
      }
      if (auto s = keys(op.keys()); !s.ok()) return s;
      size_t total = 0;
      for (int i = 0; i < op.keys_size(); ++i) {
        if (auto s = value(op.keys(i), op.values(i).size()); !s.ok()) return s;
        total += op.keys(i).size() + op.values(i).size();
      }
      if (req.ByteSizeLong() > largestRequest(limits)) {
        return absl::InvalidArgumentError(fmt::format(
            "multi_set of {} keys and {} bytes exceeds the largest request the store takes ({} "
            "bytes: a compare_set of the longest key and two of the largest values, or a call "
            "naming max_keys_per_call of the longest keys, whichever is larger); split it",
            op.keys_size(), total, largestRequest(limits)));
      }
      return absl::OkStatus();
    }
    case pb::StoreRequest::kAppend: return key(req.append().key());
    case pb::StoreRequest::kQueuePush: {
      if (auto s = key(req.queue_push().key()); !s.ok()) return s;
      return value(req.queue_push().key(), req.queue_push().value().size());
    }
    case pb::StoreRequest::kQueuePop: return key(req.queue_pop().key());
    case pb::StoreRequest::kQueueLen: return key(req.queue_len().key());
    case pb::StoreRequest::kList:
    case pb::StoreRequest::kNumKeys:
    case pb::StoreRequest::kClear:
    case pb::StoreRequest::kInfo:
      return absl::OkStatus();
    case pb::StoreRequest::OP_NOT_SET:
    default:
      return absl::InvalidArgumentError("the request carries no known operation");
  }
}

MemoryStore::MemoryStore(StoreLimits limits) : limits_(limits) {
  timer_ = std::thread([this] { timerLoop(); });
}

MemoryStore::~MemoryStore() {
  shutdown();
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
  }
  timerCv_.notify_all();
  timer_.join();
}

size_t MemoryStore::pendingWaiters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiters_.size();
}

size_t MemoryStore::totalBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return totalBytes_;
}

MemoryStore::Stats MemoryStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s;
  s.keys = totalKeys_;
  s.bytes = totalBytes_;
  s.namespaces = spaces_.size();
  s.jobs = jobs_.size();
  s.waiters = waiters_.size();
  s.operations = operations_;
  for (int i = 0; i < kRefusals; ++i) s.refused[i] = refused_[i];
  return s;
}

bool MemoryStore::refuse(Refusal why, pb::StoreResponse& resp, int code, std::string message) const {
  ++refused_[static_cast<int>(why)];
  return fail(resp, code, std::move(message));
}

void MemoryStore::dropIfEmpty(const std::string& ns) {
  auto it = spaces_.find(ns);
  if (it != spaces_.end() && it->second.kv.empty() && it->second.queues.empty() &&
      it->second.watchers.empty()) {
    spaces_.erase(it);
  }
}

void MemoryStore::emptyLocked(const std::string& ns, Namespace& space) {
  int64_t bytes = 0, keys = 0;
  for (const auto& [key, value] : space.kv) {
    bytes += static_cast<int64_t>(key.size() + value.size());
    ++keys;
  }
  for (const auto& [key, queue] : space.queues) {
    for (const auto& value : queue) bytes += static_cast<int64_t>(key.size() + value.size());
    if (!space.kv.count(key)) ++keys;
  }
  account(ns, -bytes, -keys);
  space.kv.clear();
  space.queues.clear();
}

size_t MemoryStore::dropJob(const std::string& job) {
  Ready ready;
  size_t dropped = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // "job" itself, then "job/..." up to "job0" ('0' follows '/').
    std::vector<std::string> names;
    if (spaces_.count(job)) names.push_back(job);
    for (auto it = spaces_.lower_bound(job + "/"), end = spaces_.lower_bound(job + "0"); it != end; ++it) {
      names.push_back(it->first);
    }
    for (const std::string& ns : names) {
      auto it = spaces_.find(ns);
      std::unordered_set<WaiterId> parked;
      for (const auto& [key, ids] : it->second.watchers) parked.insert(ids.begin(), ids.end());
      for (WaiterId id : parked) {
        const Waiter& w = waiters_.at(id);
        pb::StoreResponse resp;
        resp.set_id(w.requestId);
        fail(resp, kAborted, fmt::format("run {} is over and its keys are dropped", quoted(job)));
        ready.emplace_back(detach(id), std::move(resp));
      }
      emptyLocked(ns, it->second);
      spaces_.erase(it);
      ++dropped;
    }
  }
  for (auto& [cb, r] : ready) cb(std::move(r));
  return dropped;
}

MemoryStore::WaiterId MemoryStore::execute(const pb::StoreRequest& req, Completion done) {
  pb::StoreResponse resp;
  resp.set_id(req.id());
  Ready ready;
  WaiterId parked = kNotPending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    absl::Status valid = validateRequest(req, limits_);
    if (shutdown_) {
      fail(resp, kUnavailable, "store is shutting down");
    } else if (!valid.ok()) {
      refuse(Refusal::kLimit, resp, static_cast<int>(valid.code()), std::string(valid.message()));
    } else {
      ++operations_[req.op_case()];
      std::vector<std::string> waitKeys;
      switch (req.op_case()) {
        case pb::StoreRequest::kGet: waitKeys = {req.get().key()}; break;
        case pb::StoreRequest::kWait: waitKeys.assign(req.wait().keys().begin(), req.wait().keys().end()); break;
        case pb::StoreRequest::kMultiGet:
          waitKeys.assign(req.multi_get().keys().begin(), req.multi_get().keys().end());
          break;
        default: break;
      }
      bool blocking = req.op_case() == pb::StoreRequest::kGet ||
                      req.op_case() == pb::StoreRequest::kWait ||
                      req.op_case() == pb::StoreRequest::kMultiGet;
      if (blocking) {
        if (park(req, std::move(waitKeys), done, resp)) parked = nextWaiter_ - 1;
      } else {
        run(req, resp, ready);
      }
      dropIfEmpty(req.ns());
    }
  }
  for (auto& [cb, r] : ready) cb(std::move(r));
  if (parked == kNotPending) done(std::move(resp));
  return parked;
}

// Answers a blocking operation whose keys are all present, or parks it. Returns true when
// parked (then `done` has been moved into the waiter).
bool MemoryStore::park(const pb::StoreRequest& req, std::vector<std::string> keys,
                       Completion& done, pb::StoreResponse& resp) {
  Namespace& space = spaces_[req.ns()];
  Waiter w;
  w.op = req.op_case();
  w.keys = std::move(keys);
  if (allPresent(space, w.keys)) {
    fillValues(space, w, resp);
    return false;
  }
  if (req.no_wait()) {
    return fail(resp, kNotFound, fmt::format("missing {}", keyList(missingKeys(&space, w.keys))));
  }
  if (waiters_.size() >= limits_.maxWaiters) {
    return refuse(Refusal::kCapacity, resp, kResourceExhausted,
                fmt::format("{} operations already wait for keys; max_waiters={}",
                            waiters_.size(), limits_.maxWaiters));
  }
  if (auto job = jobs_.find(jobOf(req.ns()));
      job != jobs_.end() && job->second.waiters >= limits_.maxJobWaiters) {
    return refuse(Refusal::kJobQuota, resp, kResourceExhausted,
                fmt::format("job {} is at its quota: {} of its operations already wait for keys; "
                            "max_job_waiters={}",
                            quoted(jobOf(req.ns())), job->second.waiters, limits_.maxJobWaiters));
  }
  WaiterId id = nextWaiter_++;
  w.ns = req.ns();
  w.requestId = req.id();
  w.timeoutMs = req.timeout_ms();
  w.deadline = deadlineAfter(Millis(req.timeout_ms()));
  w.done = std::move(done);
  for (const auto& key : w.keys) space.watchers[key].insert(id);
  if (w.deadline != kNoDeadline) {
    bool earliest = timeouts_.empty() || w.deadline < timeouts_.begin()->first;
    timeouts_.emplace(w.deadline, id);
    if (earliest) timerCv_.notify_one();
  }
  account(req.ns(), 0, 0, 1);
  waiters_.emplace(id, std::move(w));
  return true;
}

bool MemoryStore::present(const Namespace& space, const std::string& key) {
  return space.kv.count(key) > 0 || space.queues.count(key) > 0;
}

std::vector<std::string> MemoryStore::missingKeys(const Namespace* space,
                                                  const std::vector<std::string>& keys) {
  std::vector<std::string> missing;
  for (const auto& key : keys) {
    if (space == nullptr || !present(*space, key)) missing.push_back(key);
  }
  return missing;
}

bool MemoryStore::allPresent(const Namespace& space, const std::vector<std::string>& keys) const {
  for (const auto& key : keys) {
    if (!present(space, key)) return false;
  }
  return true;
}

void MemoryStore::fillValues(const Namespace& space, const Waiter& w,
                             pb::StoreResponse& resp) const {
  resp.set_code(kOk);
  // A key present only as a queue reads as an empty value (as c10d's libuv server answers).
  auto valueOf = [&](const std::string& key) -> const std::string& {
    static const std::string kEmpty;
    auto it = space.kv.find(key);
    return it == space.kv.end() ? kEmpty : it->second;
  };
  if (w.op == pb::StoreRequest::kGet) {
    resp.set_value(valueOf(w.keys.front()));
  } else if (w.op == pb::StoreRequest::kMultiGet) {
    // One key may be named many times: the reply, not the store, is what could grow huge.
    size_t total = 0;
    for (const auto& key : w.keys) total += valueOf(key).size();
    if (total > limits_.maxReplyBytes) {
      refuse(Refusal::kCapacity, resp, kResourceExhausted,
           fmt::format("multi_get of {} keys would answer {} bytes, over max_reply_bytes={}",
                       w.keys.size(), total, limits_.maxReplyBytes));
      return;
    }
    auto* values = resp.mutable_values();
    for (const auto& key : w.keys) values->add_values(valueOf(key));
  }
}

MemoryStore::Completion MemoryStore::detach(WaiterId id) {
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return nullptr;
  Waiter& w = it->second;
  auto spaceIt = spaces_.find(w.ns);
  if (spaceIt != spaces_.end()) {
    for (const auto& key : w.keys) {
      auto watch = spaceIt->second.watchers.find(key);
      if (watch == spaceIt->second.watchers.end()) continue;
      watch->second.erase(id);
      if (watch->second.empty()) spaceIt->second.watchers.erase(watch);
    }
  }
  if (w.deadline != kNoDeadline) timeouts_.erase({w.deadline, id});
  account(w.ns, 0, 0, -1);
  Completion done = std::move(w.done);
  waiters_.erase(it);
  return done;
}

bool MemoryStore::cancel(WaiterId id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return false;
  std::string ns = it->second.ns;
  detach(id);
  dropIfEmpty(ns);
  return true;
}

void MemoryStore::keyArrived(Namespace& space, const std::string& key, Ready& ready,
                             bool onlyOne) {
  auto watch = space.watchers.find(key);
  if (watch == space.watchers.end()) return;
  std::vector<WaiterId> candidates(watch->second.begin(), watch->second.end());
  std::sort(candidates.begin(), candidates.end());  // the longest waiting first
  for (WaiterId id : candidates) {
    auto it = waiters_.find(id);
    if (it == waiters_.end() || !allPresent(space, it->second.keys)) continue;
    pb::StoreResponse resp;
    resp.set_id(it->second.requestId);
    fillValues(space, it->second, resp);
    ready.emplace_back(detach(id), std::move(resp));
    if (onlyOne) return;
  }
}

std::string MemoryStore::jobOf(const std::string& ns) { return ns.substr(0, ns.find('/')); }

bool MemoryStore::roomFor(const std::string& ns, const std::string& what, int64_t bytes,
                          int64_t keys, pb::StoreResponse& resp) const {
  if (bytes > 0 && totalBytes_ + static_cast<size_t>(bytes) > limits_.maxTotalBytes) {
    return refuse(Refusal::kCapacity, resp, kResourceExhausted,
                fmt::format("store is full: {} needs {} more bytes, {} of max_total_bytes={} are "
                            "in use",
                            what, bytes, totalBytes_, limits_.maxTotalBytes));
  }
  auto job = jobs_.find(jobOf(ns));
  JobUsage used = job == jobs_.end() ? JobUsage{} : job->second;
  if (bytes > 0 && used.bytes + static_cast<size_t>(bytes) > limits_.maxJobBytes) {
    return refuse(Refusal::kJobQuota, resp, kResourceExhausted,
                fmt::format("job {} is at its quota: {} needs {} more bytes, {} of "
                            "max_job_bytes={} are in use",
                            quoted(jobOf(ns)), what, bytes, used.bytes, limits_.maxJobBytes));
  }
  if (keys > 0 && used.keys + static_cast<size_t>(keys) > limits_.maxJobKeys) {
    return refuse(Refusal::kJobQuota, resp, kResourceExhausted,
                fmt::format("job {} is at its quota: {} needs {} more key(s), {} of "
                            "max_job_keys={} are in use",
                            quoted(jobOf(ns)), what, keys, used.keys, limits_.maxJobKeys));
  }
  return true;
}

void MemoryStore::account(const std::string& ns, int64_t bytes, int64_t keys, int64_t waiters) {
  totalBytes_ = static_cast<size_t>(static_cast<int64_t>(totalBytes_) + bytes);
  totalKeys_ = static_cast<size_t>(static_cast<int64_t>(totalKeys_) + keys);
  std::string job = jobOf(ns);
  JobUsage& used = jobs_[job];
  used.bytes = static_cast<size_t>(static_cast<int64_t>(used.bytes) + bytes);
  used.keys = static_cast<size_t>(static_cast<int64_t>(used.keys) + keys);
  used.waiters = static_cast<size_t>(static_cast<int64_t>(used.waiters) + waiters);
  if (used.bytes == 0 && used.keys == 0 && used.waiters == 0) jobs_.erase(job);
}

bool MemoryStore::setLocked(Namespace& space, const std::string& ns, const std::string& key,
                            std::string value, pb::StoreResponse& resp, Ready& ready, bool roomChecked) {
  auto it = space.kv.find(key);
  bool fresh = it == space.kv.end() && space.queues.count(key) == 0;
  int64_t oldBytes = it == space.kv.end() ? 0 : static_cast<int64_t>(key.size() + it->second.size());
  int64_t delta = static_cast<int64_t>(key.size() + value.size()) - oldBytes;
  if (!roomChecked && !roomFor(ns, "setting " + quoted(key), delta, fresh ? 1 : 0, resp)) return false;
  account(ns, delta, fresh ? 1 : 0);
  if (it == space.kv.end()) {
    space.kv.emplace(key, std::move(value));
    keyArrived(space, key, ready);
  } else {
    it->second = std::move(value);
  }
  return true;
}

// Requests here have passed validateRequest: sizes and counts are within the limits.
void MemoryStore::run(const pb::StoreRequest& req, pb::StoreResponse& resp, Ready& ready) {
  resp.set_code(kOk);
  Namespace& space = spaces_[req.ns()];
  switch (req.op_case()) {
    case pb::StoreRequest::kSet: {
      const auto& op = req.set();
      setLocked(space, req.ns(), op.key(), op.value(), resp, ready);
      return;
    }
    case pb::StoreRequest::kAdd: {
      const auto& op = req.add();
      int64_t current = 0;
      auto it = space.kv.find(op.key());
      if (it != space.kv.end()) {
        switch (leadingInteger(it->second, current)) {
          case Leading::kNumber:
            break;
          case Leading::kNoDigits:
            fail(resp, kInvalidArgument,
                 fmt::format("add: the value of key {} does not start with a decimal integer",
                             quoted(op.key())));
            return;
          case Leading::kOutOfRange:
            fail(resp, kOutOfRange,
                 fmt::format("add: the value of key {} is past 64 bits", quoted(op.key())));
            return;
        }
      }
      int64_t next = 0;
      if (__builtin_add_overflow(current, op.delta(), &next)) {
        fail(resp, kOutOfRange,
             fmt::format("add: {} + {} overflows 64 bits for key {}", current, op.delta(),
                         quoted(op.key())));
        return;
      }
      if (setLocked(space, req.ns(), op.key(), std::to_string(next), resp, ready)) {
        resp.set_number(next);
      }
      return;
    }
    case pb::StoreRequest::kCompareSet: {
      const auto& op = req.compare_set();
      auto it = space.kv.find(op.key());
      if (it == space.kv.end()) {
        if (op.expected().empty()) {
          if (setLocked(space, req.ns(), op.key(), op.desired(), resp, ready)) {
            resp.set_value(op.desired());
          }
        } else {
          resp.set_value(op.expected());
        }
        return;
      }
      if (it->second == op.expected()) {
        if (!setLocked(space, req.ns(), op.key(), op.desired(), resp, ready)) return;
        it = space.kv.find(op.key());
      }
      resp.set_value(it->second);
      return;
    }
    case pb::StoreRequest::kCheck: {
      bool all = true;
      for (const auto& key : req.check().keys()) all = all && present(space, key);
      resp.set_flag(all);
      return;
    }
    case pb::StoreRequest::kDeleteKey: {
      const auto& key = req.delete_key().key();
      auto it = space.kv.find(key);
      if (it == space.kv.end()) {
        resp.set_number(0);
        return;
      }
      account(req.ns(), -static_cast<int64_t>(key.size() + it->second.size()),
              space.queues.count(key) ? 0 : -1);
      space.kv.erase(it);
      resp.set_number(1);
      return;
    }
    case pb::StoreRequest::kNumKeys:
      resp.set_number(static_cast<int64_t>(space.kv.size()));
      return;
    case pb::StoreRequest::kMultiSet: {
      const auto& op = req.multi_set();
      // One change: the room is checked for what the whole call leaves (a key set twice at its
      // last value), then every key is set without a check of its own, so that a refused call
      // changes nothing and a taken one is taken whole, whatever order its keys grow and shrink.
      std::unordered_map<std::string_view, int> last;  // key -> the index of its last value
      for (int i = 0; i < op.keys_size(); ++i) last[op.keys(i)] = i;
      int64_t delta = 0, fresh = 0;
      for (const auto& [key, i] : last) {
        auto it = space.kv.find(std::string(key));
        delta += static_cast<int64_t>(key.size() + op.values(i).size());
        if (it != space.kv.end()) {
          delta -= static_cast<int64_t>(key.size() + it->second.size());
        } else if (!space.queues.count(std::string(key))) {
          ++fresh;
        }
      }
      if (!roomFor(req.ns(), "multi_set", delta, fresh, resp)) return;
      for (int i = 0; i < op.keys_size(); ++i) {
        if (last[op.keys(i)] != i) continue;  // a key set twice: its last value
        setLocked(space, req.ns(), op.keys(i), op.values(i), resp, ready, /*roomChecked=*/true);
      }
      return;
    }
    case pb::StoreRequest::kAppend: {
      const auto& op = req.append();
      auto it = space.kv.find(op.key());
      std::string value = it == space.kv.end() ? std::string() : it->second;
      value += op.value();
      if (value.size() > limits_.maxValueBytes) {
        fail(resp, kInvalidArgument,
             fmt::format("appending to key {} makes its value {} bytes, over max_value_bytes={}",
                         quoted(op.key()), value.size(), limits_.maxValueBytes));
        return;
      }
      size_t length = value.size();
      if (setLocked(space, req.ns(), op.key(), std::move(value), resp, ready)) {
        resp.set_number(static_cast<int64_t>(length));
      }
      return;
    }
    case pb::StoreRequest::kQueuePush: {
      const auto& op = req.queue_push();
      int64_t bytes = static_cast<int64_t>(op.key().size() + op.value().size());
      bool fresh = !space.queues.count(op.key()) && !space.kv.count(op.key());
      if (!roomFor(req.ns(), "pushing to queue " + quoted(op.key()), bytes, fresh ? 1 : 0, resp)) {
        return;
      }
      account(req.ns(), bytes, fresh ? 1 : 0);
      auto& queue = space.queues[op.key()];
      queue.push_back(op.value());
      keyArrived(space, op.key(), ready, /*onlyOne=*/true);
      return;
    }
    case pb::StoreRequest::kQueuePop: {
      const auto& key = req.queue_pop().key();
      auto it = space.queues.find(key);
      if (it == space.queues.end()) {
        resp.set_queue_length(0);
        return;
      }
      resp.set_queue_length(static_cast<int64_t>(it->second.size()));
      bool last = it->second.size() == 1 && !space.kv.count(key);
      account(req.ns(), -static_cast<int64_t>(key.size() + it->second.front().size()), last ? -1 : 0);
      resp.set_value(std::move(it->second.front()));
      it->second.pop_front();
      if (it->second.empty()) space.queues.erase(it);
      return;
    }
    case pb::StoreRequest::kQueueLen: {
      auto it = space.queues.find(req.queue_len().key());
      resp.set_number(it == space.queues.end() ? 0 : static_cast<int64_t>(it->second.size()));
      return;
    }
    case pb::StoreRequest::kList: {
      size_t total = 0;
      for (const auto& [key, value] : space.kv) total += key.size();
      if (total > limits_.maxReplyBytes) {
        refuse(Refusal::kCapacity, resp, kResourceExhausted,
             fmt::format("list would answer {} keys ({} bytes), over max_reply_bytes={}",
                         space.kv.size(), total, limits_.maxReplyBytes));
        return;
      }
      auto* values = resp.mutable_values();
      for (const auto& [key, value] : space.kv) values->add_values(key);
      return;
    }
    case pb::StoreRequest::kClear: {
      resp.set_number(static_cast<int64_t>(space.kv.size()));
      emptyLocked(req.ns(), space);
      return;
    }
    case pb::StoreRequest::kInfo: {
      auto* info = resp.mutable_info();
      info->set_max_key_bytes(limits_.maxKeyBytes);
      info->set_max_value_bytes(limits_.maxValueBytes);
      info->set_max_keys_per_call(limits_.maxKeysPerCall);
      info->set_max_total_bytes(limits_.maxTotalBytes);
      info->set_version(kStoreVersion);
      return;
    }
    default:
      return;  // validateRequest refused anything else
  }
}

void MemoryStore::shutdown() {
  Ready ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
    std::vector<WaiterId> ids;
    ids.reserve(waiters_.size());
    for (const auto& [id, w] : waiters_) ids.push_back(id);
    for (WaiterId id : ids) {
      pb::StoreResponse resp;
      resp.set_id(waiters_.at(id).requestId);
      fail(resp, kUnavailable, "store is shutting down");
      ready.emplace_back(detach(id), std::move(resp));
    }
  }
  timerCv_.notify_all();
  for (auto& [cb, r] : ready) cb(std::move(r));
}

void MemoryStore::timerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (shutdown_ && waiters_.empty()) return;
    if (timeouts_.empty()) {
      timerCv_.wait(lock);
      continue;
    }
    Deadline next = timeouts_.begin()->first;
    if (Clock::now() < next) {
      timerCv_.wait_until(lock, next);
      continue;
    }
    Ready ready;
    auto now = Clock::now();
    while (!timeouts_.empty() && timeouts_.begin()->first <= now) {
      WaiterId id = timeouts_.begin()->second;
      const Waiter& w = waiters_.at(id);
      auto spaceIt = spaces_.find(w.ns);
      std::vector<std::string> missing =
          missingKeys(spaceIt == spaces_.end() ? nullptr : &spaceIt->second, w.keys);
      pb::StoreResponse resp;
      resp.set_id(w.requestId);
      fail(resp, kDeadlineExceeded,
           fmt::format("timed out after {} ms waiting for {} of {} key(s) in namespace '{}': "
                       "missing {}",
                       w.timeoutMs, missing.size(), w.keys.size(), w.ns, keyList(missing)));
      std::string ns = w.ns;
      ready.emplace_back(detach(id), std::move(resp));
      dropIfEmpty(ns);
    }
    lock.unlock();
    for (auto& [cb, r] : ready) cb(std::move(r));
    lock.lock();
  }
}

}  // namespace muster::rendezvous
