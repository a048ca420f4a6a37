// --nproc_per_node=gpu and auto under CUDA_VISIBLE_DEVICES: the workers torchrun starts, read off
// an H100 machine (one GPU) with torch 2.11 by tests/gpu/visible_devices.py on 2026-11-27, for
// every value it tried; and the same rules on hosts of several GPUs and without NVML.
#include "launcher/devices.h"
#include "launcher/visible_gpus.h"

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
  h.nvml = NvmlState::kRead;
  h.uuids = GpuUuids{std::move(gpus), std::move(migs)};
  return h;
}

// A host whose NVML could not be read (a container given the driver's compute libraries only).
NvidiaHost withoutNvml(int devices) {
  NvidiaHost h;
  h.devices = devices;
  h.nvml = NvmlState::kUnreadable;
  return h;
}

// Workers for --nproc_per_node=`nproc`: a count, or kRefused.
int workers(const std::string& nproc, const std::optional<std::string>& visible, const NvidiaHost& h,
            Env env = {}) {
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
  // NVML could not be read: a UUID list cannot be looked up (refused, saying so); torch takes
  // CUDA's count of an index list where it would cut it by NVML's.
  EXPECT_EQ(workers("gpu", "GPU-x,GPU-y", withoutNvml(2)), kRefused);
  EXPECT_EQ(workers("auto", "MIG-x", withoutNvml(2)), kRefused);
  EXPECT_EQ(workers("gpu", "4294967296", withoutNvml(1)), 1);
  EXPECT_EQ(workers("gpu", "0,1,0", withoutNvml(1)), kRefused);  // torch's parse alone leaves none
  EXPECT_EQ(workers("gpu", "1,0,1", withoutNvml(2)), kRefused);  // CUDA's too
  // No GPU at all: CUDA_VISIBLE_DEVICES lists what is not there.
  NvidiaHost none;
  EXPECT_EQ(workers("gpu", "0,1", none), kRefused);
  EXPECT_EQ(workers("auto", "0,1,2", none), countCpus());
  EXPECT_EQ(workers("gpu", "MIG-x", none), kRefused);
  EXPECT_EQ(workers("gpu", std::nullopt, none), kRefused);
}

// Where torch's parse of a list is not CUDA's: it raises on a sign without digits, compares
// numbers whole, strips Python's blanks, and with PYTORCH_NVML_BASED_CUDA_CHECK=1 asks its own
// count whether CUDA is there.
TEST(Devices, TorchsOwnParseWhereItIsNotCudas) {
  const NvidiaHost one = host(1, {kUuid});
  EXPECT_EQ(workers("gpu", "0,+", one), kRefused);
  EXPECT_EQ(workers("auto", "0,--1", one), kRefused);
  EXPECT_EQ(workers("auto", "+", one), countCpus());  // CUDA shows none: torch is not asked
  EXPECT_EQ(workers("gpu", "0,99999999999999999999,99999999999999999998", one), 1);
  EXPECT_EQ(workers("gpu", "-4294967296", one), kRefused);  // CUDA wraps it to 0, torch ends there
  EXPECT_EQ(workers("gpu", "0x1", one), 1);                 // CUDA reads base 10
  // torch strips \x1c, CUDA does not: torchrun starts 2 workers, which see one GPU.
  EXPECT_EQ(workers("gpu", "0,\x1c" "1", host(2, {"GPU-a", "GPU-b"})), 2);
  EXPECT_EQ(workers("gpu", "\x1c" "0", one), kRefused);
  EXPECT_EQ(workers("gpu", "\x1c" "0", one, {{"PYTORCH_NVML_BASED_CUDA_CHECK", "1"}}), 1);
  EXPECT_EQ(workers("auto", "0,1,0", one, {{"PYTORCH_NVML_BASED_CUDA_CHECK", "1"}}), countCpus());
  // Not ASCII: torch strips and reads digits by Unicode's rules, which launch does not follow.
  EXPECT_EQ(workers("gpu", "0,\xc2\xa0" "1", host(2, {"GPU-a", "GPU-b"})), kRefused);
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
            "--nproc_per_node=auto: CUDA shows a GPU but torch counts none, and torchrun refuses that "
            "(CUDA_VISIBLE_DEVICES=0,1,0: it names device 0 twice); correct CUDA_VISIBLE_DEVICES or use a number");
  EXPECT_EQ(message("gpu", "4294967296"),
            "--nproc_per_node=gpu: CUDA shows a GPU but torch counts none, and torchrun refuses that "
            "(CUDA_VISIBLE_DEVICES=4294967296: its entry \"4294967296\" names no device of this host's 1 GPU); "
            "correct CUDA_VISIBLE_DEVICES or use a number");
  EXPECT_EQ(message("gpu", "1\n"),
            "--nproc_per_node=gpu: CUDA shows no GPU here (CUDA_VISIBLE_DEVICES=1\\n: its entry \"1\\n\" names "
            "no device of this host's 1 GPU); use a number or cpu");
  EXPECT_EQ(message("gpu", "GPU-x"),
            "--nproc_per_node=gpu: CUDA shows no GPU here (CUDA_VISIBLE_DEVICES=GPU-x: its entry \"GPU-x\" names "
            "no device of this host's 1 GPU); use a number or cpu");
  EXPECT_NE(resolveNproc("gpu", {}, NvidiaHost{}).status().message().find("no /dev/nvidiaN device"),
            std::string::npos);
  EXPECT_NE(resolveNproc("gpu", {{"CUDA_VISIBLE_DEVICES", "GPU-x"}}, withoutNvml(1)).status().message().find(
                "launch cannot tell which GPUs CUDA shows"),
            std::string::npos);
}

}  // namespace
}  // namespace muster::launcher
