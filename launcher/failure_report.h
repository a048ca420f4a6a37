// What launch says about failed workers: each failure as torchrun's error file and stderr
// show it, and the end-of-job report (the root cause first, then torchrun's summary).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "launcher/torchrun_version.h"
#include "launcher/worker_group.h"

namespace muster::launcher {

struct Failure {
  int globalRank = -1, localRank = -1;
  pid_t pid = -1;
  WorkerExit exit;
  std::string errorFile;     // "" when the worker wrote none
  std::string errorMessage;  // what the error file says (readErrorFile)
  std::string traceback;     // what torchrun's summary shows of it (summaryTraceback)
  std::vector<std::string> lastLines;  // the last lines of its stderr
  // What launch knows beyond the exit: "its file timer 'load' expired", "the kernel's OOM
  // killer killed it (...)"; "" for nothing.
  std::string cause;
  std::chrono::system_clock::time_point when;
};

// "exited with code 3", "was killed by SIGSEGV".
std::string describeExit(const WorkerExit& exit);

// True for an exit launch's own stop explains: SIGTERM, SIGKILL, or exit code 128+SIGTERM.
bool endedByStop(const WorkerExit& exit);

// torchrun's error file: {"message": "..."} or {"message": {"message": ..., "extraInfo":
// {"py_callstack": ..., "timestamp": ...}}}. Returns what best explains the failure: the
// Python stack when there is one; "" for no file; a line saying so for a file that is not
// torchrun's JSON.
std::string readErrorFile(const std::string& path);

// The "traceback" torchrun's summary shows for an error file: the Python stack (else the
// message) of the structured form, each line after the first indented by two spaces, or the
// plain form's message as it is; "" for no file, a line saying so for a file that is not
// torchrun's JSON.
std::string summaryTraceback(const std::string& path);

// torchrun's hand-over to whoever started it: with TORCHELASTIC_ERROR_FILE set for the launcher,
// the root cause's error file is copied there (the JSON as it is, with "errorCode": the exit
// code, negative for a signal, added to a structured message), replacing what was there. A
// root cause without an error file leaves `dest` alone, as under torchrun. Errors: the file
// that could not be read or written, one line.
absl::Status handOverErrorFile(const Failure& rootCause, const std::string& dest);

// A worker that has exited, as a Failure (reads its error file).
Failure describeFailure(const WorkerState& worker);

// The report printed when the job fails: "launch: root cause: rank R (local_rank L, pid P)
// ...", its error file and stderr's last lines, then torchrun's "<program> FAILED" summary
// with the other failures and the root cause on `host` (getfqdn, as torchrun), as `version`'s
// torchrun words it (from 2.14 the signal's name follows the pid).
std::string failureReport(const std::string& program, const std::optional<Failure>& rootCause,
                          const std::vector<Failure>& others, const std::string& host,
                          const TorchrunVersion& version = {});

}  // namespace muster::launcher
