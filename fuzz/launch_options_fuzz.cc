// launch's command line and environment (PET_*, SLURM_*, MUSTER_*, TORCH_*), as
// parseLaunchOptions reads them, and the parsers under it fed directly (--rdzv_conf,
// comma lists, Slurm host lists, host:port, --torchrun_version). Bad input is one
// INVALID_ARGUMENT line (NOT_FOUND carries --help's text); nothing throws; options that parse
// are consistent.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "common/log.h"
#include "common/net.h"
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
  switch (p.ConsumeIntegralInRange(0, 5)) {
    case 0: {
      // CUDA_VISIBLE_DEVICES keeps the GPU count off /dev: the same answer on every machine.
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
    default: {
      auto v = TorchrunVersion::parse(p.ConsumeRemainingBytesAsString());
      if (!v.ok() && !expected(v.status())) __builtin_trap();
      if (v.ok()) (void)TorchrunVersion::parse(v->str());
      break;
    }
  }
  return 0;
}
