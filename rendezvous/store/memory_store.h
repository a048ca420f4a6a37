// The store's state: every namespace's keys, the operations waiting for keys, their deadlines
// and the limits. The gRPC service and LocalStore both execute requests here.
#pragma once

#include <condition_variable>
#include <deque>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/deadline.h"
#include "muster/v1/store.pb.h"

namespace muster::rendezvous {

namespace pb = ::muster::v1;

// A stored value read as c10d's servers read a counter (std::stoll): white space, an optional
// sign, then the decimal digits up to the first other byte (" 7", "+5", "12abc" are 7, 5, 12).
enum class Leading { kNumber, kNoDigits, kOutOfRange };
Leading leadingInteger(std::string_view text, int64_t& out);

// Caps that keep one client from taking the store down. Over a cap the request fails with
// INVALID_ARGUMENT (key, value, keys per call) or RESOURCE_EXHAUSTED (total bytes, waiters,
// a job's quota), with a message that names the cap and its numbers; other clients are not
// affected.
struct StoreLimits {
  size_t maxKeyBytes = 8192;  // torch's libuv TCPStore server takes keys up to 8 KiB
  size_t maxValueBytes = 64u << 20;
  size_t maxKeysPerCall = 16384;
  size_t maxTotalBytes = size_t{2} << 30;
  size_t maxWaiters = 1'000'000;
  // Per job: what the namespaces of one job (a namespace's part before its first '/': the run
  // id, as "<run id>/<round>") may hold together, so that one job cannot use up the store for
  // the others. Unlimited by default (launch's own store serves one job); rendezvousd sets them.
  size_t maxJobBytes = SIZE_MAX;
  size_t maxJobKeys = SIZE_MAX;
  size_t maxJobWaiters = SIZE_MAX;
  // The most one answer may carry (multi_get naming a large key many times, list).
  size_t maxReplyBytes = 256u << 20;
};

// The largest request the store takes: a compare_set of the longest key and two of the largest
// values, or a call naming max_keys_per_call of the longest keys, whichever is larger, in the
// longest namespace, with room for framing (saturating at SIZE_MAX). The server refuses a larger
// message (gRPC's receive limit), and validateRequest a multi_set that would not fit.
size_t largestRequest(const StoreLimits& limits);

// Checks what can be checked without the store's state: key sizes, value sizes, keys per call,
// multi_set's shape. INVALID_ARGUMENT naming the limit, else OK. Used by the store on every
// request and by clients before they send a request they do not wait for.
absl::Status validateRequest(const pb::StoreRequest& request, const StoreLimits& limits);

// Thread-safety: every method may be called from any thread. One mutex owns all state;
// completions run outside it. A timer thread ends waiters whose deadline passes.
// Lifetime: destroying the store ends pending operations with UNAVAILABLE.
class MemoryStore {
 public:
  using Completion = std::function<void(pb::StoreResponse&&)>;
  using WaiterId = uint64_t;
  static constexpr WaiterId kNotPending = 0;

  explicit MemoryStore(StoreLimits limits = {});
  ~MemoryStore();
  MemoryStore(const MemoryStore&) = delete;
  MemoryStore& operator=(const MemoryStore&) = delete;

  // Runs `request`; `done` runs exactly once with the response (its id is the request's).
  // Operations that can answer at once call `done` before execute returns. A get, wait or
  // multi_get whose keys are missing is parked: no thread waits for it; `done` runs later on the
  // thread that sets the last key, on the timer thread at its deadline, or in shutdown(). Then
  // execute returns the waiter's id, else kNotPending.
  WaiterId execute(const pb::StoreRequest& request, Completion done);

  // Withdraws a parked operation (its client went away). True if it was still parked: its
  // `done` will never run. False if it has completed or is completing right now.
  bool cancel(WaiterId id);

  // Ends every parked operation with UNAVAILABLE and answers every later request so.
  void shutdown();

  // Drops every namespace of `job` (a run id: "job" and "job/..."): its keys and queues go, and
  // its parked operations end with ABORTED. rendezvousd calls it when it forgets a run.
  // Returns the namespaces dropped.
  size_t dropJob(const std::string& job);

  size_t pendingWaiters() const;
  size_t totalBytes() const;

  // Why requests were refused (metrics).
  enum class Refusal { kLimit, kCapacity, kJobQuota };
  static constexpr int kRefusals = 3;
  struct Stats {
    size_t keys = 0, bytes = 0, namespaces = 0, jobs = 0, waiters = 0;
    // Requests since start, by operation (pb::StoreRequest::OpCase).
    std::map<int, uint64_t> operations;
    // Requests refused since start: over a size or count limit (INVALID_ARGUMENT), over the
    // store's capacity (total bytes, waiters, reply size), over a job's quota.
    uint64_t refused[kRefusals] = {};
  };
  Stats stats() const;
  const StoreLimits& limits() const { return limits_; }

 private:
  struct Waiter {
    std::string ns;
    std::vector<std::string> keys;
    pb::StoreRequest::OpCase op;
    uint64_t requestId = 0;
    uint64_t timeoutMs = 0;
    Deadline deadline = kNoDeadline;
    Completion done;
  };
  struct Namespace {
    std::unordered_map<std::string, std::string> kv;
    std::unordered_map<std::string, std::deque<std::string>> queues;  // never empty ones
    std::unordered_map<std::string, std::unordered_set<WaiterId>> watchers;
  };
  using Ready = std::vector<std::pair<Completion, pb::StoreResponse>>;

  // All of these run with mu_ held.
  void run(const pb::StoreRequest& req, pb::StoreResponse& resp, Ready& ready);
  bool park(const pb::StoreRequest& req, std::vector<std::string> keys, Completion& done,
            pb::StoreResponse& resp);
  // `roomChecked`: the caller checked the room for a call as a whole (a multi_set): no check of
  // this key's own, which could refuse part of a call the whole of which fits.
  bool setLocked(Namespace& space, const std::string& ns, const std::string& key,
                 std::string value, pb::StoreResponse& resp, Ready& ready, bool roomChecked = false);
  // Completes the waiters whose keys are now all present: every one, or only the first
  // (a queue push, whose value one pop takes).
  void keyArrived(Namespace& space, const std::string& key, Ready& ready, bool onlyOne = false);
  static bool present(const Namespace& space, const std::string& key);
  // The keys not present in `space` (all of them when it is null: no such namespace).
  static std::vector<std::string> missingKeys(const Namespace* space,
                                              const std::vector<std::string>& keys);
  bool allPresent(const Namespace& space, const std::vector<std::string>& keys) const;
  void fillValues(const Namespace& space, const Waiter& w, pb::StoreResponse& resp) const;
  Completion detach(WaiterId id);
  void timerLoop();
  // What one job holds (its namespaces together).
  struct JobUsage {
    size_t bytes = 0, keys = 0, waiters = 0;
  };
  static std::string jobOf(const std::string& ns);
  // Whether `ns` may grow by `bytes` and `keys` (either may be negative or 0); if not, `resp`
  // says which cap, with its numbers. `what`: "setting \"k\"", for the message.
  bool roomFor(const std::string& ns, const std::string& what, int64_t bytes, int64_t keys,
               pb::StoreResponse& resp) const;
  // Books the change in the store's total and the job's usage.
  void account(const std::string& ns, int64_t bytes, int64_t keys, int64_t waiters = 0);
  // Deletes the keys and queues of `ns` (not its waiters), booking what they held.
  void emptyLocked(const std::string& ns, Namespace& space);
  // A namespace with no key, queue or waiter is not kept.
  void dropIfEmpty(const std::string& ns);
  // Counts a refusal and fails `resp` with it; returns false.
  bool refuse(Refusal why, pb::StoreResponse& resp, int code, std::string message) const;

  const StoreLimits limits_;
  mutable std::mutex mu_;
  std::condition_variable timerCv_;
  // Ordered: a job's namespaces ("job", "job/...") are one range.
  std::map<std::string, Namespace> spaces_;
  std::unordered_map<WaiterId, Waiter> waiters_;
  std::set<std::pair<Deadline, WaiterId>> timeouts_;
  WaiterId nextWaiter_ = 1;
  size_t totalBytes_ = 0;
  size_t totalKeys_ = 0;
  std::map<int, uint64_t> operations_;
  mutable uint64_t refused_[kRefusals] = {};
  std::unordered_map<std::string, JobUsage> jobs_;  // jobs holding anything
  bool shutdown_ = false;
  std::thread timer_;
};

}  // namespace muster::rendezvous
