// createProcessGroup: store, arrival, ProcessGroupGloo or ProcessGroupNCCL.
#include "worker/process_group.h"

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#ifdef USE_C10D_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/cuda.h>
#ifdef USE_C10D_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "common/files.h"
#include "common/log.h"
#include "common/net.h"
#include "rendezvous/store/local_store.h"
#include "rendezvous/client/store_client.h"
#include "worker/c10d_store.h"
#include "worker/store_options.h"

namespace muster::worker {
namespace {

auto logger() {
  static auto l = log::get("worker");
  return l;
}

std::string rankList(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size() && i < 16; ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > 16) out += fmt::format(" and {} more", ranks.size() - 16);
  return out;
}

}  // namespace

absl::StatusOr<c10::intrusive_ptr<c10d::Store>> connectStore(const WorkerEnv& env,
                                                             std::chrono::milliseconds timeout) {
  if (!env.storeAddr.empty()) {
    auto options = storeClientOptions(env);
    if (!options.ok()) return options.status();
    auto client = rendezvous::StoreClient::connect(*options, deadlineAfter(timeout));
    if (!client.ok()) {
      return absl::Status(client.status().code(),
                          fmt::format("MUSTER_STORE_ADDR={}: {}", env.storeAddr,
                                      std::string(client.status().message())));
    }
    std::shared_ptr<rendezvous::Store> shared(std::move(*client));
    return c10::intrusive_ptr<c10d::Store>(c10::make_intrusive<C10dStore>(shared, timeout));
  }
  if (env.worldSize == 1 && (env.masterAddr.empty() || env.masterPort == 0)) {
    // A world of one needs no server: an in-process store.
    auto memory = std::make_shared<rendezvous::MemoryStore>();
    std::shared_ptr<rendezvous::Store> local =
        std::make_shared<rendezvous::LocalStore>(memory, "single");
    return c10::intrusive_ptr<c10d::Store>(c10::make_intrusive<C10dStore>(local, timeout));
  }
  try {
    // Started by torchrun: its agent hosts the TCPStore when TORCHELASTIC_USE_AGENT_STORE is
    // True; otherwise rank 0 does, as init_process_group("env://") would.
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<uint16_t>(env.masterPort);
    opts.isServer = !env.useAgentStore && env.rank == 0;
    opts.waitWorkers = false;
    opts.timeout = timeout;
    return c10::intrusive_ptr<c10d::Store>(c10::make_intrusive<c10d::TCPStore>(env.masterAddr, opts));
  } catch (const std::exception& e) {
    return absl::UnavailableError(fmt::format("TCPStore at MASTER_ADDR={} MASTER_PORT={}: {}",
                                              env.masterAddr, env.masterPort, e.what()));
  }
}

absl::Status awaitRanks(c10d::Store& store, const WorkerEnv& env, const std::string& tag,
                        std::chrono::milliseconds timeout) {
  auto key = [&](int r) { return fmt::format("muster/arrive/{}/{}", tag, r); };
  std::vector<std::string> keys;
  for (int r = 0; r < env.worldSize; ++r) keys.push_back(key(r));
  try {
    store.set(key(env.rank), std::vector<uint8_t>{1});
    store.wait(keys, timeout);
    return absl::OkStatus();
  } catch (const std::exception& e) {
    std::vector<int> missing;
    try {
      for (int r = 0; r < env.worldSize; ++r) {
        if (!store.check({key(r)})) missing.push_back(r);
      }
    } catch (const std::exception&) {
      return absl::UnavailableError(fmt::format("the store went away while waiting for ranks: {}",
                                                e.what()));
    }
    if (missing.empty()) return absl::InternalError(e.what());
    return absl::DeadlineExceededError(fmt::format(
        "rank{} {} of {} did not arrive within {:.1f} s", missing.size() > 1 ? "s" : "",
        rankList(missing), env.worldSize, timeout.count() / 1000.0));
  }
}

bool gpuForEveryLocalRank(const WorkerEnv& env) {
  return static_cast<int64_t>(torch::cuda::device_count()) >= env.localWorldSize;
}

absl::StatusOr<Group> createProcessGroup(const WorkerEnv& env, const GroupOptions& options) {
  auto start = std::chrono::steady_clock::now();
  std::string backend = options.backend;
  bool nccl = kHaveTorchNccl && gpuForEveryLocalRank(env);
  if (backend == "auto") backend = nccl ? "nccl" : "gloo";
  if (backend == "nccl") {
    if (!kHaveTorchNccl) {
      return absl::InvalidArgumentError(
          "backend nccl: this LibTorch was built without CUDA, so it has no ProcessGroupNCCL; use "
          "muster::worker::NcclComm (nccl_check) for NCCL collectives, or gloo");
    }
    if (!gpuForEveryLocalRank(env)) {  // every rank of the node says so, not only the extra ones
      return absl::FailedPreconditionError(fmt::format(
          "backend nccl: {} ranks on this node but {} GPU(s) visible; NCCL needs one rank a GPU "
          "(launch --nproc_per_node=gpu starts one a GPU)",
          env.localWorldSize, torch::cuda::device_count()));
    }
  } else if (backend == "gloo") {
#ifndef USE_C10D_GLOO
    return absl::InvalidArgumentError(
        "backend gloo: this build has no ProcessGroupGloo (its LibTorch came without Gloo's "
        "headers, as PyPI's wheels do); use nccl");
#endif
  } else {
    return absl::InvalidArgumentError(
        fmt::format("backend '{}' is unknown; expected gloo, nccl or auto", backend));
  }
  auto store = connectStore(env, options.timeout);
  if (!store.ok()) return store.status();
  if (auto s = awaitRanks(**store, env, "pg", options.timeout); !s.ok()) return s;
  Group group;
  group.backend = backend;
  group.store = *store;
  try {
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("muster/pg/" + backend, *store);
#ifdef USE_C10D_NCCL
    if (backend == "nccl") {
      c10::cuda::set_device(static_cast<c10::DeviceIndex>(env.localRank));  // as torch.cuda.set_device
      auto nccl = c10d::ProcessGroupNCCL::Options::create();
      nccl->timeout = options.timeout;
      group.pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, env.rank, env.worldSize, nccl);
    }
#endif
#ifdef USE_C10D_GLOO
    if (backend == "gloo") {
      auto gloo = c10d::ProcessGroupGloo::Options::create(options.timeout);
      // One node: loopback needs no name resolution. Several: GLOO_SOCKET_IFNAME's interface,
      // else the local address on the route to the master (which the other nodes reach; the
      // host name PyTorch uses often resolves to 127.0.1.1 or not at all), else the host name.
      if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME")) {
        gloo->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
      } else if (env.localWorldSize == env.worldSize) {
        gloo->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      } else if (std::string route = net::routeAddress(env.masterAddr, env.masterPort);
                 !route.empty() && !net::isLoopback(route)) {
        gloo->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(route));
      } else {
        gloo->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      }
      group.pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, env.rank, env.worldSize, gloo);
    }
#endif
  } catch (const std::exception& e) {
    return absl::InternalError(fmt::format("building the {} group failed: {}", backend, e.what()));
  }
  group.initTime = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  logger()->debug("{}: {} group ready in {} ms", env.describe(), backend, group.initTime.count());
  return group;
}

c10::Device groupDevice(const Group& group, const WorkerEnv& env) {
  if (group.backend != "nccl") return c10::Device(c10::kCPU);
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(env.localRank));
}

void closeGroup(Group& group) {
#ifdef USE_C10D_NCCL
  if (group.pg && group.backend == "nccl") {
    try {
      static_cast<c10d::ProcessGroupNCCL&>(*group.pg).shutdown();
    } catch (const std::exception& e) {
      logger()->warn("shutting the NCCL group down: {}", e.what());
    }
  }
#endif
  group.pg.reset();
}

}  // namespace muster::worker
