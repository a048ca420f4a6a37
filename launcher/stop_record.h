// What a clean stop leaves for the job's next start (a Slurm requeue, a resubmission with the
// same --rdzv_id): the step its ranks stopped at, in a small JSON file that launch writes after
// the stop and reads when it starts, giving the ranks MUSTER_RESUMED_FROM_STEP. Where it is:
// --stop_record FILE, else "<shared dir>/.muster-stopped-<run id>.json" when a shared directory
// was given (--shared_dir, or Slurm's default for several nodes), which outlives the allocation;
// else none. A job that succeeds removes it: the next job of that id starts afresh.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace muster::launcher {

struct StopRecord {
  std::string runId;
  int64_t step = 0;    // every rank stopped here
  std::string reason;  // "SIGUSR1", "rendezvousctl stop", "--stop_at"
  int64_t unixMs = 0;  // when
};

// The record's file for a run: `given` (--stop_record) if not empty, else in `sharedDir` if
// not empty (the run id's bytes outside [A-Za-z0-9._-] as %XX), else "".
std::string stopRecordPath(const std::string& given, const std::string& sharedDir, const std::string& runId);

// One JSON object: {"run_id", "step", "reason", "unix_ms"}.
std::string formatStopRecord(const StopRecord& record);
// DATA_LOSS, one line naming what is wrong: not JSON, a field missing or of another type, a
// negative step.
absl::StatusOr<StopRecord> parseStopRecord(std::string_view text);

// Written whole (a temporary file of this process, renamed over it).
absl::Status writeStopRecord(const std::string& path, const StopRecord& record);
// NOT_FOUND: no file; DATA_LOSS: one launch does not write (with the path).
absl::StatusOr<StopRecord> readStopRecord(const std::string& path);

}  // namespace muster::launcher
