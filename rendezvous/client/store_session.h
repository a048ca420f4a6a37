// One session of a StoreClient's connection, on a SessionStream (gRPC or the direct path):
// many operations in flight, answers matched to callers by request id, writes batched, sets
// kept for replay until the store confirms them. Only store_client.cc uses it; the class is
// whole here (one user, and its methods are small and read best beside its state).
#pragma once

#include <fmt/format.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "common/deadline.h"
#include "common/log.h"
#include "muster/v1/store.pb.h"
#include "rendezvous/client/session_stream.h"
#include "rendezvous/rpc/grpc_status.h"
#include "rendezvous/store/store.h"

namespace muster::rendezvous {

// Internal to the client (a namespace of its own: its names are short).
namespace store_session {

// How long past an operation's deadline the client still waits for the server's own answer
// (which names the missing keys) before it gives up by itself.
inline constexpr Millis kAnswerGrace{2000};
// Sets (count, bytes) a session keeps for replay before it asks the server to confirm them.
inline constexpr size_t kMaxUnacked = 4096;
inline constexpr size_t kMaxUnackedBytes = size_t{64} << 20;
// Ids of quiet requests (answered only on failure) carry this bit, so that their failure
// answers are told apart from late answers to callers that gave up.
inline constexpr uint64_t kQuietBit = uint64_t{1} << 63;
// What an entry of StoreRequest.batch costs beyond its own bytes, at most: a tag and a length.
inline constexpr size_t kEntryFraming = 6;

// Whether a failure is the connection's (worth a new session), not the server's answer.
inline bool isTransport(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable;
}

// The client's logger ("store-client"), the connection's too.
inline auto logger() {
  static auto l = log::get("store-client");
  return l;
}

// One Session stream. There is no reader thread: a caller waiting for its answer reads the
// stream itself when nobody else is reading, and hands every answer it reads to its owner
// (leader/followers). A lone caller so gets its answer without a thread hand-off.
// Writes go through an outbox: the first caller to find no writer writes whatever is queued,
// several requests per message when the server batches (group commit), the others return at
// once. Broken for good once a read sees the end; the connection then opens a new one.
class Session {
 public:
  Session(std::unique_ptr<SessionStream> stream, std::string peer)
      : stream_(std::move(stream)), peer_(std::move(peer)) {}

  bool direct() const { return stream_->direct(); }

  // Half-closes, then reads what is left (answers to quiet requests) so that the server has
  // applied every request before the stream ends; gives up after kCloseWait.
  ~Session() {
    static constexpr Millis kCloseWait{2000};
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !readerActive_; });
    if (broken_) return;
    lock.unlock();
    // The outbox is empty: its writer empties it before letting go, and every caller has.
    {
      std::lock_guard<std::mutex> w(writeMu_);
      stream_->writesDone();
    }
    std::mutex watchMu;
    std::condition_variable watchCv;
    bool drained = false;
    std::thread watchdog([&] {
      std::unique_lock<std::mutex> l(watchMu);
      if (!watchCv.wait_for(l, kCloseWait, [&] { return drained; })) stream_->cancel();
    });
    pb::StoreResponse response;
    while (stream_->read(&response)) {
      std::lock_guard<std::mutex> l(mu_);
      dispatchLocked(std::move(response));
    }
    grpc::Status ended = stream_->finish();
    if (!ended.ok() && !unacked_.empty()) {
      logger()->error("store {}: the connection ended ({}) before {} set(s) were confirmed; they "
                      "may be lost", peer_, ended.error_message(), unacked_.size());
    }
    {
      std::lock_guard<std::mutex> l(watchMu);
      drained = true;
    }
    watchCv.notify_all();
    watchdog.join();
  }

  // The server batches (its info said so): one message may carry up to `bytes` of requests.
  void batchUpTo(size_t bytes) {
    std::lock_guard<std::mutex> lock(outMu_);
    batchBytes_ = bytes;
  }

  bool broken() const {
    std::lock_guard<std::mutex> lock(mu_);
    return broken_;
  }

  // Sends the request without waiting for an answer. Errors: a transport failure (`*transport`
  // set), or the failure of an earlier quiet request.
  absl::Status post(pb::StoreRequest& request, bool* transport) {
    *transport = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (broken_) {
        *transport = isTransport(brokenStatus_);
        return brokenStatus_;
      }
      if (!deferred_.ok()) return std::exchange(deferred_, absl::OkStatus());
    }
    uint64_t seq = 0;
    if (!send(request, true, &seq)) {
      // The stream has ended; without a reader to learn why, say so and let the connection
      // open a new one. The caller sends this request again there: it is not replayed too.
      std::lock_guard<std::mutex> lock(mu_);
      forgetUnackedLocked(seq);
      if (!broken_) breakLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the stream ended"));
      *transport = isTransport(brokenStatus_);
      return brokenStatus_;
    }
    return absl::OkStatus();
  }

  // Quiet requests written but not known to be applied: the server applies a session's
  // requests in order, so any answer proves everything sent before it.
  size_t unacked() const {
    std::lock_guard<std::mutex> lock(mu_);
    return unacked_.size();
  }
  // The first refusal of a quiet request not yet returned to anyone.
  absl::Status takeDeferred() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(deferred_, absl::OkStatus());
  }
  // Whether enough is kept that the server should confirm it now.
  bool unackedFull() const {
    std::lock_guard<std::mutex> lock(mu_);
    return unacked_.size() >= kMaxUnacked || unackedBytes_ >= kMaxUnackedBytes;
  }
  std::deque<pb::StoreRequest> takeUnacked() {
    std::lock_guard<std::mutex> lock(mu_);
    std::deque<pb::StoreRequest> out;
    for (auto& kept : unacked_) out.push_back(std::move(kept.request));
    unacked_.clear();
    unackedBytes_ = 0;
    return out;
  }

  // Sends `requests` (quiet, from a broken session) first on this new one, before anyone else
  // uses it. Those a write does not take stay unacknowledged here, for the session after.
  void replay(std::deque<pb::StoreRequest> requests) {
    if (requests.empty()) return;
    logger()->info("store {}: sending again {} set(s) the lost connection may not have delivered",
                   peer_, requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      uint64_t seq = 0;
      if (send(requests[i], true, &seq)) continue;
      // Kept for the session after: this one (unless send kept it) and those not sent yet.
      std::lock_guard<std::mutex> out(outMu_);
      std::lock_guard<std::mutex> lock(mu_);
      bool kept = !unacked_.empty() && unacked_.back().seq == seq;
      for (size_t j = kept ? i + 1 : i; j < requests.size(); ++j) {
        size_t bytes = requests[j].ByteSizeLong();
        unackedBytes_ += bytes;
        unacked_.push_back({nextId_++, std::move(requests[j]), bytes});
      }
      if (!broken_) breakLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the stream ended"));
      return;
    }
  }

  // Sends the request and waits for its answer. A transport failure comes back as UNAVAILABLE
  // with `*transport` set.
  absl::StatusOr<pb::StoreResponse> call(pb::StoreRequest& request, Deadline deadline,
                                         bool* transport) {
    *transport = false;
    std::unique_lock<std::mutex> lock(mu_);
    if (broken_) {
      *transport = isTransport(brokenStatus_);
      return brokenStatus_;
    }
    if (!deferred_.ok()) return std::exchange(deferred_, absl::OkStatus());
    lock.unlock();
    // A failed write means the stream is ending; reading below says why.
    uint64_t id = 0;
    send(request, false, &id);
    lock.lock();
    // Made by send; references to unordered_map elements survive rehashing.
    auto& slot = pending_[id];
    Deadline giveUp = deadline == kNoDeadline ? kNoDeadline : deadline + kAnswerGrace;
    while (true) {
      if (slot.has_value()) {
        auto result = std::move(*slot);
        pending_.erase(id);
        *transport = !result.ok() && isTransport(result.status());
        return result;
      }
      if (broken_) {
        pending_.erase(id);
        *transport = isTransport(brokenStatus_);
        return brokenStatus_;
      }
      if (!readerActive_) {
        readerActive_ = true;
        lock.unlock();
        pb::StoreResponse response;
        bool ok = stream_->read(&response);
        grpc::Status ended;
        if (!ok) {
          std::lock_guard<std::mutex> w(writeMu_);
          ended = stream_->finish();
        }
        lock.lock();
        readerActive_ = false;
        if (ok) {
          dispatchLocked(std::move(response));
        } else {
          breakLocked(ended);
        }
        cv_.notify_all();
        continue;
      }
      if (giveUp == kNoDeadline) {
        cv_.wait(lock);
      } else if (cv_.wait_until(lock, giveUp) == std::cv_status::timeout && !slot.has_value()) {
        pending_.erase(id);
        return absl::DeadlineExceededError("the store did not answer before the deadline");
      }
    }
  }

 private:
  // Queues a copy of `request` for the stream, numbered (`*id`) in queue order, the order the
  // server sees, so that an answer proves everything numbered before it applied. Before it can
  // be written, a quiet request is kept in unacked_ (for replay) and a call's answer slot is
  // made. Then, unless a writer is at work, writes the queue. False when the stream has ended,
  // or, for a quiet request, the session is broken (it is then not kept, unless its own write
  // failed).
  bool send(const pb::StoreRequest& request, bool quiet, uint64_t* id) {
    std::unique_lock<std::mutex> out(outMu_);
    uint64_t seq = nextId_++;
    *id = seq;
    pb::StoreRequest queued = request;
    queued.set_quiet(quiet);
    queued.set_id(quiet ? seq | kQuietBit : seq);
    size_t bytes = queued.ByteSizeLong();
    {
      std::lock_guard<std::mutex> lock(mu_);  // the one order: outMu_, then mu_
      if (!quiet) {
        pending_[seq];
      } else if (broken_ || outEnded_) {
        // Not kept, so not sent: a set queued now could be dropped with the outbox and never
        // replayed. The caller sends it on a new session.
        return false;
      } else {
        unacked_.push_back({seq, queued, bytes});
        unackedBytes_ += bytes;
      }
    }
    if (outEnded_) return false;
    outbox_.emplace_back(std::move(queued), bytes);
    if (writing_) return true;  // the writer at work takes it along
    writing_ = true;
    return drainLocked(out);
  }

  // Drops the quiet request `seq` from unacked_ (its caller sends it again).
  void forgetUnackedLocked(uint64_t seq) {
    for (auto it = unacked_.rbegin(); it != unacked_.rend(); ++it) {
      if (it->seq == seq) {
        unackedBytes_ -= std::min(unackedBytes_, it->bytes);
        unacked_.erase(std::next(it).base());
        return;
      }
    }
  }

  // As the writer (writing_ set, outMu_ held): writes the outbox until it is empty, as many
  // requests to a message as the server takes. False, and the outbox dropped, when a write
  // fails (the stream has ended; quiet requests are replayed from unacked_, callers waiting
  // for answers learn of it from their read).
  bool drainLocked(std::unique_lock<std::mutex>& out) {
    bool ok = true;
    while (!outbox_.empty()) {
      pb::StoreRequest message = std::move(outbox_.front().first);
      size_t bytes = outbox_.front().second;
      size_t taken = 1;
      // A batch entry costs its bytes, a tag and a length of up to 5 bytes.
      while (batchBytes_ > 0 && taken < outbox_.size() &&
             bytes + outbox_[taken].second + kEntryFraming <= batchBytes_) {
        bytes += outbox_[taken].second + kEntryFraming;
        *message.add_batch() = std::move(outbox_[taken].first);
        ++taken;
      }
      outbox_.erase(outbox_.begin(), outbox_.begin() + static_cast<std::ptrdiff_t>(taken));
      out.unlock();
      bool written;
      {
        std::lock_guard<std::mutex> w(writeMu_);
        written = stream_->write(message);
      }
      out.lock();
      if (!written) {
        ok = false;
        outEnded_ = true;
        outbox_.clear();
        break;
      }
    }
    writing_ = false;
    return ok;
  }

  // A quiet request is answered only when it failed: log it, and keep the first such failure
  // for the next operation to return.
  void noteQuietFailureLocked(const pb::StoreResponse& response) {
    if (response.code() == 0) return;
    absl::Status status = responseStatus(response);
    logger()->error("the store refused a set: {}", std::string(status.message()));
    if (deferred_.ok()) {
      deferred_ = absl::Status(
          status.code(), fmt::format("an earlier set failed: {}", std::string(status.message())));
    }
  }

  void dispatchLocked(pb::StoreResponse&& response) {
    // Answers batched with this one come after it, in the server's order.
    auto more = std::move(*response.mutable_batch());
    response.clear_batch();
    dispatchOneLocked(std::move(response));
    for (auto& r : more) dispatchOneLocked(std::move(r));
  }

  void dispatchOneLocked(pb::StoreResponse&& response) {
    uint64_t seq = response.id() & ~kQuietBit;
    // Answered (a call), or refused (a quiet failure): the server has dealt with everything
    // this session sent before it.
    while (!unacked_.empty() && unacked_.front().seq <= seq) {
      unackedBytes_ -= std::min(unackedBytes_, unacked_.front().bytes);
      unacked_.pop_front();
    }
    if (response.id() & kQuietBit) {
      noteQuietFailureLocked(response);
      return;
    }
    auto it = pending_.find(response.id());
    if (it == pending_.end()) return;  // its caller gave up
    it->second = std::move(response);
  }

  void breakLocked(const grpc::Status& status) {
    broken_ = true;
    if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
      brokenStatus_ = absl::UnauthenticatedError(status.error_message());
    } else {
      brokenStatus_ = absl::UnavailableError(fmt::format(
          "connection to the store lost: {} (code {})", status.error_message(),
          static_cast<int>(status.error_code())));
    }
    for (auto& [id, slot] : pending_) {
      if (!slot.has_value()) slot = brokenStatus_;
    }
  }

  std::unique_ptr<SessionStream> stream_;
  std::mutex writeMu_;  // one stream write (or writesDone, finish) at a time
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<uint64_t, std::optional<absl::StatusOr<pb::StoreResponse>>> pending_;
  bool readerActive_ = false;
  bool broken_ = false;
  absl::Status brokenStatus_;
  absl::Status deferred_;
  uint64_t nextId_ = 1;  // under outMu_ (replay: alone on the session)
  // A quiet request kept until an answer proves it applied, with its size (counted once).
  struct Kept {
    uint64_t seq;
    pb::StoreRequest request;
    size_t bytes;
  };
  std::deque<Kept> unacked_;
  size_t unackedBytes_ = 0;
  std::string peer_;
  // The outbox. Lock order: outMu_, then mu_ (send); never mu_, then outMu_.
  std::mutex outMu_;
  std::deque<std::pair<pb::StoreRequest, size_t>> outbox_;  // request, its size
  size_t batchBytes_ = 0;  // 0: one request per message (a server that does not batch)
  bool writing_ = false;   // a caller is writing the outbox
  bool outEnded_ = false;  // a write failed: the stream takes no more
};


}  // namespace store_session
}  // namespace muster::rendezvous
