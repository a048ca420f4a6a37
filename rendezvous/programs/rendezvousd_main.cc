// rendezvousd: the store (and later the rendezvous service) as a standalone daemon.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <pthread.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <string>

#include "common/build_info.h"
#include "common/files.h"
#include "common/limits.h"
#include "common/log.h"
#include "common/net.h"
#include "rendezvous/server/metrics_endpoint.h"
#include "rendezvous/server/server_metrics.h"
#include "rendezvous/server/rendezvous_server.h"

using muster::rendezvous::ServerOptions;
using muster::rendezvous::RendezvousServer;

int main(int argc, char** argv) {
  ServerOptions options;
  options.standalone = true;
  std::string tokenFile, tlsCert, tlsKey, logLevel;
  CLI::App app{"rendezvousd: muster's store and rendezvous service"};
  app.set_version_flag("--version", muster::build::versionText("rendezvousd"));
  app.add_option("--host", options.host, "address to bind (0.0.0.0, 127.0.0.1, ::)")
      ->capture_default_str();
  app.add_option("--port", options.port, "port to bind; 0 picks a free one and logs it")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  app.add_option("--token-file", tokenFile, "file holding a shared token clients must send")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-cert", tlsCert, "PEM certificate chain for TLS")->check(CLI::ExistingFile);
  app.add_option("--tls-key", tlsKey, "PEM private key for TLS")->check(CLI::ExistingFile);
  app.add_option("--max-key-bytes", options.limits.maxKeyBytes, "longest key accepted")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-value-bytes", options.limits.maxValueBytes, "largest value accepted")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-keys-per-call", options.limits.maxKeysPerCall,
                 "most keys in one wait/check/multi_get/multi_set")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-total-bytes", options.limits.maxTotalBytes,
                 "most bytes of keys and values held")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-waiters", options.limits.maxWaiters,
                 "most operations blocked on keys at once")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-inflight-bytes", options.maxInflightBytes,
                 "most memory gRPC holds for calls in flight; past it calls are refused "
                 "(default: twice the largest request, at least 1 GiB)")
      ->check(CLI::PositiveNumber);
  // Per job (a namespace's run id): one job cannot use up the store for the others.
  options.limits.maxJobBytes = options.limits.maxTotalBytes / 2;
  options.limits.maxJobKeys = 1'000'000;
  options.limits.maxJobWaiters = 100'000;
  app.add_option("--max-job-bytes", options.limits.maxJobBytes,
                 "most bytes of keys and values one job (run id) holds")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-job-keys", options.limits.maxJobKeys, "most keys one job holds")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-job-waiters", options.limits.maxJobWaiters,
                 "most of one job's operations blocked on keys at once")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  double finishedRunTtlS = options.retention.ttl.count() / 1000.0;
  app.add_option("--finished-run-ttl", finishedRunTtlS,
                 "seconds a finished (or abandoned) run is remembered: late joins are told it "
                 "finished; then its id may start a new run")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-finished-runs", options.retention.maxRuns,
                 "most finished or abandoned runs remembered; the oldest are forgotten first")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-connections", options.connections.maxConnections,
                 "most connections open on --port at once; past it the oldest that never made a "
                 "call with the token is closed, or the newcomer refused (0: as many as the "
                 "descriptor limit leaves room for)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-connections-per-peer", options.connections.maxPerPeer,
                 "most connections one address may hold on --port (0: no cap but "
                 "--max-connections)")
      ->check(CLI::NonNegativeNumber);
  int metricsPort = -1;
  std::string metricsHost;
  app.add_option("--metrics-port", metricsPort,
                 "serve Prometheus metrics at http://HOST:PORT/metrics (0 picks a free port and "
                 "logs it); no token guards them, and nothing secret is in them")
      ->check(CLI::Range(0, 65535));
  app.add_option("--metrics-host", metricsHost, "address for the metrics (default: --host)");
  app.add_option("--direct-port", options.directPort,
                 "also serve the store's sessions on this plain TCP port (muster's clients move "
                 "there when they can reach it: several times the operations per second of gRPC); "
                 "0 picks a free port, -1 (default) none; not with TLS")
      ->capture_default_str()
      ->check(CLI::Range(-1, 65535));
  app.add_option("--log-level", logLevel, "trace, debug, info, warn, error (or MUSTER_LOG_LEVEL)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "rendezvousd: %s (see --help)\n", e.what());
    return 2;
  }
  auto usage = [](const std::string& message) {
    std::fprintf(stderr, "rendezvousd: %s\n", message.c_str());
    return 2;
  };
  if (!logLevel.empty() && !muster::log::setLevel(logLevel)) {
    return usage(fmt::format("--log-level={} is invalid; expected trace, debug, info, warn, "
                             "error or off",
                             logLevel));
  }
  if (tlsCert.empty() != tlsKey.empty()) return usage("--tls-cert and --tls-key go together");
  if (!tlsCert.empty() && options.directPort >= 0) {
    return usage("--direct-port serves plaintext; it cannot go with --tls-cert");
  }
  options.retention.ttl = muster::Millis(static_cast<int64_t>(finishedRunTtlS * 1000));
  if (!tokenFile.empty()) {
    auto token = muster::readToken(tokenFile);
    if (!token.ok()) return usage(std::string(token.status().message()));
    options.token = *token;
  }
  if (!tlsCert.empty()) {
    auto cert = muster::readFile(tlsCert, "TLS certificate");
    auto key = muster::readFile(tlsKey, "TLS key");
    if (!cert.ok()) return usage(std::string(cert.status().message()));
    if (!key.ok()) return usage(std::string(key.status().message()));
    options.tlsCertPem = *cert;
    options.tlsKeyPem = *key;
  }

  // Signals are taken synchronously by this thread; every other thread (gRPC's) inherits the
  // blocked mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto logger = muster::log::get("rendezvousd");
  muster::raiseDescriptorLimit();
  logger->debug("descriptors: up to {}", muster::descriptorLimit());

  auto server = RendezvousServer::start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "rendezvousd: %s\n", std::string(server.status().message()).c_str());
    return server.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::unique_ptr<muster::rendezvous::MetricsEndpoint> metrics;
  if (metricsPort >= 0) {
    muster::rendezvous::RendezvousServer* served = server->get();
    if (metricsHost.empty()) metricsHost = options.host;
    auto endpoint = muster::rendezvous::MetricsEndpoint::start(
        metricsHost, metricsPort,
        [served] { return muster::rendezvous::renderMetrics(*served); });
    if (!endpoint.ok()) {
      std::fprintf(stderr, "rendezvousd: %s\n", std::string(endpoint.status().message()).c_str());
      return endpoint.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
    }
    metrics = std::move(*endpoint);
    logger->info("metrics on http://{}/metrics",
                 muster::net::joinHostPort(metricsHost, metrics->port()));
  }
  // Out of descriptors the service goes on (ConnectionGate refuses what it cannot hold): it
  // ends on a signal only.
  int received = 0;
  sigwait(&signals, &received);
  metrics.reset();
  logger->info("received {}; shutting down", received == SIGINT ? "SIGINT" : "SIGTERM");
  (*server)->shutdown();
  (*server)->wait();
  return 0;
}
