// The contract between launch and the programs it starts, C++ (the worker library) and Python
// (through the TCPStore front): muster's environment variables, where a round's keys and files
// live, and how the two kinds of client name keys. Both sides include this header; nothing
// else may spell these names and layouts. (torchrun's own variables, RANK and the rest, are
// PyTorch's contract and keep PyTorch's names.)
#pragma once

#include <unistd.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace muster::contract {

// muster's variables in every worker's environment.
inline constexpr const char* kStoreAddr = "MUSTER_STORE_ADDR";            // host:port of the gRPC store
inline constexpr const char* kStoreNamespace = "MUSTER_STORE_NAMESPACE";  // roundNamespace() below
inline constexpr const char* kStoreTokenFile = "MUSTER_STORE_TOKEN_FILE"; // the store's token, if any
// The store speaks TLS (a rendezvousd with a certificate): the CA's PEM file, and the name to
// check in its certificate when it is not the address's host.
inline constexpr const char* kStoreTlsCa = "MUSTER_STORE_TLS_CA";
inline constexpr const char* kStoreTlsServerName = "MUSTER_STORE_TLS_SERVER_NAME";
inline constexpr const char* kSharedDir = "MUSTER_SHARED_DIR";            // the channel's directory
inline constexpr const char* kRunDir = "MUSTER_RUN_DIR";                  // this node's logs of the job
inline constexpr const char* kJobId = "MUSTER_JOB_ID";                    // the job's name in kSharedDir
// The rendezvous round (not TORCHELASTIC_RESTART_COUNT: an elastic join starts a new round
// without a restart, and a node that joins later has counted fewer restarts).
inline constexpr const char* kRound = "MUSTER_ROUND";

// Stacks on demand (the roll-call): launch sends the signal kStacksSignal names to a rank's
// process; its handler (the Python start-up hook's faulthandler, or the worker library's
// native handler) appends the stacks of all its threads to the file kStacksFile names. The
// handler writes kStacksReady and its pid as the file's first line once it is installed, so
// that launch signals only a process that asked for it; the native handler ends each dump
// with kStacksEnd (faulthandler writes no end: launch waits for the file to rest).
inline constexpr const char* kStacksFile = "MUSTER_STACKS_FILE";
inline constexpr const char* kStacksSignal = "MUSTER_STACKS_SIGNAL";
inline constexpr std::string_view kStacksReady = "muster-stacks pid=";
inline constexpr std::string_view kStacksEnd = "muster-stacks end\n";
// Progress: a FIFO launch reads (the file timer's, TORCHELASTIC_TIMER_FILE's protocol): the
// worker library writes a heartbeat there, a release of scope kHeartbeatScope, which
// torchrun's FileTimerServer ignores and launch counts as progress (--hang_timeout).
inline constexpr const char* kProgressFifo = "MUSTER_PROGRESS_FIFO";
inline constexpr std::string_view kHeartbeatScope = "muster.heartbeat";
// The coordinated stop (stop_requested): the node's stop board, which launch makes per round
// and every rank reads and writes under flock (layout and rule: common/stop_board.h).
inline constexpr const char* kStopFile = "MUSTER_STOP_FILE";
// The rank's slot on the board: its local rank (LOCAL_RANK is 0 for every rank under
// --virtual_local_rank).
inline constexpr const char* kStopSlot = "MUSTER_STOP_SLOT";
// A job that stopped cleanly and starts again (a Slurm requeue, the same --rdzv_id again): the
// step its ranks stopped at, kept in launch's stop record (launcher/stop_record.h); absent on a
// fresh start. Python: muster.resumed_from_step(); C++: muster::worker::resumedFromStep().
inline constexpr const char* kResumedFromStep = "MUSTER_RESUMED_FROM_STEP";
// launch's control socket, for `rendezvousctl stacks --pid PID`: a local stream socket in the
// abstract namespace (the leading NUL), served to launch's own user and root. The client sends
// one line, "stacks", and reads the report to the end.
// The name holds the pid namespace too: containers that share a network namespace (a pod)
// can hold launches of the same pid.
inline std::string launchControlSocket(long launchPid) {
  char ns[64] = {0};
  ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
  std::string space = n > 0 ? std::string(ns, static_cast<size_t>(n)) : std::string("pid");
  return std::string(1, '\0') + "muster-launch-" + space + "-" + std::to_string(launchPid);
}

// The store namespace of one round of a job: "<run id>/<round>". A new round gets a fresh
// namespace, so no attempt sees its predecessor's keys; launch deletes the old one.
inline std::string roundNamespace(std::string_view runId, uint64_t round) {
  return std::string(runId) + "/" + std::to_string(round);
}

// A round's channel files: "<shared dir>/<job id>/<round>". launch removes it when the round
// is over (and the job's folder after a successful job).
inline std::string roundDirectory(std::string_view sharedDir, std::string_view jobId, uint64_t round) {
  return std::string(sharedDir) + "/" + std::string(jobId) + "/" + std::to_string(round);
}

// PyTorch's TCPStore client puts "/" before every key, and torch 1.13's
// init_process_group("env://") with TORCHELASTIC_USE_AGENT_STORE=True adds the prefix
// "/worker/attempt_<TORCHELASTIC_RESTART_COUNT>" before that: c10d key K goes on the wire as
// "//worker/attempt_<N>/K" (1.13) or "/K" (2.x). The store keeps it as "/K" in the round's
// namespace: the attempt prefix is dropped, since the namespace already names the round, and
// every node of a round agrees on it even where their restart counts differ. Keys without
// the leading "/" (TCPStore's own "init/" counter) are kept as they are.
inline constexpr std::string_view kAttemptPrefix = "//worker/attempt_";

inline std::string storeKeyFromTcpStore(std::string_view wire) {
  if (wire.substr(0, kAttemptPrefix.size()) == kAttemptPrefix) {
    size_t digits = kAttemptPrefix.size();
    while (digits < wire.size() && wire[digits] >= '0' && wire[digits] <= '9') ++digits;
    if (digits > kAttemptPrefix.size() && digits < wire.size() && wire[digits] == '/') {
      return std::string(wire.substr(digits));
    }
  }
  return std::string(wire);
}

// The store key of c10d key K used by a C++ rank (C10dStore): "/K", the key a TCPStore client
// of the same round stores, so that C++ and Python ranks of one job share keys.
inline std::string storeKeyFromC10d(std::string_view key) { return "/" + std::string(key); }

}  // namespace muster::contract
