// Creates the component loggers: stderr, one line per event, level from MUSTER_LOG_LEVEL.
#include "common/log.h"

#include <grpc/support/log.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <mutex>

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

void routeGrpcLogs() {
  static std::once_flag once;
  std::call_once(once, [] {
    static auto grpcLogger = get("grpc");
    gpr_set_log_function([](gpr_log_func_args* args) {
      grpcLogger->debug("{}:{} {}", args->file, args->line, args->message);
    });
  });
}

}  // namespace muster::log
