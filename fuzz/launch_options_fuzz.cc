// launch's command line and environment (PET_*, SLURM_*, MUSTER_*, TORCH_*), as
// parseLaunchOptions reads them, and the parsers under it fed directly (--rdzv_conf,
// comma lists, Slurm host lists, host:port, --torchrun_version, CUDA_VISIBLE_DEVICES on a
// host of 0-8 GPUs with or without their UUIDs). Bad input is one
// INVALID_ARGUMENT line (NOT_FOUND carries --help's text); nothing throws; options that parse
// are consistent.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "common/log.h"
#include "common/net.h"
#include "launcher/devices.h"
#include "launcher/visible_gpus.h"
#include "launcher/option_values.h"
#include "launcher/options.h"
#include "launcher/slurm.h"
#include "launcher/torchrun_version.h"

using namespace muster::launcher;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  muster::log::setLevel("off");
  return 0;
}

namespace {
const char* const kVariables[] = {
    "PET_NNODES", "PET_NPROC_PER_NODE", "PET_RDZV_BACKEND", "PET_RDZV_ENDPOINT", "PET_RDZV_CONF", "PET_RDZV_ID",
    "PET_REDIRECTS", "PET_TEE", "PET_LOCAL_RANKS_FILTER", "PET_NODE_RANK", "PET_SIGNALS_TO_HANDLE",
    "PET_MAX_RESTARTS", "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_LOG_DIR", "PET_STANDALONE", "PET_HANG_TIMEOUT",
    "PET_DUPLICATE_STDOUT_FILTERS", "MUSTER_TORCHRUN_VERSION", "MUSTER_LEGACY_LAUNCH", "MUSTER_STACKS",
    "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "SLURM_JOB_ID", "SLURM_STEP_ID",
    "SLURM_NNODES", "SLURM_NODEID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
    "SLURM_SUBMIT_DIR", "CUDA_VISIBLE_DEVICES"};

bool expected(const absl::Status& s) {
  return s.code() == absl::StatusCode::kInvalidArgument || s.code() == absl::StatusCode::kNotFound;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider p(data, size);
  switch (p.ConsumeIntegralInRange(0, 6)) {
    case 0: {
      // gpu and auto count this host's /dev/nvidiaN (none on a fuzzing machine): the same
      // answer each run.
      std::map<std::string, std::string> env{{"CUDA_VISIBLE_DEVICES", "0,1"}};
      for (int k = p.ConsumeIntegralInRange(0, 8); k > 0; --k) {
        env[kVariables[p.ConsumeIntegralInRange<size_t>(0, std::size(kVariables) - 1)]] =
            p.ConsumeRandomLengthString(64);
      }
      std::vector<std::string> args;
      while (p.remaining_bytes() > 0 && args.size() < 24) args.push_back(p.ConsumeRandomLengthString(64));
      auto o = parseLaunchOptions(args, env);
      if (!o.ok() && !expected(o.status())) __builtin_trap();
      if (o.ok() && !o->showVersion &&
          (o->minNodes < 1 || o->minNodes > o->maxNodes || o->localWorldSize < 1)) {
        __builtin_trap();
      }
      break;
    }
    case 1: {
      LaunchOptions::RdzvConf conf;
      auto s = flags::parseRdzvConf(p.ConsumeRemainingBytesAsString(), conf);
      if (!s.ok() && !expected(s)) __builtin_trap();
      if (s.ok() && (conf.joinTimeout.count() < 0 || conf.lastCall.count() < 0 || conf.keepAliveInterval.count() < 0)) {
        __builtin_trap();
      }
      break;
    }
    case 2:
      (void)commaSeparatedList(p.ConsumeRemainingBytesAsString());
      break;
    case 3: {
      auto host = firstSlurmHost(p.ConsumeRemainingBytesAsString());
      if (!host.ok() && !expected(host.status())) __builtin_trap();
      if (host.ok() && host->empty()) __builtin_trap();
      break;
    }
    case 4:
      (void)muster::net::splitHostPort(p.ConsumeRemainingBytesAsString());
      break;
    case 6: {
      // Counts within what the list names and the host has; fewer than listed says why, in
      // one line; gpu and auto give workers or one line.
      NvidiaHost host;
      host.devices = p.ConsumeIntegralInRange(0, 8);
      host.nvml = p.ConsumeBool() ? NvmlState::kRead : NvmlState::kUnreadable;
      for (int i = 0; host.nvml == NvmlState::kRead && i < host.devices; ++i) {
        host.uuids.gpus.push_back("GPU-a" + std::to_string(i));  // GPU-a is every one's prefix
        host.uuids.migs.push_back("MIG-b" + std::to_string(i));
      }
      bool nvmlCheck = p.ConsumeBool();
      std::string value = p.ConsumeRemainingBytesAsString();
      auto v = visibleGpus(value, host);
      int listed = static_cast<int>(std::count(value.begin(), value.end(), ',')) + 1;
      if (v.needsNvml || v.cuda < -1 || v.torch < -1) __builtin_trap();
      if (v.cuda > std::min(listed, host.devices) || v.torch > std::min(listed, host.devices)) __builtin_trap();
      if ((v.cuda < listed || v.torch < listed) && v.why.empty()) __builtin_trap();
      if (v.why.find('\n') != std::string::npos) __builtin_trap();
      std::map<std::string, std::string> env{{"CUDA_VISIBLE_DEVICES", value}};
      if (nvmlCheck) env["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1";
      for (const char* nproc : {"gpu", "auto"}) {
        auto n = resolveNproc(nproc, env, host);
        if (!n.ok() && (!expected(n.status()) || n.status().message().find('\n') != absl::string_view::npos)) {
          __builtin_trap();
        }
        if (n.ok() && *n < 1) __builtin_trap();
      }
      break;
    }
    default: {
      auto v = TorchrunVersion::parse(p.ConsumeRemainingBytesAsString());
      if (!v.ok() && !expected(v.status())) __builtin_trap();
      if (v.ok()) (void)TorchrunVersion::parse(v->str());
      break;
    }
  }
  return 0;
}
