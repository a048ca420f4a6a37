// Test helper: SharedDirChannel between real processes. "all": every operation and dtype;
// "big MIB": rank 0 sends MIB mebibytes to rank 1, which checks them; "send MIB" / "recv":
// one transfer from rank 1 to rank 0. The third argument bounds each receive; the start-up
// probe waits up to 120 s for every rank (LibTorch starts slowly on a loaded machine). Exit 0
// when every check passed. "store-set KEY VALUE" / "store-get KEY": one call on the job's
// c10d store (the value printed).
#include <fmt/format.h>
#include <torch/torch.h>

#include <cstdio>

#include "worker/process_group.h"
#include "worker/shared_dir_channel.h"

using namespace muster::worker;

namespace {

int fail(const WorkerEnv& env, const std::string& what) {
  std::fprintf(stderr, "channel_tool rank %d: %s\n", env.rank, what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "all";
  bool numeric = mode != "store-set" && mode != "store-get";
  long mib = numeric && argc > 2 ? std::stol(argv[2]) : 1;
  double timeoutS = numeric && argc > 3 ? std::stod(argv[3]) : 60;
  auto env = WorkerEnv::fromProcess();
  if (!env.ok()) return fail({}, std::string(env.status().message()));
  std::chrono::milliseconds timeout(static_cast<int64_t>(timeoutS * 1000));
  auto store = connectStore(*env, timeout);
  if (!store.ok()) return fail(*env, std::string(store.status().message()));
  if (mode == "store-set" || mode == "store-get") {
    // argv: store-set KEY VALUE / store-get KEY: one c10d call, the value printed.
    if (argc < 3) return fail(*env, "store-set KEY VALUE / store-get KEY");
    try {
      if (mode == "store-set") {
        std::string v = argc > 3 ? argv[3] : "";
        (*store)->set(argv[2], std::vector<uint8_t>(v.begin(), v.end()));
      } else {
        auto v = (*store)->get(argv[2]);
        std::printf("%s\n", std::string(v.begin(), v.end()).c_str());
      }
    } catch (const std::exception& e) {
      return fail(*env, e.what());
    }
    return 0;
  }
  auto channel = SharedDirChannel::create(*env, *store, {.timeout = timeout, .startTimeout = std::chrono::seconds(120)});
  if (!channel.ok()) return fail(*env, std::string(channel.status().message()));
  auto& c = **channel;
  int n = env->worldSize, me = env->rank;
  if (mode == "all") {
    std::vector<at::ScalarType> dtypes{torch::kFloat32, torch::kFloat64, torch::kInt64, torch::kInt8,
                                       torch::kBool, torch::kFloat16, torch::kBFloat16};
    for (auto dtype : dtypes) {
      auto value = [&](int r) { return (torch::arange(24).reshape({2, 3, 4}) + r).remainder(2 + r).to(dtype); };
      // A ring of sends, then each collective.
      if (auto s = c.send(value(me), (me + 1) % n); !s.ok()) return fail(*env, std::string(s.message()));
      auto got = c.recv((me + n - 1) % n);
      if (!got.ok()) return fail(*env, std::string(got.status().message()));
      if (!torch::equal(*got, value((me + n - 1) % n))) return fail(*env, "ring recv mismatch");
      auto b = c.broadcast(value(n - 1), n - 1);
      if (!b.ok() || !torch::equal(*b, value(n - 1))) return fail(*env, "broadcast mismatch");
      auto g = c.gather(value(me), 0);
      if (!g.ok()) return fail(*env, std::string(g.status().message()));
      for (int r = 0; me == 0 && r < n; ++r) {
        if (!torch::equal((*g)[r], value(r))) return fail(*env, "gather mismatch");
      }
      auto all = c.allGather(value(me));
      if (!all.ok()) return fail(*env, std::string(all.status().message()));
      for (int r = 0; r < n; ++r) {
        if (!torch::equal((*all)[r], value(r))) return fail(*env, "all_gather mismatch");
      }
    }
    auto text = c.allGatherBytes(fmt::format("sentence {} from rank {}", "é", me));
    if (!text.ok() || (*text)[n - 1] != fmt::format("sentence {} from rank {}", "é", n - 1)) {
      return fail(*env, "all_gather of bytes mismatch");
    }
    std::printf("channel_tool rank %d: every operation ok\n", me);
    return 0;
  }
  int64_t elements = mib * (1 << 20) / 4;
  if (mode == "big") {
    if (me == 0) {
      auto t = torch::arange(elements, torch::kInt32);
      auto start = std::chrono::steady_clock::now();
      if (auto s = c.send(t, 1); !s.ok()) return fail(*env, std::string(s.message()));
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("channel_tool rank 0: sent %ld MiB in %.2f s\n", mib, secs);
    } else if (me == 1) {
      auto got = c.recv(0);
      if (!got.ok()) return fail(*env, std::string(got.status().message()));
      if (got->numel() != elements || !torch::equal(*got, torch::arange(elements, torch::kInt32))) {
        return fail(*env, "the big tensor arrived wrong");
      }
      std::printf("channel_tool rank 1: received %ld MiB intact\n", mib);
    }
    return 0;
  }
  if (mode == "send") {
    auto s = c.send(torch::ones({elements}), 0);
    return s.ok() ? 0 : fail(*env, std::string(s.message()));
  }
  if (mode == "recv") {
    auto got = c.recv(1);
    return got.ok() ? 0 : fail(*env, std::string(got.status().message()));
  }
  return fail(*env, "unknown mode " + mode);
}
