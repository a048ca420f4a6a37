// The key-value store every muster component talks to: c10d::Store's operations, bound to one
// namespace, with deadlines and absl::Status errors.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/deadline.h"
#include "muster/v1/store.pb.h"

namespace muster::rendezvous {

namespace pb = ::muster::v1;

// Session metadata a client sends to take answers batched (StoreResponse.batch): value "1".
inline constexpr char kBatchMetadataKey[] = "x-muster-batch";

// Errors: INVALID_ARGUMENT (a limit, a non-integer value for add), DEADLINE_EXCEEDED (a
// blocking call's keys did not come in time; the message names the missing keys),
// RESOURCE_EXHAUSTED (the store is full), UNAVAILABLE (the store is gone or shutting down),
// UNAUTHENTICATED (a wrong or missing token).
// Thread-safety: every implementation may be used from many threads at once.
class Store {
 public:
  virtual ~Store() = default;

  // The namespace (run id / round) this view works in.
  virtual const std::string& ns() const = 0;

  // Over a connection, set and multiSet do not wait for the server (as c10d's TCPStore does
  // not): the value is visible to this client's later operations at once and to others as
  // soon as it arrives. A set the server refuses (a limit) fails the next operation of this
  // connection with the server's message, and is logged.
  absl::Status set(std::string_view key, std::string_view value);
  // Blocks until `key` exists or `deadline` passes.
  absl::StatusOr<std::string> get(std::string_view key, Deadline deadline);
  // Adds `delta` to the integer at `key` (missing counts as 0; the stored text read as
  // std::stoll reads it, as c10d's servers do); returns the new value.
  absl::StatusOr<int64_t> add(std::string_view key, int64_t delta);
  // c10d's compare_set: returns the value stored afterwards (see store.proto for the
  // missing-key case).
  absl::StatusOr<std::string> compareSet(std::string_view key, std::string_view expected,
                                         std::string_view desired);
  absl::StatusOr<bool> check(const std::vector<std::string>& keys);
  // Blocks until every key exists or `deadline` passes.
  absl::Status wait(const std::vector<std::string>& keys, Deadline deadline);
  // True if the key existed.
  absl::StatusOr<bool> deleteKey(std::string_view key);
  absl::StatusOr<int64_t> numKeys();
  // Blocks until every key exists; the values in the keys' order.
  absl::StatusOr<std::vector<std::string>> multiGet(const std::vector<std::string>& keys,
                                                    Deadline deadline);
  absl::Status multiSet(const std::vector<std::string>& keys,
                        const std::vector<std::string>& values);
  // Appends to the value at `key` (creating it); returns the new length.
  absl::StatusOr<int64_t> append(std::string_view key, std::string_view value);
  // Deletes every key of this namespace; returns how many there were.
  absl::StatusOr<int64_t> clear();
  // The server's limits and version.
  absl::StatusOr<pb::ServerInfo> info();
  // Waits until the server has every set this view's connection posted, and returns the first
  // it refused (a limit, a quota), or OK. A store that applies sets at once has nothing to
  // wait for.
  virtual absl::Status flush(Deadline deadline);

 protected:
  // Runs one request (its ns is already set) and returns the server's response, whose code is
  // OK; a non-OK code comes back as the error status. `deadline` bounds the whole exchange.
  virtual absl::StatusOr<pb::StoreResponse> execute(pb::StoreRequest& request,
                                                    Deadline deadline) = 0;
  // Sends a request whose answer nobody waits for (set, multi_set). By default: execute.
  virtual absl::Status post(pb::StoreRequest& request);
  // Whether running the request twice has the effect of running it once: only such requests
  // are retried over a broken connection.
  static bool idempotent(const pb::StoreRequest& request);
  // The deadline for operations that do not block on keys.
  static Deadline quickDeadline();
};

// Turns a response's code and message into a Status.
absl::Status responseStatus(const pb::StoreResponse& response);

}  // namespace muster::rendezvous
