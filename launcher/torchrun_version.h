// Which torchrun launch follows where torchrun's releases differ (--torchrun_version). launch
// cannot know the workers' torch before they start, so it follows one release: by default the
// newest it is tested against, 2.14. What changes with the version, each a fact of the release
// named (the tests in tests/compat run 1.13, 2.6 and 2.14 side by side with launch):
//   - NCCL's async error handling: NCCL_ASYNC_ERROR_HANDLING=1 before 2.2, then
//     TORCH_NCCL_ASYNC_ERROR_HANDLING=1 (2.2 renamed it; the old name warns in every rank).
//   - From 2.14: the one-node default (no --master_port, --rdzv_endpoint or --standalone) is
//     the c10d rendezvous on a free port, as --standalone (pytorch#175699); before, static on
//     127.0.0.1:29500.
//   - From 2.11 (the GPU machine's torch, tests/gpu/device_check.sh; not in 2.6):
//     TORCHELASTIC_SIGNALS_TO_HANDLE carries --signals_to_handle (pytorch#160690).
//   - From 2.14: the failure summary's exitcode line names the signal after the pid
//     ("-15 (pid: 7)  (SIGTERM)"; before, "-15 (pid: 7)"), and a worker that exits with a code
//     and no error file is a "system_terminated_error" in its event's raw_error.
// A release between the tested ones (1.13, 2.6, 2.11, 2.14) is followed as the tested one below
// it (2.10 as 2.6), but for the NCCL name, whose release is known.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace muster::launcher {

struct TorchrunVersion {
  int major = 2;
  int minor = 14;

  // "2.6", "2.6.0" or torch.__version__ as printed ("2.6.0+cu124", "1.13.0a0"); 1.9 (the first
  // torchrun) or later. Errors: INVALID_ARGUMENT naming the flag.
  static absl::StatusOr<TorchrunVersion> parse(const std::string& text);
  std::string str() const;
  bool atLeast(int maj, int min) const { return major > maj || (major == maj && minor >= min); }

  // The variable that turns on NCCL's async error handling in this torch.
  const char* ncclAsyncErrorHandlingVariable() const {
    return atLeast(2, 2) ? "TORCH_NCCL_ASYNC_ERROR_HANDLING" : "NCCL_ASYNC_ERROR_HANDLING";
  }
  bool oneNodeDefaultIsStandalone() const { return atLeast(2, 14); }
  bool exportsSignalsToHandle() const { return atLeast(2, 11); }
  bool namesSignalInSummary() const { return atLeast(2, 14); }
  bool marksSystemTerminatedErrors() const { return atLeast(2, 14); }
};

}  // namespace muster::launcher
