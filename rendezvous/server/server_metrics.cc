// renderMetrics: store, rendezvous, calls and process, one family at a time.
#include "rendezvous/server/server_metrics.h"

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/limits.h"
#include "rendezvous/membership/rendezvous_service.h"
#include "rendezvous/server/heap_figures.h"
#include "rendezvous/server/rendezvous_server.h"
#include "rendezvous/store/store_sessions.h"

namespace muster::rendezvous {
namespace {

// One metric family after another: # HELP, # TYPE, then its samples.
class Exposition {
 public:
  Exposition& family(const char* name, const char* type, const char* help) {
    name_ = name;
    text_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
    return *this;
  }
  Exposition& sample(uint64_t value) {
    text_ += fmt::format("{} {}\n", name_, value);
    return *this;
  }
  Exposition& sample(const char* label, const std::string& labelValue, uint64_t value) {
    text_ += fmt::format("{}{{{}=\"{}\"}} {}\n", name_, label, labelValue, value);
    return *this;
  }
  std::string take() { return std::move(text_); }

 private:
  std::string name_;
  std::string text_;
};

struct Process {
  uint64_t residentBytes = 0, openFds = 0, sockets = 0;
  HeapFigures heap;
};

Process process() {
  Process p;
  std::ifstream statm("/proc/self/statm");
  uint64_t pages = 0, resident = 0;
  if (statm >> pages >> resident) p.residentBytes = resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  p.heap = heapFigures();
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    ++p.openFds;
    auto target = std::filesystem::read_symlink(entry.path(), ec);
    if (!ec && target.native().rfind("socket:", 0) == 0) ++p.sockets;
  }
  return p;
}

}  // namespace

std::string renderMetrics(RendezvousServer& server) {
  auto store = server.memory()->stats();
  auto rdzv = server.rendezvous().state().stats();
  auto proc = process();
  Exposition e;

  e.family("muster_store_keys", "gauge", "Keys held (a non-empty queue counts as one).").sample(store.keys);
  e.family("muster_store_bytes", "gauge", "Bytes of keys and values held.").sample(store.bytes);
  e.family("muster_store_namespaces", "gauge", "Namespaces holding keys or parked operations.")
      .sample(store.namespaces);
  e.family("muster_store_jobs", "gauge", "Jobs (run ids) holding keys or parked operations.").sample(store.jobs);
  e.family("muster_store_waiters", "gauge", "Operations parked until their keys arrive.").sample(store.waiters);
  e.family("muster_store_operations_total", "counter", "Store requests run, by operation.");
  const auto* op = pb::StoreRequest::descriptor()->FindOneofByName("op");
  for (int i = 0; i < op->field_count(); ++i) {
    auto it = store.operations.find(op->field(i)->number());
    e.sample("op", op->field(i)->name(), it == store.operations.end() ? 0 : it->second);
  }
  e.family("muster_store_sessions", "gauge", "Open Session streams (a client each).")
      .sample(server.sessions().openSessions());
  e.family("muster_calls_in_flight", "gauge", "Admitted one-request calls not yet answered (parked gets, "
           "joins waiting for their round, watches).")
      .sample(static_cast<uint64_t>(std::max<int64_t>(0, server.callsInFlight())));
  e.family("muster_rejected_calls_total", "counter",
           "Calls and requests refused: without the token, over a size or count limit, over the "
           "store's capacity, over a job's quota.")
      .sample("reason", "token", server.rejectedCalls())
      .sample("reason", "limit", store.refused[static_cast<int>(MemoryStore::Refusal::kLimit)])
      .sample("reason", "capacity", store.refused[static_cast<int>(MemoryStore::Refusal::kCapacity)])
      .sample("reason", "job_quota", store.refused[static_cast<int>(MemoryStore::Refusal::kJobQuota)]);

  e.family("muster_rendezvous_runs", "gauge",
           "Runs known: active (gathering, running, or idle until forgotten) and finished "
           "(remembered until their time-to-live).")
      .sample("state", "active", rdzv.runsActive)
      .sample("state", "finished", rdzv.runsFinished);
  e.family("muster_rendezvous_runs_forgotten_total", "counter", "Runs forgotten after their time-to-live.")
      .sample(rdzv.runsForgotten);
  e.family("muster_rendezvous_rounds_running", "gauge", "Rounds running.").sample(rdzv.roundsRunning);
  e.family("muster_rendezvous_rounds_started_total", "counter", "Rounds started.").sample(rdzv.roundsStarted);
  e.family("muster_rendezvous_rounds_ended_total", "counter", "Rounds ended, by what ended them.")
      .sample("cause", "job_succeeded", rdzv.roundsEnded[pb::RoundEvent::JOB_SUCCEEDED])
      .sample("cause", "node_failed", rdzv.roundsEnded[pb::RoundEvent::NODE_FAILED])
      .sample("cause", "node_lost", rdzv.roundsEnded[pb::RoundEvent::NODE_LOST])
      .sample("cause", "node_waiting", rdzv.roundsEnded[pb::RoundEvent::NODE_WAITING]);
  e.family("muster_rendezvous_joins_total", "counter", "Join requests.").sample(rdzv.joins);
  e.family("muster_rendezvous_pending_joins", "gauge", "Joins waiting for their round.").sample(rdzv.pendingJoins);
  e.family("muster_rendezvous_watchers", "gauge", "Agents watching their round.").sample(rdzv.watchers);
  e.family("muster_rendezvous_nodes_lost_total", "counter",
           "Nodes lost, by cause: no heartbeat within keep-alive, or the agent's stream dropped.")
      .sample("cause", "silent", rdzv.nodesLostSilent)
      .sample("cause", "agent_gone", rdzv.nodesLostAgentGone);

  ConnectionCounts connections = server.connections();
  e.family("muster_connections_open", "gauge", "Connections on the gRPC port.").sample(connections.open);
  e.family("muster_connections_closed_total", "counter",
           "Connections on the gRPC port closed by the service: refused at accept (a cap, or no "
           "descriptor left), or evicted to make room (never made a call with the token).")
      .sample("why", "refused", connections.refused)
      .sample("why", "evicted", connections.evicted);
  e.family("muster_open_sockets", "gauge", "Sockets held: the listeners and every connection.").sample(proc.sockets);
  e.family("process_open_fds", "gauge", "Open file descriptors.").sample(proc.openFds);
  e.family("process_max_fds", "gauge", "The descriptor limit (soft RLIMIT_NOFILE).").sample(descriptorLimit());
  e.family("process_resident_memory_bytes", "gauge", "Resident memory in bytes.").sample(proc.residentBytes);
  e.family("muster_heap_bytes", "gauge",
           "Bytes the daemon's allocations hold now (malloc's in-use bytes, free memory it keeps excluded).")
      .sample(proc.heap.now);
  if (proc.heap.peak) {
    e.family("muster_heap_peak_bytes", "gauge",
             "The most muster_heap_bytes has been since the daemon started (ASan and TSan builds only).")
        .sample(*proc.heap.peak);
  }
  return e.take();
}

}  // namespace muster::rendezvous
