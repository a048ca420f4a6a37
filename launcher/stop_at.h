// launch --stop_at: a time at which launch asks the job to stop by itself (the coordinated
// stop, agent_stop.cc), as a notice would: a given time, or a Slurm job's end time less a margin
// for the checkpoint (Debian's Slurm 22.05 sets no variable with the end time: squeue has it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace muster::launcher {

struct StopAt {
  std::optional<int64_t> unixS;  // a time given: Unix seconds
  bool slurm = false;            // the Slurm job's end time (squeue %e) ...
  int64_t marginS = 300;         // ... less this many seconds
};

// "1795000000" (Unix seconds), "2026-11-28T06:00:00" (local time, as Slurm prints it; a
// trailing "Z": UTC), "slurm" or "slurm-SECONDS" (the margin; default 300). Errors name
// --stop_at and what it takes.
absl::StatusOr<StopAt> parseStopAt(const std::string& value);

// A time as squeue and scontrol print it ("2026-11-28T06:00:00", local time) in Unix seconds;
// nullopt for the words Slurm prints for no time ("Unknown", "N/A", "NONE", "INVALID").
absl::StatusOr<std::optional<int64_t>> parseSlurmTime(const std::string& text);

// The job's end time: `squeue -h -j JOB -o %e` (nullopt: the job has no time limit).
absl::StatusOr<std::optional<int64_t>> slurmEndTime(const std::string& jobId);

// Unix seconds as local time, "2026-11-28T06:00:00" (as --stop_at and Slurm write it).
std::string localTimeText(int64_t unixS);

// When launch asks the job to stop, in Unix seconds: the time given, or the Slurm job's end
// less the margin (`jobId` empty outside Slurm: an error); nullopt for a job without an end.
absl::StatusOr<std::optional<int64_t>> stopTime(const StopAt& at, const std::string& jobId);

}  // namespace muster::launcher
