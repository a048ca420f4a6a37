// worker train: distributed DocNN training over Gloo (CPU) or NCCL (GPU), gradients
// all-reduced in buckets inside the optimizer step.
#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <filesystem>

#include "common/log.h"
#include "worker/process_group.h"
#include "worker/stack_dump.h"
#include "worker/programs/config.h"
#include "worker/programs/docnn.h"
#include "worker/programs/programs.h"
#include "worker/shared_dir_channel.h"

namespace muster::programs {
namespace {

auto logger() {
  static auto l = log::get("train");
  return l;
}

struct Encoded {
  torch::Tensor tokens;  // [N, max_seq_len] int64
  torch::Tensor labels;  // [N] int64
};

Encoded encode(const std::vector<Example>& data, const Vocab& vocab, int length) {
  Encoded e;
  e.tokens = torch::empty({static_cast<int64_t>(data.size()), length}, torch::kInt64);
  e.labels = torch::empty({static_cast<int64_t>(data.size())}, torch::kInt64);
  auto tok = e.tokens.accessor<int64_t, 2>();
  auto lab = e.labels.accessor<int64_t, 1>();
  for (size_t i = 0; i < data.size(); ++i) {
    auto ids = vocab.encode(data[i].sentence, length);
    for (int j = 0; j < length; ++j) tok[i][j] = ids[j];
    lab[i] = data[i].label;
  }
  return e;
}

Encoded onDevice(Encoded e, const torch::Device& device) {
  return {e.tokens.to(device), e.labels.to(device)};
}

// Gradients of all parameters, all-reduced (summed, then divided by the world size) in
// buckets of at most bucketBytes: one collective per bucket, not one per parameter.
void syncGradients(const std::vector<torch::Tensor>& params, worker::Collectives& pg, int world,
                   double bucketMiB) {
  if (world == 1) return;
  size_t limit = static_cast<size_t>(bucketMiB * (1 << 20));
  std::vector<torch::Tensor> bucket;
  size_t bytes = 0;
  auto flush = [&] {
    if (bucket.empty()) return;
    std::vector<torch::Tensor> flat_list;
    for (auto& g : bucket) flat_list.push_back(g.view(-1));
    std::vector<torch::Tensor> flat{torch::cat(flat_list)};
    pg.allreduce(flat)->wait();
    worker::heartbeat();
    flat[0].div_(world);
    int64_t offset = 0;
    for (auto& g : bucket) {
      g.view(-1).copy_(flat[0].narrow(0, offset, g.numel()));
      offset += g.numel();
    }
    bucket.clear();
    bytes = 0;
  };
  for (const auto& p : params) {
    if (!p.grad().defined()) continue;
    bucket.push_back(p.grad());
    bytes += p.grad().numel() * p.grad().element_size();
    if (bytes >= limit) flush();
  }
  flush();
}

struct Metrics {
  double loss = 0, accuracy = 0;
  int64_t count = 0;
};

// Each rank evaluates every world-th example; sums are all-reduced.
Metrics evaluate(DocNN& model, const Encoded& data, worker::Collectives& pg, const worker::WorkerEnv& env,
                 int batch) {
  torch::NoGradGuard noGrad;
  model->eval();
  // Every world-th example from this rank's, without padding: each example counts once.
  std::vector<int64_t> idx;
  for (int64_t i = env.rank; i < data.labels.size(0); i += env.worldSize) idx.push_back(i);
  double loss = 0, correct = 0;
  for (size_t s = 0; s < idx.size(); s += batch) {
    auto ids = torch::tensor(std::vector<int64_t>(idx.begin() + s, idx.begin() + std::min(idx.size(), s + batch)))
                   .to(data.labels.device());
    auto logits = model(data.tokens.index_select(0, ids));
    auto y = data.labels.index_select(0, ids);
    loss += torch::nn::functional::cross_entropy(logits, y,
                torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)).item<double>();
    correct += (logits.argmax(1) == y).sum().item<double>();
  }
  std::vector<torch::Tensor> sums{
      torch::tensor({loss, correct, static_cast<double>(idx.size())}, torch::kFloat64).to(data.labels.device())};
  pg.allreduce(sums)->wait();
  model->train();
  Metrics m;
  m.count = static_cast<int64_t>(sums[0][2].item<double>());
  if (m.count > 0) {
    m.loss = sums[0][0].item<double>() / m.count;
    m.accuracy = sums[0][1].item<double>() / m.count;
  }
  return m;
}

int fail(const worker::WorkerEnv& env, int code, const std::string& what) {
  std::fprintf(stderr, "worker train (rank %d): %s\n", env.rank, what.c_str());
  return code;
}

}  // namespace

std::vector<int64_t> shardIndices(int64_t n, int world, int rank, uint64_t seed, int epoch, bool shuffle) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  if (shuffle) {
    auto gen = at::detail::createCPUGenerator(seed + static_cast<uint64_t>(epoch));
    auto perm = torch::randperm(n, gen, torch::kInt64);
    std::memcpy(order.data(), perm.data_ptr(), n * sizeof(int64_t));
  } else {
    std::iota(order.begin(), order.end(), 0);
  }
  int64_t total = (n + world - 1) / world * world;
  for (int64_t i = n; i < total; ++i) order.push_back(order[static_cast<size_t>(i - n)]);
  std::vector<int64_t> mine;
  for (int64_t i = rank; i < total; i += world) mine.push_back(order[static_cast<size_t>(i)]);
  return mine;
}

int runTrain(const worker::WorkerEnv& env, const std::string& configPath, const std::string& backend) {
  auto config = loadTrainConfig(configPath);
  if (!config.ok()) return fail(env, 2, std::string(config.status().message()));
  const TrainConfig& c = *config;
  if (c.distributedWorldSize != 0 && c.distributedWorldSize != env.worldSize) {
    return fail(env, 2, fmt::format("{}: distributed_world_size is {} but launch started {} ranks",
                                    configPath, c.distributedWorldSize, env.worldSize));
  }
  if (c.numThreads > 0) at::set_num_threads(c.numThreads);
  // auto: the group's own choice (NCCL on this local rank's GPU where the build and node allow,
  // else Gloo on the CPU) when use_cuda_if_available holds, else Gloo.
  std::string groupBackend = backend == "auto" && !c.useCudaIfAvailable ? "gloo" : backend;
  auto train = readTsv(c.trainPath);
  if (!train.ok()) return fail(env, 2, std::string(train.status().message()));
  if (train->empty()) {
    return fail(env, 2, fmt::format("{}: train_path {} holds no examples; nothing to train on",
                                    configPath, c.trainPath));
  }
  std::vector<Example> evalData, testData;
  if (!c.evalPath.empty()) {
    auto e = readTsv(c.evalPath);
    if (!e.ok()) return fail(env, 2, std::string(e.status().message()));
    evalData = std::move(*e);
  }
  if (!c.testPath.empty()) {
    auto t = readTsv(c.testPath);
    if (!t.ok()) return fail(env, 2, std::string(t.status().message()));
    testData = std::move(*t);
  }

  // The data is checked first: a bad file fails before any rank waits for another.
  auto group = worker::createProcessGroup(env, {.backend = groupBackend, .timeout = std::chrono::minutes(5)});
  if (!group.ok()) return fail(env, 1, std::string(group.status().message()));
  worker::GroupCloser closer(*group);
  auto& pg = *group->pg;
  const torch::Device device = worker::groupDevice(*group, env);
  const bool gpu = device.is_cuda();
  if (backend == "auto" && c.useCudaIfAvailable && !gpu && env.rank == 0) {
    logger()->info("use_cuda_if_available: no GPU with NCCL for each rank of this node (this "
                   "LibTorch has CUDA: {}); training on the CPU with Gloo",
                   torch::cuda::is_available() ? "yes" : "no");
  }
  worker::WorkerEnv channelEnv = env;
  if (!c.sharedDir.empty()) channelEnv.sharedDir = c.sharedDir;
  auto channel = worker::SharedDirChannel::create(channelEnv, group->store);
  if (!channel.ok()) return fail(env, 1, std::string(channel.status().message()));

  // Resume from the checkpoint when there is one; else rank 0 builds the vocabulary and
  // sends it to the others through the shared-dir channel.
  bool resume = c.resume && !c.savePath.empty() && std::filesystem::exists(c.savePath);
  if (c.resume && !resume && env.rank == 0) {
    // The first attempt of a job that may restart has nothing to resume yet: say so.
    logger()->info("resume: no checkpoint at {} yet; training from the start", c.savePath);
  }
  ModelConfig modelConfig = c.model;
  int startEpoch = 0;
  std::string vocabText;
  if (resume) {
    auto meta = readCheckpointMeta(c.savePath);
    if (!meta.ok()) return fail(env, 1, std::string(meta.status().message()));
    modelConfig = meta->model;
    vocabText = meta->vocab;
    startEpoch = meta->epochsDone;
  } else {
    if (env.rank == 0) vocabText = Vocab::build(*train, c.model.minFreq, c.model.maxVocab).serialize();
    auto shared = (*channel)->broadcastBytes(vocabText, 0);
    if (!shared.ok()) return fail(env, 1, std::string(shared.status().message()));
    vocabText = std::move(*shared);
  }
  auto vocab = Vocab::parse(vocabText);
  if (!vocab.ok()) return fail(env, 1, std::string(vocab.status().message()));

  torch::manual_seed(c.trainer.seed);
  DocNN model(vocab->size(), modelConfig);
  model->to(device);  // before the optimizer takes the parameters
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (c.optimizer.type == "adam") {
    optimizer = std::make_unique<torch::optim::Adam>(
        model->parameters(), torch::optim::AdamOptions(c.optimizer.lr).weight_decay(c.optimizer.weightDecay));
  } else {
    optimizer = std::make_unique<torch::optim::SGD>(
        model->parameters(), torch::optim::SGDOptions(c.optimizer.lr)
                                 .momentum(c.optimizer.momentum)
                                 .weight_decay(c.optimizer.weightDecay));
  }
  if (resume) {
    if (auto s = loadCheckpoint(c.savePath, model, optimizer.get(), device); !s.ok()) {
      return fail(env, 1, std::string(s.message()));
    }
    if (env.rank == 0) logger()->info("resumed from {} after epoch {}", c.savePath, startEpoch);
  }
  // Every rank starts from rank 0's parameters, as DistributedDataParallel does.
  for (auto& p : model->parameters()) {
    std::vector<torch::Tensor> t{p.data()};
    pg.broadcast(t)->wait();
  }
  auto trainSet = onDevice(encode(*train, *vocab, modelConfig.maxSeqLen), device);
  auto evalSet = onDevice(encode(evalData, *vocab, modelConfig.maxSeqLen), device);
  auto testSet = onDevice(encode(testData, *vocab, modelConfig.maxSeqLen), device);
  auto params = model->parameters();
  int64_t n = trainSet.labels.size(0);
  int batch = c.trainer.batchSize;
  if (env.rank == 0) {
    logger()->info("training DocNN on {} examples ({} per rank and epoch), vocabulary {}, {} rank(s) "
                   "on {} with {}, batch {} per rank x {} micro-batch(es) per step",
                   n, (n + env.worldSize - 1) / env.worldSize, vocab->size(), env.worldSize,
                   gpu ? "the GPU" : "the CPU", group->backend, batch, c.trainer.updateCycle);
  }
  auto jobStart = std::chrono::steady_clock::now();
  int64_t samplesSeen = 0;
  double trainSeconds = 0;
  Metrics last;
  for (int epoch = startEpoch; epoch < c.trainer.epochs; ++epoch) {
    auto indices = shardIndices(n, env.worldSize, env.rank, c.trainer.seed, epoch, true);
    int64_t batches = (static_cast<int64_t>(indices.size()) + batch - 1) / batch;
    auto epochStart = std::chrono::steady_clock::now();
    auto windowStart = epochStart;
    int64_t windowSamples = 0;
    double lossSum = 0;
    int64_t lossCount = 0, step = 0;
    optimizer->zero_grad();
    for (int64_t b = 0; b < batches; ++b) {
      auto from = indices.begin() + b * batch;
      auto to = indices.begin() + std::min<int64_t>((b + 1) * batch, indices.size());
      auto ids = torch::tensor(std::vector<int64_t>(from, to)).to(device);
      auto logits = model(trainSet.tokens.index_select(0, ids));
      auto loss = torch::nn::functional::cross_entropy(logits, trainSet.labels.index_select(0, ids));
      (loss / c.trainer.updateCycle).backward();
      lossSum += loss.item<double>() * ids.size(0);
      lossCount += ids.size(0);
      windowSamples += ids.size(0);
      if ((b + 1) % c.trainer.updateCycle == 0 || b + 1 == batches) {
        syncGradients(params, pg, env.worldSize, c.trainer.bucketMiB);
        optimizer->step();
        optimizer->zero_grad();
        ++step;
        if (env.rank == 0 && step % c.trainer.reportInterval == 0) {
          double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - windowStart).count();
          logger()->info("epoch {} step {}: loss {:.4f}, {:.0f} samples/s", epoch, step,
                         lossSum / lossCount, windowSamples * env.worldSize / secs);
          windowStart = std::chrono::steady_clock::now();
          windowSamples = 0;
        }
      }
    }
    double epochSecs = std::chrono::duration<double>(std::chrono::steady_clock::now() - epochStart).count();
    trainSeconds += epochSecs;
    samplesSeen += static_cast<int64_t>(indices.size()) * env.worldSize;
    std::vector<torch::Tensor> trainLoss{
        torch::tensor({lossSum, static_cast<double>(lossCount)}, torch::kFloat64).to(device)};
    pg.allreduce(trainLoss)->wait();
    if (evalSet.labels.size(0) > 0) last = evaluate(model, evalSet, pg, env, batch);
    if (env.rank == 0) {
      logger()->info("epoch {}: train loss {:.4f}, eval loss {:.4f}, eval accuracy {:.3f} ({:.0f} samples/s)", epoch,
                     trainLoss[0][0].item<double>() / trainLoss[0][1].item<double>(), last.loss, last.accuracy,
                     static_cast<double>(indices.size()) * env.worldSize / epochSecs);
      if (!c.savePath.empty()) {
        auto s = saveCheckpoint(c.savePath, model, optimizer.get(), {modelConfig, vocabText, epoch + 1});
        if (!s.ok()) return fail(env, 1, std::string(s.message()));
      }
    }
    pg.barrier()->wait();
  }
  if (testSet.labels.size(0) > 0) {
    auto test = evaluate(model, testSet, pg, env, batch);
    if (env.rank == 0) logger()->info("test: loss {:.4f}, accuracy {:.3f} on {} examples", test.loss, test.accuracy, test.count);
  }
  double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - jobStart).count();
  if (env.rank == 0) {
    logger()->info("trained {} epoch(s) in {:.1f} s: {:.0f} samples/s over {} rank(s){}",
                   c.trainer.epochs - startEpoch, total,
                   trainSeconds > 0 ? samplesSeen / trainSeconds : 0.0, env.worldSize,
                   c.savePath.empty() ? "" : fmt::format("; checkpoint {}", c.savePath));
  }
  return 0;
}

}  // namespace muster::programs
