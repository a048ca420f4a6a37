// DocNN: token embedding -> parallel 1-D convolutions of several widths -> max-pool over time
// -> dropout -> linear. And its checkpoint (model, optimizer, vocabulary, epoch, model config).
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "worker/programs/config.h"
#include "worker/programs/sst_data.h"

namespace muster::programs {

struct DocNNImpl : torch::nn::Module {
  DocNNImpl(int vocabSize, const ModelConfig& config);
  // tokens: [batch, max_seq_len] int64 -> logits [batch, num_classes].
  torch::Tensor forward(const torch::Tensor& tokens);

  torch::nn::Embedding embedding{nullptr};
  torch::nn::ModuleList convs;
  torch::nn::Dropout dropout{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(DocNN);

struct Checkpoint {
  ModelConfig model;
  std::string vocab;  // Vocab::serialize()
  int epochsDone = 0;
};

// Written to a temporary name and renamed: a crash never leaves half a checkpoint.
absl::Status saveCheckpoint(const std::string& path, DocNN& model, torch::optim::Optimizer* optimizer,
                            const Checkpoint& meta);
// Reads the metadata, then (when given) the parameters into `model` and the optimizer state,
// every tensor mapped to `device` (a checkpoint saved on a GPU loads on a CPU and back).
absl::StatusOr<Checkpoint> readCheckpointMeta(const std::string& path);
absl::Status loadCheckpoint(const std::string& path, DocNN& model, torch::optim::Optimizer* optimizer,
                            torch::Device device = torch::kCPU);

}  // namespace muster::programs
