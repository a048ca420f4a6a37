// worker decode: each rank predicts its share of the input; the predictions come back to
// rank 0 through the shared-dir channel; rank 0 writes them in the input's order.
#include <fmt/format.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/log.h"
#include "worker/process_group.h"
#include "worker/programs/config.h"
#include "worker/programs/docnn.h"
#include "worker/programs/programs.h"
#include "worker/shared_dir_channel.h"

namespace muster::programs {
namespace {

auto logger() {
  static auto l = log::get("decode");
  return l;
}

int fail(const worker::WorkerEnv& env, int code, const std::string& what) {
  std::fprintf(stderr, "worker decode (rank %d): %s\n", env.rank, what.c_str());
  return code;
}

}  // namespace

int runDecode(const worker::WorkerEnv& env, const std::string& configPath) {
  auto config = loadDecodeConfig(configPath);
  if (!config.ok()) return fail(env, 2, std::string(config.status().message()));
  const DecodeConfig& c = *config;
  if (c.distributedWorldSize != 0 && c.distributedWorldSize != env.worldSize) {
    return fail(env, 2, fmt::format("{}: distributed_world_size is {} but launch started {} ranks",
                                    configPath, c.distributedWorldSize, env.worldSize));
  }
  // One intra-op thread: the same arithmetic, in the same order, whatever the world size.
  at::set_num_threads(1);
  auto meta = readCheckpointMeta(c.checkpoint);
  if (!meta.ok()) return fail(env, 1, std::string(meta.status().message()));
  auto vocab = Vocab::parse(meta->vocab);
  if (!vocab.ok()) return fail(env, 1, std::string(vocab.status().message()));
  DocNN model(vocab->size(), meta->model);
  if (auto s = loadCheckpoint(c.checkpoint, model, nullptr); !s.ok()) return fail(env, 1, std::string(s.message()));
  model->eval();
  auto input = readTsv(c.inputPath, /*labelled=*/false);
  if (!input.ok()) return fail(env, 2, std::string(input.status().message()));

  auto store = worker::connectStore(env, std::chrono::minutes(5));
  if (!store.ok()) return fail(env, 1, std::string(store.status().message()));
  worker::WorkerEnv channelEnv = env;
  if (!c.sharedDir.empty()) channelEnv.sharedDir = c.sharedDir;
  auto channel = worker::SharedDirChannel::create(channelEnv, *store);
  if (!channel.ok()) return fail(env, 1, std::string(channel.status().message()));

  // Fixed global batches, dealt to the ranks in turn: every sentence is computed in the same
  // batch whatever the world size, so the output is the same to the byte.
  int64_t n = static_cast<int64_t>(input->size());
  int64_t batches = (n + c.batchSize - 1) / c.batchSize;
  std::ostringstream mine;
  torch::NoGradGuard noGrad;
  auto start = std::chrono::steady_clock::now();
  for (int64_t b = env.rank; b < batches; b += env.worldSize) {
    int64_t from = b * c.batchSize, to = std::min(n, from + c.batchSize);
    auto tokens = torch::empty({to - from, meta->model.maxSeqLen}, torch::kInt64);
    auto acc = tokens.accessor<int64_t, 2>();
    for (int64_t i = from; i < to; ++i) {
      auto ids = vocab->encode((*input)[static_cast<size_t>(i)].sentence, meta->model.maxSeqLen);
      for (int j = 0; j < meta->model.maxSeqLen; ++j) acc[i - from][j] = ids[j];
    }
    auto probs = torch::softmax(model(tokens), 1);
    auto [best, label] = probs.max(1);
    for (int64_t i = from; i < to; ++i) {
      mine << i << '\t' << label[i - from].item<int64_t>() << '\t'
           << fmt::format("{:.6f}", best[i - from].item<float>()) << '\n';
    }
  }
  auto parts = (*channel)->gatherBytes(mine.str(), 0);
  if (!parts.ok()) return fail(env, 1, std::string(parts.status().message()));
  if (env.rank != 0) return 0;
  std::vector<std::string> lines(static_cast<size_t>(n));
  for (const auto& part : *parts) {
    std::istringstream in(part);
    for (std::string line; std::getline(in, line);) {
      auto tab = line.find('\t');
      int64_t index = std::stoll(line.substr(0, tab));
      if (index < 0 || index >= n) return fail(env, 1, fmt::format("a rank returned index {} of {}", index, n));
      lines[static_cast<size_t>(index)] = (*input)[static_cast<size_t>(index)].sentence + line.substr(tab);
    }
  }
  std::string tmp = c.outputPath + ".tmp";
  {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(c.outputPath).parent_path(), ec);
    std::ofstream out(tmp);
    out << "sentence\tprediction\tprobability\n";
    for (size_t i = 0; i < lines.size(); ++i) {
      if (lines[i].empty()) return fail(env, 1, fmt::format("no prediction came back for line {}", i + 2));
      out << lines[i] << '\n';
    }
    if (!out) return fail(env, 1, fmt::format("cannot write {}", c.outputPath));
  }
  std::rename(tmp.c_str(), c.outputPath.c_str());
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  logger()->info("decoded {} sentences on {} rank(s) in {:.2f} s; predictions in {}", n, env.worldSize,
                 secs, c.outputPath);
  return 0;
}

}  // namespace muster::programs
