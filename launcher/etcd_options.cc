// etcdClientOptions: --rdzv_endpoint and --rdzv_conf, validated already, with files read.
#include "launcher/etcd_options.h"

#include <cstdlib>

#include <fmt/format.h>

#include "common/files.h"

namespace muster::launcher {

absl::StatusOr<etcd::Options> etcdClientOptions(const LaunchOptions& options) {
  etcd::Options out;
  bool https = false;
  auto endpoints = etcd::parseEndpoints(options.rdzvEndpoint, &https);
  if (!endpoints.ok()) return endpoints.status();
  out.endpoints = *endpoints;
  const auto& conf = options.rdzvConf.given;
  auto get = [&](const char* key) { return conf.count(key) ? conf.at(key) : std::string(); };
  out.tls = get("protocol") == "https" || (get("protocol").empty() && https);
  auto read = [&](const char* key, std::string& into) -> absl::Status {
    if (get(key).empty()) return absl::OkStatus();
    auto text = readFile(get(key), key);
    if (!text.ok()) {
      return absl::InvalidArgumentError(fmt::format("--rdzv_conf {}={}: {}", key, get(key), std::string(text.status().message())));
    }
    into = *text;
    return absl::OkStatus();
  };
  if (auto s = read("cacert", out.caPem); !s.ok()) return s;
  if (auto s = read("cert", out.certPem); !s.ok()) return s;
  if (auto s = read("key", out.keyPem); !s.ok()) return s;
  out.user = get("user");
  if (auto s = read("password_file", out.password); !s.ok()) return s;
  while (!out.password.empty() && (out.password.back() == '\n' || out.password.back() == '\r')) out.password.pop_back();
  if (!out.user.empty() && get("password_file").empty()) {
    // Kept out of the command line, where every user of the host can read it.
    if (const char* p = std::getenv("MUSTER_ETCD_PASSWORD")) out.password = p;
  }
  return out;
}

}  // namespace muster::launcher
