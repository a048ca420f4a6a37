// parseConf, checkConf, clientOptions: the etcd client's options from a program's flags.
#include "etcd/options.h"

#include <cstdlib>

#include <fmt/format.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "common/files.h"

namespace muster::etcd {

namespace {

// torchrun's etcd-v2 backend names the TLS files otherwise than its etcd backend: either works.
constexpr std::pair<const char*, const char*> kAliases[] = {
    {"ca_cert", "cacert"}, {"ssl_cert", "cert"}, {"ssl_cert_key", "key"}};

// `conf` with the etcd-v2 names read as the etcd ones; one given twice, differently, is an error.
absl::StatusOr<Conf> canonical(const Conf& conf, std::string_view flag) {
  Conf out = conf;
  for (const auto& [alias, key] : kAliases) {
    auto a = out.find(alias);
    if (a == out.end()) continue;
    if (out.count(key) && out.at(key) != a->second) {
      return absl::InvalidArgumentError(
          fmt::format("{} {}= and {}= name the same file differently; give one", flag, alias, key));
    }
    out[key] = a->second;
    out.erase(alias);
  }
  return out;
}

std::string get(const Conf& conf, const char* key) { return conf.count(key) ? conf.at(key) : std::string(); }

}  // namespace

absl::StatusOr<Conf> parseConf(const std::string& text, std::string_view flag) {
  Conf conf;
  absl::string_view all = absl::StripAsciiWhitespace(text);
  if (all.empty()) return conf;
  for (absl::string_view part : absl::StrSplit(all, ',')) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(part, absl::MaxSplits('=', 1));
    absl::string_view key = absl::StripAsciiWhitespace(kv.first), value = absl::StripAsciiWhitespace(kv.second);
    if (key.empty()) {
      return absl::InvalidArgumentError(
          fmt::format("{}={} is invalid; expected KEY=VALUE pairs separated by commas", flag, text));
    }
    if (value.empty()) {
      return absl::InvalidArgumentError(fmt::format("{}={} is invalid: '{}' has no value", flag, text, std::string(key)));
    }
    conf[std::string(key)] = std::string(value);
  }
  return conf;
}

absl::Status checkConf(const Conf& given, bool httpsEndpoints, std::string_view flag) {
  auto named = canonical(given, flag);
  if (!named.ok()) return named.status();
  const Conf& conf = *named;
  if (conf.count("etcd_prefix")) {
    const auto& p = conf.at("etcd_prefix");
    if (p.size() < 2 || p.front() != '/' || p.find("//") != std::string::npos) {
      return absl::InvalidArgumentError(
          fmt::format("{} etcd_prefix={} is invalid; expected a key path such as /jobs/team-a", flag, p));
    }
  }
  std::string protocol = conf.count("protocol") ? conf.at("protocol") : (httpsEndpoints ? "https" : "http");
  if (protocol != "http" && protocol != "https") {
    return absl::InvalidArgumentError(fmt::format("{} protocol={} is invalid; expected http or https", flag, protocol));
  }
  for (const char* tlsKey : {"cacert", "cert", "key"}) {
    if (protocol == "http" && conf.count(tlsKey)) {
      return absl::InvalidArgumentError(
          fmt::format("{} {}= is for TLS to etcd; add protocol=https (or give https:// endpoints)", flag, tlsKey));
    }
  }
  if (conf.count("cert") != conf.count("key")) {
    return absl::InvalidArgumentError(
        fmt::format("{} cert= and key= go together (this client's TLS certificate and its key)", flag));
  }
  if (conf.count("password_file") && !conf.count("user")) {
    return absl::InvalidArgumentError(fmt::format("{} password_file= needs user= (etcd's user name)", flag));
  }
  return absl::OkStatus();
}

absl::StatusOr<Options> clientOptions(const std::string& endpoints, const Conf& given, std::string_view flag) {
  Options out;
  bool https = false;
  auto parsed = parseEndpoints(endpoints, &https);
  if (!parsed.ok()) return parsed.status();
  out.endpoints = *parsed;
  if (auto s = checkConf(given, https, flag); !s.ok()) return s;
  const Conf conf = *canonical(given, flag);
  if (conf.count("etcd_prefix")) {
    out.runsPrefix = conf.at("etcd_prefix");
    while (out.runsPrefix.size() > 1 && out.runsPrefix.back() == '/') out.runsPrefix.pop_back();
  }
  out.tls = get(conf, "protocol") == "https" || (get(conf, "protocol").empty() && https);
  auto read = [&](const char* key, std::string& into) -> absl::Status {
    if (get(conf, key).empty()) return absl::OkStatus();
    auto text = readFile(get(conf, key), key);
    if (!text.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("{} {}={}: {}", flag, key, get(conf, key), std::string(text.status().message())));
    }
    into = *text;
    return absl::OkStatus();
  };
  if (auto s = read("cacert", out.caPem); !s.ok()) return s;
  if (auto s = read("cert", out.certPem); !s.ok()) return s;
  if (auto s = read("key", out.keyPem); !s.ok()) return s;
  out.user = get(conf, "user");
  if (auto s = read("password_file", out.password); !s.ok()) return s;
  while (!out.password.empty() && (out.password.back() == '\n' || out.password.back() == '\r')) out.password.pop_back();
  if (!out.user.empty() && get(conf, "password_file").empty()) {
    if (const char* p = std::getenv("MUSTER_ETCD_PASSWORD")) out.password = p;
  }
  return out;
}

}  // namespace muster::etcd
