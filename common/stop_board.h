// The stop board: how launch and its ranks agree on one step at which every rank stops
// (launch's coordinated stop, stop_requested(step)). One small file per node and round, which
// launch makes and names in MUSTER_STOP_FILE; every rank of the node (C++ through the worker
// library, Python through `muster`, which reads the same layout) and launch read and write it
// under flock(2), so that each change is whole.
//
// What it holds: the horizon H (every step below it has been answered "go on" to some rank),
// whether it is frozen, and the stop step S once launch has posted it; and per local rank, the
// last step it asked about (-1: it never asked, an unmodified script).
//
// The rule that gives every rank the same answer for every step, under any delay:
//   - a rank asking about step s: S posted -> s >= S. Else, s < H -> go on. Else, not frozen ->
//     H becomes s + ahead, go on. Else (frozen, s >= H) -> wait for S.
//   - launch, on a notice: freezes the board and reads H; no rank is told "go on" at H or
//     later from then on. Across nodes S is the largest H of all the nodes; on one node, H.
//     S >= every H, so no rank was told "go on" at S, and every rank reaching S is told stop.
// "ahead" is the rank's: steps it may run past a stop's earliest step (a fast loop asks to run a
// millisecond's worth of steps per lock, a slow one one step).
//
// The layout (little-endian int64 words): 0 the magic "MSTOPBD1", 1 the number of slots, 2
// frozen (0 or 1), 3 the horizon, 4 the stop step (-1: none), 5 the reason (what launch got:
// a signal number, or kReason* below), 6-7 reserved, then one word per local rank.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace muster::stopboard {

inline constexpr char kMagic[8] = {'M', 'S', 'T', 'O', 'P', 'B', 'D', '1'};
inline constexpr int kHeaderWords = 8;
inline constexpr int kMaxSlots = 4096;
inline constexpr int64_t kNone = -1;
// Reasons that are not signals (a signal's number is its own reason).
inline constexpr int64_t kReasonRequest = 1000;   // rendezvousctl stop
inline constexpr int64_t kReasonDeadline = 1001;  // --stop_at

// Across nodes (launcher/stop_agreement.h) the request goes through the job's store, in the
// running round's namespace "<run>/<round>/stop", as key kRequestKey holding the reason in
// decimal; launch's nodes and `rendezvousctl stop` both write it.
inline std::string storeNamespace(const std::string& runId, uint64_t round) {
  return runId + "/" + std::to_string(round) + "/stop";
}
inline constexpr const char* kRequestKey = "request";

struct Board {
  bool frozen = false;
  int64_t horizon = 0;
  int64_t stopStep = kNone;
  int64_t reason = 0;
  std::vector<int64_t> asked;  // per local rank: the last step it asked about, kNone: never
};

// Launch's side. Every call opens, locks and closes the file: errors name it.
// Makes the board for `slots` local ranks (replacing any file there), mode 0600.
absl::Status create(const std::string& path, int slots);
absl::StatusOr<Board> read(const std::string& path);
// Freezes the board (no rank goes on at the horizon or past it from now on) and returns it as
// frozen; freezing a frozen board changes nothing.
absl::StatusOr<Board> freeze(const std::string& path);
// Posts the stop step (at least the horizon the freeze returned) and why; a board with a stop
// step keeps the first.
absl::StatusOr<Board> post(const std::string& path, int64_t stopStep, int64_t reason);

// A rank's side: the answer to "stop at `step`?". kWait: the board is frozen at or below this
// step and no stop step is posted yet; ask again (a millisecond later).
enum class Answer { kGoOn, kStop, kWait };
struct Asked {
  Answer answer = Answer::kGoOn;
  int64_t horizon = 0;  // steps below it go on without asking again (while no stop is posted)
  int64_t stopStep = kNone;
};
// `fd` open for reading and writing; `slot` the rank's local rank; `ahead` >= 1.
absl::StatusOr<Asked> ask(int fd, int slot, int64_t step, int64_t ahead);

}  // namespace muster::stopboard
