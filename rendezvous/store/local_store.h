// A Store that runs requests on a MemoryStore in this process: what the agent that hosts the
// store uses itself, and the reference the conformance suite checks the gRPC path against.
#pragma once

#include <memory>
#include <string>

#include "rendezvous/store/memory_store.h"
#include "rendezvous/store/store.h"

namespace muster::rendezvous {

// Thread-safe. Keeps `memory` alive for as long as it lives.
class LocalStore : public Store {
 public:
  LocalStore(std::shared_ptr<MemoryStore> memory, std::string ns);
  const std::string& ns() const override { return ns_; }

 protected:
  absl::StatusOr<pb::StoreResponse> execute(pb::StoreRequest& request,
                                            Deadline deadline) override;

 private:
  std::shared_ptr<MemoryStore> memory_;
  std::string ns_;
};

}  // namespace muster::rendezvous
