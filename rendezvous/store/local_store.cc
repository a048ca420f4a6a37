// LocalStore: a blocking call parks on the MemoryStore and this thread waits for its answer.
#include "rendezvous/store/local_store.h"

#include <future>

namespace muster::rendezvous {

LocalStore::LocalStore(std::shared_ptr<MemoryStore> memory, std::string ns)
    : memory_(std::move(memory)), ns_(std::move(ns)) {}

absl::StatusOr<pb::StoreResponse> LocalStore::execute(pb::StoreRequest& request,
                                                      Deadline deadline) {
  (void)deadline;  // the MemoryStore enforces the request's timeout itself
  request.set_ns(ns_);
  auto promise = std::make_shared<std::promise<pb::StoreResponse>>();
  auto answer = promise->get_future();
  memory_->execute(request, [promise](pb::StoreResponse&& r) { promise->set_value(std::move(r)); });
  pb::StoreResponse response = answer.get();
  absl::Status status = responseStatus(response);
  if (!status.ok()) return status;
  return response;
}

}  // namespace muster::rendezvous
