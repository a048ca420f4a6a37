// The one logging entry point: a named spdlog logger per component, level from MUSTER_LOG_LEVEL.
#pragma once

#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace muster::log {

// Returns the logger named `component`, creating it on first use. Loggers write one line per
// event to stderr. Thread-safe.
std::shared_ptr<spdlog::logger> get(const std::string& component);

// Sets every logger's level: "trace", "debug", "info", "warn", "error", "off".
// Returns false (and changes nothing) for an unknown name.
bool setLevel(const std::string& level);

// Lets at most one event a second through, for lines a stray client or a failing resource could
// otherwise repeat without end. Thread-safe.
class OncePerSecond {
 public:
  // True for the first event of each second; the others are counted.
  bool pass();
  // How many events were held back since the last one that passed (and starts counting anew).
  uint64_t takeHeldBack() { return heldBack_.exchange(0); }
  // The same, as the end of the line that passed: " (N more like it in the last second)", or
  // "" when none was held back.
  std::string heldBackNote();

 private:
  std::atomic<int64_t> lastMs_{INT64_MIN / 2};
  std::atomic<uint64_t> heldBack_{0};
};

// Sends gRPC's own log lines to the "grpc" logger at debug level: muster reports what matters
// itself, in one line. The exception is a resource error (out of descriptors or memory, a failed
// accept): a warning, at most one a second (with how many there were since). Call before the
// first gRPC object is made; later calls do nothing.
void routeGrpcLogs();

}  // namespace muster::log
