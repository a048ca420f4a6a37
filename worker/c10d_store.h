// muster's store as a c10d::Store, so that LibTorch code that takes a store (ProcessGroupGloo,
// PrefixStore, user code) runs on it unchanged.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>

#include "rendezvous/store/store.h"

namespace muster::worker {

// Semantics are c10d's (TCPStore 1.13's where c10d leaves them open). Errors are thrown as
// c10::Error, as TCPStore throws them: a get or wait past the store's timeout ("... timed out
// after N ms waiting for ..."), or the store gone. Thread-safety: as the wrapped Store (safe).
class C10dStore : public c10d::Store {
 public:
  explicit C10dStore(std::shared_ptr<rendezvous::Store> store,
                     std::chrono::milliseconds timeout = kDefaultTimeout);

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  // A second handle on the same store (LibTorch 2.x's Store::clone, which c10d calls to give a
  // thread a store of its own; declared without `override` so that 1.x, which has none, builds).
  c10::intrusive_ptr<c10d::Store> clone();  // NOLINT(modernize-use-override)

  rendezvous::Store& store() { return *store_; }

 private:
  std::shared_ptr<rendezvous::Store> store_;
};

}  // namespace muster::worker
