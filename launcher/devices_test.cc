// --nproc_per_node=gpu and auto under CUDA_VISIBLE_DEVICES: the workers torchrun starts, read off
// an H100 machine (one GPU) with torch 2.11 by tests/gpu/visible_devices.py on 2026-11-27, for
// every value it tried; and the same rules on hosts of several GPUs and without NVML.
#include "launcher/devices.h"

#include <gtest/gtest.h>

#include <optional>

namespace muster::launcher {
namespace {

using Env = std::map<std::string, std::string>;
constexpr int kRefused = -1;
constexpr int kCpus = -2;
const std::string kUuid = "GPU-657d167b-2bab-e90d-6677-93681a2e6b85";

NvidiaHost host(int devices, std::vector<std::string> gpus, std::vector<std::string> migs = {}) {
  NvidiaHost h;
  h.devices = devices;
  h.uuids = GpuUuids{std::move(gpus), std::move(migs)};
  return h;
}

// Workers for --nproc_per_node=`nproc`: a count, or kRefused.
int workers(const std::string& nproc, const std::optional<std::string>& visible, const NvidiaHost& h) {
  Env env;
  if (visible) env["CUDA_VISIBLE_DEVICES"] = *visible;
  auto n = resolveNproc(nproc, env, h);
  if (!n.ok()) {
    EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(n.status().message()).find('\n'), std::string::npos);
    return kRefused;
  }
  return *n;
}

// A row's expectation as a count: kCpus is this host's CPUs.
int expected(int workers) { return workers == kCpus ? countCpus() : workers; }

struct Row {
  std::optional<std::string> visible;
  int gpu;
  int autoWorkers;
};

TEST(Devices, EachCudaVisibleDevicesGivesTheWorkersTorchrunStartsOnOneGpu) {
  const NvidiaHost h100 = host(1, {kUuid});
  const std::vector<Row> rows = {
      {std::nullopt, 1, 1}, {"", kRefused, kCpus}, {"0", 1, 1}, {"1", kRefused, kCpus},
      {"2", kRefused, kCpus}, {"0,1,2", 1, 1}, {"1,0", kRefused, kCpus}, {"0,0", kRefused, kCpus},
      {"0,1,0", kRefused, kRefused}, {" 0", 1, 1}, {"0 ", 1, 1}, {" 0 ,1", 1, 1}, {"+0", 1, 1},
      {"00", 1, 1}, {"0gpu", 1, 1}, {"0gpu,1", 1, 1}, {"gpu0", kRefused, kCpus},
      {"-1", kRefused, kCpus}, {"0,-1,1", 1, 1}, {"-0", 1, 1}, {"0,,1", 1, 1},
      {",0", kRefused, kCpus}, {"0,abc", 1, 1}, {"abc", kRefused, kCpus},
      {"4294967296", kRefused, kRefused}, {"99999999999999999999", kRefused, kCpus},
      {kUuid, 1, 1}, {kUuid + ",0", 1, 1}, {"0," + kUuid, 1, 1}, {kUuid + "," + kUuid, kRefused, kCpus},
      {kUuid.substr(0, 12), 1, 1}, {kUuid.substr(4), kRefused, kCpus}, {"gpu" + kUuid.substr(3), kRefused, kCpus},
      {kUuid + ",GPU-deadbeef", 1, 1}, {"GPU-deadbeef", kRefused, kCpus},
      {"GPU-deadbeef," + kUuid, kRefused, kCpus}, {"MIG-deadbeef", kRefused, kCpus},
      {"0,MIG-deadbeef", 1, 1}, {kUuid + ",1", 1, 1},
  };
  for (const Row& r : rows) {
    std::string name = r.visible ? "CUDA_VISIBLE_DEVICES=\"" + *r.visible + "\"" : "unset";
    EXPECT_EQ(workers("gpu", r.visible, h100), expected(r.gpu)) << name;
    EXPECT_EQ(workers("auto", r.visible, h100), expected(r.autoWorkers)) << name;
  }
}

TEST(Devices, SeveralGpusMigInstancesAndAHostWithoutNvml) {
  const NvidiaHost eight = host(8, {"GPU-aa11", "GPU-aa22", "GPU-bb33", "GPU-cc44", "GPU-dd55", "GPU-ee66",
                                    "GPU-ff77", "GPU-0088"},
                                {"MIG-1111", "MIG-2222"});
  EXPECT_EQ(workers("gpu", std::nullopt, eight), 8);
  EXPECT_EQ(workers("gpu", "7,3,5", eight), 3);
  EXPECT_EQ(workers("gpu", "7,3,8,1", eight), 2);
  EXPECT_EQ(workers("gpu", "GPU-bb,GPU-cc", eight), 2);
  EXPECT_EQ(workers("gpu", "GPU-aa,GPU-bb", eight), kRefused);  // GPU-aa is two GPUs' prefix
  EXPECT_EQ(workers("gpu", "GPU-bb,GPU-aa", eight), 1);
  EXPECT_EQ(workers("gpu", "GPU-bb,GPU-bb33", eight), kRefused);  // one GPU twice
  EXPECT_EQ(workers("gpu", "MIG-2222,MIG-1", eight), 2);
  EXPECT_EQ(workers("gpu", "MIG-2222,MIG-9", eight), 1);
  // NVML could not be read: UUIDs are taken while the host has devices for them.
  NvidiaHost blind;
  blind.devices = 2;
  EXPECT_EQ(workers("gpu", "GPU-x,GPU-y,GPU-z", blind), 2);
  EXPECT_EQ(workers("gpu", "GPU-x,GPU-x", blind), kRefused);
  EXPECT_EQ(workers("gpu", "MIG-x", blind), 1);
  // No GPU at all: CUDA_VISIBLE_DEVICES lists what is not there.
  NvidiaHost none;
  EXPECT_EQ(workers("gpu", "0,1", none), kRefused);
  EXPECT_EQ(workers("auto", "0,1,2", none), countCpus());
  EXPECT_EQ(workers("gpu", std::nullopt, none), kRefused);
}

TEST(Devices, ARefusalSaysWhatHidTheDevices) {
  const NvidiaHost one = host(1, {kUuid});
  auto message = [&](const std::string& nproc, const std::string& visible) {
    auto n = resolveNproc(nproc, {{"CUDA_VISIBLE_DEVICES", visible}}, one);
    return n.ok() ? std::string("ok") : std::string(n.status().message());
  };
  EXPECT_EQ(message("gpu", "1,0"),
            "--nproc_per_node=gpu: CUDA shows no GPU here (CUDA_VISIBLE_DEVICES=1,0: its entry \"1\" names no "
            "device of this host's 1 GPU); use a number or cpu");
  EXPECT_EQ(message("gpu", "0,0"),
            "--nproc_per_node=gpu: CUDA shows no GPU here (CUDA_VISIBLE_DEVICES=0,0: it names one device "
            "twice (\"0\")); use a number or cpu");
  EXPECT_EQ(message("auto", "0,1,0"),
            "--nproc_per_node=auto: CUDA shows a GPU but torch counts none (CUDA_VISIBLE_DEVICES=0,1,0: it "
            "names device 0 twice), as torchrun refuses it; correct CUDA_VISIBLE_DEVICES or use a number");
  EXPECT_EQ(message("gpu", "4294967296"),
            "--nproc_per_node=gpu: CUDA shows a GPU but torch counts none (CUDA_VISIBLE_DEVICES=4294967296: "
            "its entry 4294967296 names no device of this host's 1 GPU), as torchrun refuses it; correct "
            "CUDA_VISIBLE_DEVICES or use a number");
  EXPECT_NE(resolveNproc("gpu", {}, NvidiaHost{}).status().message().find("no /dev/nvidiaN device"),
            std::string::npos);
}

}  // namespace
}  // namespace muster::launcher
