// DocNN and checkpoints.
#include "worker/programs/docnn.h"

#include <filesystem>

#include <fmt/format.h>

#include <cstdio>
#include <nlohmann/json.hpp>

namespace muster::programs {

DocNNImpl::DocNNImpl(int vocabSize, const ModelConfig& c) {
  embedding = register_module(
      "embedding", torch::nn::Embedding(torch::nn::EmbeddingOptions(vocabSize, c.embedDim).padding_idx(Vocab::kPad)));
  for (int k : c.kernelSizes) {
    convs->push_back(torch::nn::Conv1d(torch::nn::Conv1dOptions(c.embedDim, c.kernelNum, k)));
  }
  register_module("convs", convs);
  dropout = register_module("dropout", torch::nn::Dropout(c.dropout));
  fc = register_module("fc", torch::nn::Linear(c.kernelNum * static_cast<int>(c.kernelSizes.size()), c.numClasses));
}

torch::Tensor DocNNImpl::forward(const torch::Tensor& tokens) {
  auto x = embedding(tokens).transpose(1, 2);  // [B, E, T]
  std::vector<torch::Tensor> pooled;
  for (const auto& conv : *convs) {
    auto h = torch::relu(conv->as<torch::nn::Conv1d>()->forward(x));  // [B, K, T-k+1]
    pooled.push_back(std::get<0>(h.max(2)));
  }
  return fc(dropout(torch::cat(pooled, 1)));
}

namespace {

nlohmann::json modelJson(const ModelConfig& m) {
  return {{"embed_dim", m.embedDim}, {"kernel_num", m.kernelNum}, {"kernel_sizes", m.kernelSizes},
          {"dropout", m.dropout},    {"max_vocab", m.maxVocab},   {"min_freq", m.minFreq},
          {"max_seq_len", m.maxSeqLen}, {"num_classes", m.numClasses}};
}

torch::Tensor bytesTensor(const std::string& s) {
  auto t = torch::empty({static_cast<int64_t>(s.size())}, torch::kUInt8);
  std::memcpy(t.data_ptr(), s.data(), s.size());
  return t;
}

std::string tensorBytes(const torch::Tensor& t) {
  auto c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.numel()));
}

}  // namespace

absl::Status saveCheckpoint(const std::string& path, DocNN& model, torch::optim::Optimizer* optimizer,
                            const Checkpoint& meta) {
  std::string tmp = path + ".tmp";
  std::error_code ec;
  if (auto dir = std::filesystem::path(path).parent_path(); !dir.empty()) {
    std::filesystem::create_directories(dir, ec);
  }
  try {
    torch::serialize::OutputArchive archive;
    model->save(archive);
    archive.write("muster_model_config", bytesTensor(modelJson(meta.model).dump()));
    archive.write("muster_vocab", bytesTensor(meta.vocab));
    archive.write("muster_epochs_done", torch::tensor(static_cast<int64_t>(meta.epochsDone)));
    if (optimizer != nullptr) {
      torch::serialize::OutputArchive opt;
      optimizer->save(opt);
      archive.write("muster_optimizer", opt);
    }
    archive.save_to(tmp);
  } catch (const std::exception& e) {
    std::remove(tmp.c_str());
    return absl::InternalError(fmt::format("writing checkpoint {}: {}", path, e.what()));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(fmt::format("writing checkpoint {}: rename failed", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<Checkpoint> readCheckpointMeta(const std::string& path) {
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(path, torch::kCPU);  // a GPU's checkpoint too, on a machine without one
    torch::Tensor config, vocab, epochs;
    if (!archive.try_read("muster_model_config", config) || !archive.try_read("muster_vocab", vocab) ||
        !archive.try_read("muster_epochs_done", epochs)) {
      return absl::DataLossError(fmt::format("{} is not a muster DocNN checkpoint", path));
    }
    auto j = nlohmann::json::parse(tensorBytes(config));
    Checkpoint c;
    c.model.embedDim = j.at("embed_dim");
    c.model.kernelNum = j.at("kernel_num");
    c.model.kernelSizes = j.at("kernel_sizes").get<std::vector<int>>();
    c.model.dropout = j.at("dropout");
    c.model.maxVocab = j.at("max_vocab");
    c.model.minFreq = j.at("min_freq");
    c.model.maxSeqLen = j.at("max_seq_len");
    c.model.numClasses = j.at("num_classes");
    c.vocab = tensorBytes(vocab);
    c.epochsDone = static_cast<int>(epochs.item<int64_t>());
    return c;
  } catch (const std::exception& e) {
    std::string what = e.what();
    return absl::DataLossError(fmt::format("cannot read checkpoint {}: {}", path, what.substr(0, what.find('\n'))));
  }
}

absl::Status loadCheckpoint(const std::string& path, DocNN& model, torch::optim::Optimizer* optimizer,
                            torch::Device device) {
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(path, device);
    model->load(archive);
    torch::serialize::InputArchive opt;
    if (optimizer != nullptr && archive.try_read("muster_optimizer", opt)) optimizer->load(opt);
    return absl::OkStatus();
  } catch (const std::exception& e) {
    std::string what = e.what();
    return absl::DataLossError(fmt::format("cannot load checkpoint {}: {}", path, what.substr(0, what.find('\n'))));
  }
}

}  // namespace muster::programs
