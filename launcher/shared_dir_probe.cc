// probeSharedDir: a nonce through the store, the same nonce through the file system.
#include "launcher/shared_dir_probe.h"

#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "launcher/job_layout.h"
#include "rendezvous/client/store_client.h"

namespace muster::launcher {
namespace fs = std::filesystem;

namespace {

// Runs `op(deadline)` in slices of a quarter second until it succeeds, fails otherwise than by
// its deadline, the whole deadline passes, or `cancelled` is set.
template <typename Op>
auto sliced(Op op, Deadline deadline, const std::atomic<bool>& cancelled) -> decltype(op(deadline)) {
  while (true) {
    if (cancelled) return absl::CancelledError("launch is stopping");
    Deadline slice = std::min(deadline, Clock::now() + Millis(250));
    auto result = op(slice);
    if (result.ok() || result.status().code() != absl::StatusCode::kDeadlineExceeded || slice == deadline) {
      return result;
    }
  }
}

// Status has no .status(): give it one, for sliced().
struct StatusResult {
  StatusResult(absl::Status status) : s(std::move(status)) {}  // NOLINT: implicit on purpose
  absl::Status s;
  bool ok() const { return s.ok(); }
  const absl::Status& status() const { return s; }
};

}  // namespace

absl::Status probeSharedDir(const SharedDirProbe& probe, const std::atomic<bool>& cancelled) {
  Deadline deadline = deadlineAfter(probe.timeout);
  rendezvous::ClientOptions options{.target = probe.endpoint,
                                    .ns = probe.storeNamespace,
                                    .token = probe.token,
                                    .tlsCaPem = probe.tlsCaPem,
                                    .tlsServerName = probe.tlsServerName};
  auto store = sliced([&](Deadline d) { return rendezvous::StoreClient::connect(options, d); }, deadline, cancelled);
  if (!store.ok()) return store.status();
  auto& s = **store;
  if (probe.groupRank == 0) {
    std::string nonce = randomHex(8);
    std::error_code ec;
    fs::create_directories(fs::path(probe.file).parent_path(), ec);
    std::ofstream(probe.file) << nonce;
    if (auto set = s.set("nonce", nonce); !set.ok()) return set;
  }
  auto nonce = sliced([&](Deadline d) { return s.get("nonce", d); }, deadline, cancelled);
  if (!nonce.ok()) return nonce.status();
  std::ifstream in(probe.file);
  std::string seen((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (auto set = s.set(fmt::format("node/{}", probe.groupRank), seen == *nonce ? "ok" : probe.nodeHost); !set.ok()) {
    return set;
  }
  std::vector<std::string> keys;
  for (int n = 0; n < probe.groupWorldSize; ++n) keys.push_back(fmt::format("node/{}", n));
  auto waited = sliced([&](Deadline d) { return StatusResult{s.wait(keys, d)}; }, deadline, cancelled);
  if (!waited.ok()) return waited.status();
  auto answers = s.multiGet(keys, deadline);
  if (!answers.ok()) return answers.status();
  std::string blind;
  for (int n = 0; n < probe.groupWorldSize; ++n) {
    if ((*answers)[n] != "ok") blind += fmt::format("{}node {} ({})", blind.empty() ? "" : ", ", n, (*answers)[n]);
  }
  if (s.add("done", 1).value_or(0) == probe.groupWorldSize) {
    std::error_code ec;
    fs::remove(probe.file, ec);
  }
  if (!blind.empty()) {
    return absl::FailedPreconditionError(fmt::format(
        "--shared_dir={} is not shared: {} cannot see {} written by node 0; give every node a path on "
        "one shared filesystem (NFS)",
        probe.sharedDir, blind, probe.file));
  }
  return absl::OkStatus();
}

}  // namespace muster::launcher
