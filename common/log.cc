// Creates the component loggers: stderr, one line per event, level from MUSTER_LOG_LEVEL.
#include "common/log.h"

#include <grpc/support/log.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string_view>

namespace muster::log {
namespace {

std::mutex& registryMutex() {
  static std::mutex m;
  return m;
}

spdlog::level::level_enum& currentLevel() {
  static spdlog::level::level_enum level = [] {
    const char* env = std::getenv("MUSTER_LOG_LEVEL");
    if (env == nullptr) return spdlog::level::info;
    auto parsed = spdlog::level::from_str(env);
    // from_str maps unknown names to "off"; keep info unless "off" was really asked for.
    if (parsed == spdlog::level::off && std::string(env) != "off") return spdlog::level::info;
    return parsed;
  }();
  return level;
}

}  // namespace

std::shared_ptr<spdlog::logger> get(const std::string& component) {
  std::lock_guard<std::mutex> lock(registryMutex());
  if (auto existing = spdlog::get(component)) return existing;
  auto logger = spdlog::stderr_color_mt(component, spdlog::color_mode::never);
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%n] [%l] %v");
  logger->set_level(currentLevel());
  logger->flush_on(spdlog::level::info);
  return logger;
}

bool setLevel(const std::string& level) {
  auto parsed = spdlog::level::from_str(level);
  if (parsed == spdlog::level::off && level != "off") return false;
  std::lock_guard<std::mutex> lock(registryMutex());
  currentLevel() = parsed;
  spdlog::apply_all([parsed](std::shared_ptr<spdlog::logger> l) { l->set_level(parsed); });
  return true;
}

namespace {

bool isResourceError(std::string_view message) {
  for (std::string_view what : {"Too many open files", "Cannot allocate memory", "accept",
                                "No buffer space", "Resource temporarily unavailable"}) {
    if (message.find(what) != std::string_view::npos) return true;
  }
  return false;
}

}  // namespace

bool OncePerSecond::pass() {
  int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                    std::chrono::steady_clock::now().time_since_epoch())
                    .count();
  int64_t last = lastMs_.load();
  if (now - last >= 1000 && lastMs_.compare_exchange_strong(last, now)) return true;
  ++heldBack_;
  return false;
}

std::string OncePerSecond::heldBackNote() {
  uint64_t more = takeHeldBack();
  return more > 0 ? fmt::format(" ({} more like it in the last second)", more) : "";
}

void routeGrpcLogs() {
  static std::once_flag once;
  std::call_once(once, [] {
    static auto grpcLogger = get("grpc");
    gpr_set_log_function([](gpr_log_func_args* args) {
      std::string_view message = args->message;
      if (args->severity != GPR_LOG_SEVERITY_ERROR || !isResourceError(message)) {
        grpcLogger->debug("{}:{} {}", args->file, args->line, message);
        return;
      }
      // At most one warning a second, saying how many were folded into it.
      static OncePerSecond limit;
      if (limit.pass()) {
        grpcLogger->warn("{}{}", message, limit.heldBackNote());
      }
    });
  });
}

}  // namespace muster::log
