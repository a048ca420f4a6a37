// Started by launch: reads its environment, builds a Gloo group on the job's store, all-reduces
// its rank, and broadcasts rank 0's bytes through the shared-dir channel.
#include <muster/worker/process_group.h>
#include <muster/worker/shared_dir_channel.h>
#include <muster/worker/worker_env.h>
#include <torch/torch.h>

#include <cstdio>

int main() {
  auto env = muster::worker::WorkerEnv::fromProcess();
  if (!env.ok()) {
    std::fprintf(stderr, "consumer: %s\n", std::string(env.status().message()).c_str());
    return 2;
  }
  muster::worker::GroupOptions options;
  options.backend = "gloo";
  auto group = muster::worker::createProcessGroup(*env, options);
  if (!group.ok()) {
    std::fprintf(stderr, "consumer: %s\n", std::string(group.status().message()).c_str());
    return 1;
  }
  std::vector<at::Tensor> t{torch::full({4}, static_cast<float>(env->rank + 1))};
  group->pg->allreduce(t)->wait();
  auto channel = muster::worker::SharedDirChannel::create(*env, group->store);
  if (!channel.ok()) {
    std::fprintf(stderr, "consumer: %s\n", std::string(channel.status().message()).c_str());
    return 1;
  }
  auto hello = (*channel)->broadcastBytes(env->rank == 0 ? "hello from rank 0" : "", 0);
  if (!hello.ok()) {
    std::fprintf(stderr, "consumer: %s\n", std::string(hello.status().message()).c_str());
    return 1;
  }
  std::printf("consumer rank %d/%d: sum %.0f, %s\n", env->rank, env->worldSize, t[0][0].item<float>(),
              hello->c_str());
  return 0;
}
