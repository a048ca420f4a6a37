// A rank's side of launch's coordinated stop: ask once per step whether to stop. When the job
// is told to stop (a scheduler's notice to any node's launch), every rank of every node is told
// so at the same step, and told to go on at every step before it (common/stop_board.h says how).
//
//   for (int64_t step = start; ; ++step) {
//     if (muster::worker::stopRequested(step)) { saveCheckpoint(step); return 0; }
//     trainOneStep();
//   }
//
// The rank saves what it needs and exits 0; launch reports "stopped at step S" and exits with
// its stop code (docs/launching.md, "Stopping a job cleanly").
#pragma once

#include <cstdint>
#include <optional>

namespace muster::worker {

// True from the job's stop step on, false before it. `step` counts the rank's steps from 0 and
// grows (the same step on every rank means the same point of the job). Costs a comparison for
// most steps and a lock of a local file for at most one step a millisecond; a rank waits (in
// steps of a millisecond) only where launch is choosing the stop step at this step. Without
// launch (no MUSTER_STOP_FILE), always false. Thread-safe. Throws std::runtime_error where the
// board launch named cannot be read (one line: the file and why), or for a negative step.
bool stopRequested(int64_t step);

// Where a job that stopped cleanly starts again (a Slurm requeue, the same --rdzv_id again):
// the step its ranks stopped at (MUSTER_RESUMED_FROM_STEP, from launch's stop record), or
// nullopt on a fresh start. Throws std::runtime_error for a value that is not a step.
std::optional<int64_t> resumedFromStep();

}  // namespace muster::worker
