// The one logging entry point: a named spdlog logger per component, level from MUSTER_LOG_LEVEL.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>
#include <string>

namespace muster::log {

// Returns the logger named `component`, creating it on first use. Loggers write one line per
// event to stderr. Thread-safe.
std::shared_ptr<spdlog::logger> get(const std::string& component);

// Sets every logger's level: "trace", "debug", "info", "warn", "error", "off".
// Returns false (and changes nothing) for an unknown name.
bool setLevel(const std::string& level);

// Sends gRPC's own log lines to the "grpc" logger at debug level: muster reports what matters
// itself, in one line. Call before the first gRPC object is made; later calls do nothing.
void routeGrpcLogs();

}  // namespace muster::log
