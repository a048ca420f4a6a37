// etcd::Watch: one stream at a time; each response moves the next revision on.
#include "etcd/watch.h"

#include <iterator>

#include <fmt/format.h>

#include "common/log.h"

namespace muster::etcd {

std::string prefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(end.back());
    if (last < 0xff) {
      ++last;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

Watch::Watch(Client& client, std::string prefix, int64_t revision, Millis giveUpAfter,
             std::function<void(Events, int64_t)> onEvents, std::function<void(const std::string&)> onError)
    : client_(client),
      prefix_(std::move(prefix)),
      next_(revision),
      giveUpAfter_(giveUpAfter),
      onEvents_(std::move(onEvents)),
      onError_(std::move(onError)) {
  thread_ = std::thread([this] { run(); });
}

Watch::~Watch() {
  {
    std::lock_guard lock(mu_);
    stopped_ = true;
    if (context_) context_->TryCancel();
  }
  thread_.join();
}

void Watch::run() {
  Deadline failingSince = kNoDeadline;  // no stream served since then
  std::string lastError;
  while (true) {
    auto call = client_.call(kNoDeadline, /*stream=*/true);
    {
      std::lock_guard lock(mu_);
      if (stopped_) return;
      context_ = call.context.get();
    }
    auto stream = client_.watchStub(call.member).Watch(call.context.get());
    pb::WatchRequest request;
    auto* create = request.mutable_create_request();
    create->set_key(prefix_);
    create->set_range_end(prefixEnd(prefix_));
    create->set_start_revision(next_);
    std::string cancelled;
    bool compacted = false;
    if (stream->Write(request)) {
      pb::WatchResponse response;
      while (stream->Read(&response)) {
        if (response.created()) failingSince = kNoDeadline;
        if (response.compact_revision() > 0) {
          compacted = true;
          break;
        }
        if (response.canceled()) {
          cancelled = response.cancel_reason().empty() ? "the member cancelled the watch" : response.cancel_reason();
          break;
        }
        if (response.events_size() == 0) continue;
        next_ = response.events(response.events_size() - 1).kv().mod_revision() + 1;
        Events events(std::make_move_iterator(response.mutable_events()->begin()),
                      std::make_move_iterator(response.mutable_events()->end()));
        onEvents_(std::move(events), response.header().revision());
      }
      call.context->TryCancel();
    }
    auto status = stream->Finish();
    {
      std::lock_guard lock(mu_);
      context_ = nullptr;
      if (stopped_) return;
    }
    if (compacted) {
      onError_(fmt::format("etcd at {}: the watch of '{}' needs revision {}, which was compacted away",
                           client_.endpointList(), prefix_, next_));
      return;
    }
    lastError = !cancelled.empty() ? cancelled : status.error_message();
    if (status.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
      onError_(fmt::format("etcd at {}: the watch of '{}' was refused: {}", client_.endpointList(), prefix_, lastError));
      return;
    }
    log::get("etcd")->debug("watch of '{}' at {} ended ({}); on to the next member", prefix_,
                            client_.endpointList(), lastError);
    // The member is down or has no leader: the next one (or a new auth token).
    client_.failed(call.member, status.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, lastError) : status);
    if (failingSince == kNoDeadline) failingSince = Clock::now();
    if (Clock::now() - failingSince >= giveUpAfter_) {
      onError_(fmt::format("etcd at {}: no member served the watch for {:.1f} s (last: {})", client_.endpointList(),
                           std::chrono::duration<double>(giveUpAfter_).count(), lastError));
      return;
    }
    std::unique_lock lock(mu_);
    if (stopped_) return;
    lock.unlock();
    std::this_thread::sleep_for(Millis(100));
  }
}

}  // namespace muster::etcd
