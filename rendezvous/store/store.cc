// Store's operations, built once as requests for every implementation.
#include "rendezvous/store/store.h"

#include <fmt/format.h>

namespace muster::rendezvous {
namespace {

constexpr Millis kQuickTimeout{60'000};

// Wire timeout for a blocking operation: whole milliseconds left, at least 1.
uint64_t wireTimeout(Deadline deadline) {
  if (deadline == kNoDeadline) return 0;
  int64_t left = millisLeft(deadline);
  return left > 0 ? static_cast<uint64_t>(left) : 1;
}

}  // namespace

absl::Status responseStatus(const pb::StoreResponse& response) {
  if (response.code() == 0) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(response.code()), response.message());
}

Deadline Store::quickDeadline() { return deadlineAfter(kQuickTimeout); }

bool Store::idempotent(const pb::StoreRequest& request) {
  switch (request.op_case()) {
    case pb::StoreRequest::kSet:
    case pb::StoreRequest::kGet:
    case pb::StoreRequest::kCheck:
    case pb::StoreRequest::kWait:
    case pb::StoreRequest::kNumKeys:
    case pb::StoreRequest::kMultiGet:
    case pb::StoreRequest::kMultiSet:
      return true;
    default:
      return false;
  }
}

absl::Status Store::post(pb::StoreRequest& request) {
  return execute(request, quickDeadline()).status();
}

absl::Status Store::set(std::string_view key, std::string_view value) {
  pb::StoreRequest req;
  req.mutable_set()->set_key(std::string(key));
  req.mutable_set()->set_value(std::string(value));
  return post(req);
}

absl::StatusOr<std::string> Store::get(std::string_view key, Deadline deadline) {
  pb::StoreRequest req;
  req.mutable_get()->set_key(std::string(key));
  req.set_timeout_ms(wireTimeout(deadline));
  auto resp = execute(req, deadline);
  if (!resp.ok()) return resp.status();
  return std::move(*resp->mutable_value());
}

absl::StatusOr<int64_t> Store::add(std::string_view key, int64_t delta) {
  pb::StoreRequest req;
  req.mutable_add()->set_key(std::string(key));
  req.mutable_add()->set_delta(delta);
  auto resp = execute(req, quickDeadline());
  if (!resp.ok()) return resp.status();
  return resp->number();
}

absl::StatusOr<std::string> Store::compareSet(std::string_view key, std::string_view expected,
                                              std::string_view desired) {
  pb::StoreRequest req;
  auto* op = req.mutable_compare_set();
  op->set_key(std::string(key));
  op->set_expected(std::string(expected));
  op->set_desired(std::string(desired));
  auto resp = execute(req, quickDeadline());
  if (!resp.ok()) return resp.status();
  return std::move(*resp->mutable_value());
}

absl::StatusOr<bool> Store::check(const std::vector<std::string>& keys) {
  pb::StoreRequest req;
  for (const auto& key : keys) req.mutable_check()->add_keys(key);
  auto resp = execute(req, quickDeadline());
  if (!resp.ok()) return resp.status();
  return resp->flag();
}

absl::Status Store::wait(const std::vector<std::string>& keys, Deadline deadline) {
  pb::StoreRequest req;
  auto* op = req.mutable_wait();
  for (const auto& key : keys) op->add_keys(key);
  req.set_timeout_ms(wireTimeout(deadline));
  return execute(req, deadline).status();
}

absl::StatusOr<bool> Store::deleteKey(std::string_view key) {
  pb::StoreRequest req;
  req.mutable_delete_key()->set_key(std::string(key));
  auto resp = execute(req, quickDeadline());
  if (!resp.ok()) return resp.status();
  return resp->number() > 0;
}

absl::StatusOr<int64_t> Store::numKeys() {
  pb::StoreRequest req;
  req.mutable_num_keys();
  auto resp = execute(req, quickDeadline());
  if (!resp.ok()) return resp.status();
  return resp->number();
}

absl::StatusOr<std::vector<std::string>> Store::multiGet(const std::vector<std::string>& keys,
                                                         Deadline deadline) {
  pb::StoreRequest req;
  auto* op = req.mutable_multi_get();
  for (const auto& key : keys) op->add_keys(key);
  req.set_timeout_ms(wireTimeout(deadline));
  auto resp = execute(req, deadline);
  if (!resp.ok()) return resp.status();
  auto* values = resp->mutable_values()->mutable_values();
  if (static_cast<size_t>(values->size()) != keys.size()) {
    return absl::InternalError(fmt::format("multi_get asked for {} keys and got {} values",
                                           keys.size(), values->size()));
  }
  return std::vector<std::string>(std::make_move_iterator(values->begin()),
                                  std::make_move_iterator(values->end()));
}

absl::Status Store::multiSet(const std::vector<std::string>& keys,
                             const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    return absl::InvalidArgumentError(
        fmt::format("multiSet: {} keys but {} values", keys.size(), values.size()));
  }
  pb::StoreRequest req;
  auto* op = req.mutable_multi_set();
  for (size_t i = 0; i < keys.size(); ++i) {
    op->add_keys(keys[i]);
    op->add_values(values[i]);
  }
  return post(req);
}

absl::StatusOr<int64_t> Store::append(std::string_view key, std::string_view value) {
  pb::StoreRequest req;
  req.mutable_append()->set_key(std::string(key));
  req.mutable_append()->set_value(std::string(value));
  auto resp = execute(req, quickDeadline());
  if (!resp.ok()) return resp.status();
  return resp->number();
}

absl::StatusOr<int64_t> Store::clear() {
  pb::StoreRequest req;
  req.mutable_clear();
  auto resp = execute(req, quickDeadline());
  if (!resp.ok()) return resp.status();
  return resp->number();
}

}  // namespace muster::rendezvous

namespace muster::rendezvous {

absl::StatusOr<pb::ServerInfo> Store::info() {
  pb::StoreRequest req;
  req.mutable_info();
  auto resp = execute(req, quickDeadline());
  if (!resp.ok()) return resp.status();
  return std::move(*resp->mutable_info());
}

absl::Status Store::flush(Deadline deadline) {
  (void)deadline;
  return absl::OkStatus();
}

}  // namespace muster::rendezvous
