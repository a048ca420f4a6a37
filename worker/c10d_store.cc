// C10dStore: c10d::Store's calls on a muster Store; Status errors become c10::Error.
#include "worker/c10d_store.h"

#include <c10/util/Exception.h>

#include "common/contract.h"

namespace muster::worker {
namespace {

std::string text(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }
std::vector<uint8_t> bytes(const std::string& text) { return std::vector<uint8_t>(text.begin(), text.end()); }

template <typename T>
T orThrow(absl::StatusOr<T> result) {
  TORCH_CHECK(result.ok(), "muster store: ", std::string(result.status().ToString()));
  return std::move(*result);
}

void orThrow(const absl::Status& status) {
  TORCH_CHECK(status.ok(), "muster store: ", std::string(status.ToString()));
}

// Keys as a TCPStore client of the same round stores them, so that C++ and Python ranks of one
// job share keys (common/contract.h).
std::string key(const std::string& k) { return contract::storeKeyFromC10d(k); }
std::vector<std::string> keys(const std::vector<std::string>& ks) {
  std::vector<std::string> out;
  out.reserve(ks.size());
  for (const auto& k : ks) out.push_back(key(k));
  return out;
}

Deadline after(std::chrono::milliseconds timeout) {
  // c10d's kNoTimeout (0) waits for ever.
  return timeout.count() == 0 ? kNoDeadline : deadlineAfter(timeout);
}

}  // namespace

C10dStore::C10dStore(std::shared_ptr<rendezvous::Store> store, std::chrono::milliseconds timeout)
    : c10d::Store(timeout), store_(std::move(store)) {}

c10::intrusive_ptr<c10d::Store> C10dStore::clone() {
  return c10::make_intrusive<C10dStore>(store_, timeout_);
}

void C10dStore::set(const std::string& k, const std::vector<uint8_t>& value) {
  orThrow(store_->set(key(k), text(value)));
}

std::vector<uint8_t> C10dStore::compareSet(const std::string& k,
                                           const std::vector<uint8_t>& expected,
                                           const std::vector<uint8_t>& desired) {
  return bytes(orThrow(store_->compareSet(key(k), text(expected), text(desired))));
}

std::vector<uint8_t> C10dStore::get(const std::string& k) {
  return bytes(orThrow(store_->get(key(k), after(timeout_))));
}

int64_t C10dStore::add(const std::string& k, int64_t value) {
  return orThrow(store_->add(key(k), value));
}

bool C10dStore::deleteKey(const std::string& k) { return orThrow(store_->deleteKey(key(k))); }

bool C10dStore::check(const std::vector<std::string>& ks) { return orThrow(store_->check(keys(ks))); }

int64_t C10dStore::getNumKeys() { return orThrow(store_->numKeys()); }

void C10dStore::wait(const std::vector<std::string>& ks) { wait(ks, timeout_); }

void C10dStore::wait(const std::vector<std::string>& ks,
                     const std::chrono::milliseconds& timeout) {
  orThrow(store_->wait(keys(ks), after(timeout)));
}

}  // namespace muster::worker
