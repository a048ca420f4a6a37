// StopAgreement: the stop step of every node, through the store (stop_agreement.h).
#include "launcher/stop_agreement.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <condition_variable>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <boost/asio/post.hpp>
#include <fmt/format.h>

#include "common/deadline.h"
#include "common/stop_board.h"
#include "rendezvous/client/store_client.h"

namespace muster::launcher {

namespace {
// How long one watching call waits: how soon this node's request is sent, and the store's load
// (one parked wait a node, renewed twice a second).
constexpr Millis kSlice{500};

// Worth trying again: the call's time ran out, or the connection broke (the client reconnects).
bool transient(const absl::Status& s) {
  return s.code() == absl::StatusCode::kDeadlineExceeded || s.code() == absl::StatusCode::kUnavailable;
}

std::optional<int64_t> number(const std::string& text) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}
}  // namespace

// What the thread and the agent share. The agent's handlers are called through `io` only while
// `live` holds (checked on the io thread, where the agent clears it).
struct StopAgreement::Shared {
  boost::asio::io_context& io;
  StopAgreementSetup setup;
  Handlers handlers;
  std::atomic<bool> cancelled{false};
  bool live = true;  // io thread only
  std::mutex mu;
  std::condition_variable cv;
  std::optional<int64_t> toRequest;  // this node's notice, not yet sent
  std::optional<int64_t> horizon;    // this node's offer
  std::promise<void> ended;          // set when run() returns

  Shared(boost::asio::io_context& i, StopAgreementSetup s, Handlers h)
      : io(i), setup(std::move(s)), handlers(std::move(h)) {}

  // Runs `f` on the io thread unless the agreement is gone by then.
  template <typename F>
  void onIo(std::shared_ptr<Shared> self, F f) {
    boost::asio::post(io, [self, f = std::move(f)] {
      if (self->live) f(*self);
    });
  }

  void fail(std::shared_ptr<Shared> self, const absl::Status& s) {
    if (cancelled) return;
    std::string why(s.message());
    onIo(self, [why](Shared& me) { me.handlers.failed(why); });
  }

  void run(std::shared_ptr<Shared> self);
};

void StopAgreement::Shared::run(std::shared_ptr<Shared> self) {
  rendezvous::ClientOptions options{.target = setup.endpoint,
                                    .ns = setup.storeNamespace,
                                    .token = setup.token,
                                    .tlsCaPem = setup.tlsCaPem,
                                    .tlsServerName = setup.tlsServerName};
  std::unique_ptr<rendezvous::StoreClient> store;
  while (!cancelled && !store) {
    auto connected = rendezvous::StoreClient::connect(options, deadlineAfter(kSlice));
    if (connected.ok()) {
      store = std::move(*connected);
    } else if (!transient(connected.status())) {
      return fail(self, connected.status());
    }
  }
  // The request: this node's, or another's.
  std::string reason;
  while (!cancelled) {
    std::optional<int64_t> mine;
    {
      std::lock_guard lock(mu);
      mine.swap(toRequest);
    }
    if (mine) {
      auto set = store->compareSet(stopboard::kRequestKey, "", std::to_string(*mine));
      if (!set.ok() && !transient(set.status())) return fail(self, set.status());
      if (!set.ok()) {
        std::lock_guard lock(mu);
        if (!toRequest) toRequest = mine;  // sent again on the next turn
      }
    }
    auto waited = store->wait({stopboard::kRequestKey}, deadlineAfter(kSlice));
    if (waited.ok()) {
      auto got = store->get(stopboard::kRequestKey, deadlineAfter(kSlice));
      if (got.ok()) {
        reason = *got;
        break;
      }
      if (!transient(got.status())) return fail(self, got.status());
    } else if (!transient(waited)) {
      return fail(self, waited);
    }
  }
  if (cancelled) return;
  int64_t why = number(reason).value_or(0);
  onIo(self, [why](Shared& me) { me.handlers.requested(why); });
  // This node's horizon, once the agent froze its board.
  int64_t mine = 0;
  {
    std::unique_lock lock(mu);
    while (!cancelled && !horizon) cv.wait_for(lock, kSlice);
    if (cancelled) return;
    mine = *horizon;
  }
  std::string offered = fmt::format("horizon/{}", setup.groupRank);
  while (!cancelled) {
    auto s = store->set(offered, std::to_string(mine));
    if (s.ok()) break;
    if (!transient(s)) return fail(self, s);
  }
  std::vector<std::string> keys;
  for (int n = 0; n < setup.groupWorldSize; ++n) keys.push_back(fmt::format("horizon/{}", n));
  absl::StatusOr<std::vector<std::string>> all = absl::UnavailableError("not yet");
  while (!cancelled) {
    auto waited = store->wait(keys, deadlineAfter(kSlice));
    if (waited.ok()) {
      all = store->multiGet(keys, deadlineAfter(kSlice));
      if (all.ok()) break;
      if (!transient(all.status())) return fail(self, all.status());
    } else if (!transient(waited)) {
      return fail(self, waited);
    }
  }
  if (cancelled) return;
  int64_t step = 0;
  for (size_t n = 0; n < all->size(); ++n) {
    auto h = number((*all)[n]);
    if (!h || *h < 0) {
      return fail(self, absl::DataLossError(fmt::format("node {} offered the horizon '{}'", n, (*all)[n])));
    }
    step = std::max(step, *h);
  }
  onIo(self, [step, why](Shared& me) { me.handlers.agreed(step, why); });
}

StopAgreement::StopAgreement(boost::asio::io_context& io, StopAgreementSetup setup, Handlers handlers)
    : shared_(std::make_shared<Shared>(io, std::move(setup), std::move(handlers))) {
  thread_ = std::thread([self = shared_] {
    self->run(self);
    self->ended.set_value();
  });
}

StopAgreement::~StopAgreement() {
  shared_->live = false;
  shared_->cancelled = true;
  shared_->cv.notify_all();
  // Its calls wait half a second at most, but for compare_set (the store's own deadline): past
  // a second the thread is left to end on its own (it holds only the shared state).
  if (shared_->ended.get_future().wait_for(std::chrono::seconds(1)) == std::future_status::ready) {
    thread_.join();
  } else {
    thread_.detach();
  }
}

void StopAgreement::request(int64_t reason) {
  std::lock_guard lock(shared_->mu);
  if (!shared_->toRequest) shared_->toRequest = reason;
}

void StopAgreement::offer(int64_t horizon) {
  {
    std::lock_guard lock(shared_->mu);
    if (!shared_->horizon) shared_->horizon = horizon;
  }
  shared_->cv.notify_all();
}

}  // namespace muster::launcher
