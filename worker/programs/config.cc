// Config loading with nlohmann::json; every field checked by name and type.
#include "worker/programs/config.h"

#include <fmt/format.h>
#include <cerrno>
#include <cstring>
#include <limits>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

namespace muster::programs {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// A value as an error message shows it: scalars as JSON (cut at 80 characters), an array or
// an object by its kind and size.
std::string shown(const json& v) {
  if (v.is_array()) return fmt::format("an array of {}", v.size());
  if (v.is_object()) return fmt::format("an object of {} field(s)", v.size());
  std::string text = v.dump();
  return text.size() > 80 ? text.substr(0, 77) + "..." : text;
}

// Reads the fields of one JSON object, remembering which ones were seen so that unknown ones
// are reported.
class Fields {
 public:
  Fields(const json& object, std::string prefix, std::string file)
      : object_(object), prefix_(std::move(prefix)), file_(std::move(file)) {}

  absl::Status error(const std::string& name, const std::string& what) const {
    return absl::InvalidArgumentError(fmt::format("{}: {}{} {}", file_, prefix_, name, what));
  }
  bool has(const std::string& name) {
    seen_.insert(name);
    return object_.contains(name) && !object_.at(name).is_null();
  }
  absl::Status integer(const std::string& name, int& out, int min, int max = std::numeric_limits<int>::max()) {
    if (!has(name)) return absl::OkStatus();
    const json& v = object_.at(name);
    if (!v.is_number_integer() || v.get<int64_t>() < min) {
      return error(name, fmt::format("must be an integer >= {} (got {})", min, shown(v)));
    }
    if (v.get<int64_t>() > max) {
      return error(name, fmt::format("must be at most {} (got {})", max, shown(v)));
    }
    out = v.get<int>();
    return absl::OkStatus();
  }
  absl::Status number(const std::string& name, double& out, double min) {
    if (!has(name)) return absl::OkStatus();
    const json& v = object_.at(name);
    if (!v.is_number() || v.get<double>() < min) {
      return error(name, fmt::format("must be a number >= {} (got {})", min, shown(v)));
    }
    out = v.get<double>();
    return absl::OkStatus();
  }
  absl::Status boolean(const std::string& name, bool& out) {
    if (!has(name)) return absl::OkStatus();
    if (!object_.at(name).is_boolean()) {
      return error(name, fmt::format("must be true or false (got {})", shown(object_.at(name))));
    }
    out = object_.at(name).get<bool>();
    return absl::OkStatus();
  }
  absl::Status string(const std::string& name, std::string& out) {
    if (!has(name)) return absl::OkStatus();
    if (!object_.at(name).is_string()) {
      return error(name, fmt::format("must be a string (got {})", shown(object_.at(name))));
    }
    out = object_.at(name).get<std::string>();
    return absl::OkStatus();
  }
  // A path: relative ones are taken from the config file's directory.
  absl::Status path(const std::string& name, std::string& out) {
    auto s = string(name, out);
    if (s.ok() && !out.empty() && fs::path(out).is_relative()) {
      out = (fs::path(file_).parent_path() / out).lexically_normal().string();
    }
    return s;
  }
  absl::StatusOr<Fields> object(const std::string& name) {
    if (!has(name)) return Fields(json::object(), prefix_ + name + ".", file_);
    if (!object_.at(name).is_object()) return error(name, "must be an object");
    return Fields(object_.at(name), prefix_ + name + ".", file_);
  }
  absl::Status unknown() const {
    for (const auto& [key, value] : object_.items()) {
      if (!seen_.count(key)) return error(key, "is not a known field");
    }
    return absl::OkStatus();
  }
  absl::Status require(const std::string& name, const std::string& value) const {
    if (value.empty()) return error(name, "is required");
    return absl::OkStatus();
  }

 private:
  json object_;
  std::string prefix_, file_;
  std::set<std::string> seen_;
};

absl::StatusOr<json> readJson(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(fmt::format("cannot read config file {}", path));
  try {
    // A config is a few levels deep. nlohmann parses without recursion, but copies, dumps and
    // compares recursively: a value nested 200,000 deep crashed the worker (SIGSEGV) once read.
    // What lies deeper than kDeepest is not even built.
    constexpr int kDeepest = 32;
    bool tooDeep = false;
    json j = json::parse(in, [&tooDeep](int depth, json::parse_event_t, json&) {
      if (depth <= kDeepest) return true;
      tooDeep = true;
      return false;
    });
    if (tooDeep) return absl::InvalidArgumentError(fmt::format("{}: nested deeper than {} levels", path, kDeepest));
    if (!j.is_object()) return absl::InvalidArgumentError(fmt::format("{}: must hold a JSON object", path));
    return j;
  } catch (const json::exception& e) {  // a parse error, or a number out of range (1e999)
    return absl::InvalidArgumentError(fmt::format("{}: malformed JSON: {}", path, e.what()));
  }
}

#define MUSTER_CHECK(expr)              \
  do {                                  \
    if (auto _s = (expr); !_s.ok()) return _s; \
  } while (0)

}  // namespace

absl::StatusOr<TrainConfig> loadTrainConfig(const std::string& path) {
  auto j = readJson(path);
  if (!j.ok()) return j.status();
  TrainConfig c;
  c.path = path;
  Fields top(*j, "", path);
  MUSTER_CHECK(top.integer("distributed_world_size", c.distributedWorldSize, 0));
  MUSTER_CHECK(top.boolean("use_cuda_if_available", c.useCudaIfAvailable));
  MUSTER_CHECK(top.path("train_path", c.trainPath));
  MUSTER_CHECK(top.path("eval_path", c.evalPath));
  MUSTER_CHECK(top.path("test_path", c.testPath));
  MUSTER_CHECK(top.path("shared_dir", c.sharedDir));
  MUSTER_CHECK(top.path("save_path", c.savePath));
  MUSTER_CHECK(top.boolean("resume", c.resume));
  MUSTER_CHECK(top.integer("num_threads", c.numThreads, 0));
  MUSTER_CHECK(top.require("train_path", c.trainPath));
  auto model = top.object("model");
  if (!model.ok()) return model.status();
  auto& m = c.model;
  MUSTER_CHECK(model->integer("embed_dim", m.embedDim, 1, 1 << 16));
  MUSTER_CHECK(model->integer("kernel_num", m.kernelNum, 1, 1 << 16));
  if (model->has("kernel_sizes")) {
    const json& ks = (*j)["model"]["kernel_sizes"];
    m.kernelSizes.clear();
    if (!ks.is_array() || ks.empty()) return model->error("kernel_sizes", "must be a non-empty list of integers >= 1");
    for (const auto& k : ks) {
      if (!k.is_number_integer() || k.get<int64_t>() < 1 || k.get<int64_t>() > 4096) {
        return model->error("kernel_sizes", fmt::format("must hold integers from 1 to 4096 (got {})", shown(k)));
      }
      m.kernelSizes.push_back(k.get<int>());
    }
  }
  MUSTER_CHECK(model->number("dropout", m.dropout, 0));
  if (m.dropout >= 1) return model->error("dropout", "must be below 1");
  MUSTER_CHECK(model->integer("max_vocab", m.maxVocab, 3));
  MUSTER_CHECK(model->integer("min_freq", m.minFreq, 1));
  MUSTER_CHECK(model->integer("max_seq_len", m.maxSeqLen, 1, 1 << 20));
  MUSTER_CHECK(model->integer("num_classes", m.numClasses, 2, 1 << 20));
  // The embedding table is the model's largest tensor: refuse one this host cannot hold
  // before any rank allocates it (LibTorch would abort with its own stack).
  {
    double tableBytes = 4.0 * m.maxVocab * m.embedDim;
    double memory = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
    if (memory > 0 && tableBytes > memory / 2) {
      return model->error("embed_dim", fmt::format(
          "x max_vocab needs a {:.1f} GiB embedding table (max_vocab {} x embed_dim {} x 4 bytes), "
          "more than half of this host's {:.1f} GiB",
          tableBytes / (1u << 30), m.maxVocab, m.embedDim, memory / (1u << 30)));
    }
  }
  int widest = *std::max_element(m.kernelSizes.begin(), m.kernelSizes.end());
  if (m.maxSeqLen < widest) {
    return model->error("max_seq_len", fmt::format("must be at least the widest kernel ({})", widest));
  }
  MUSTER_CHECK(model->unknown());
  auto opt = top.object("optimizer");
  if (!opt.ok()) return opt.status();
  MUSTER_CHECK(opt->string("type", c.optimizer.type));
  if (c.optimizer.type != "adam" && c.optimizer.type != "sgd") {
    return opt->error("type", fmt::format("must be adam or sgd (got \"{}\")", c.optimizer.type));
  }
  MUSTER_CHECK(opt->number("lr", c.optimizer.lr, 0));
  MUSTER_CHECK(opt->number("weight_decay", c.optimizer.weightDecay, 0));
  MUSTER_CHECK(opt->number("momentum", c.optimizer.momentum, 0));
  MUSTER_CHECK(opt->unknown());
  auto tr = top.object("trainer");
  if (!tr.ok()) return tr.status();
  MUSTER_CHECK(tr->integer("epochs", c.trainer.epochs, 1));
  MUSTER_CHECK(tr->integer("batch_size", c.trainer.batchSize, 1, 1 << 24));
  MUSTER_CHECK(tr->integer("update_cycle", c.trainer.updateCycle, 1, 1 << 20));
  int seed = 0;
  MUSTER_CHECK(tr->integer("seed", seed, 0));
  c.trainer.seed = static_cast<uint64_t>(seed);
  MUSTER_CHECK(tr->integer("report_interval", c.trainer.reportInterval, 1));
  MUSTER_CHECK(tr->number("bucket_mib", c.trainer.bucketMiB, 0.001));
  MUSTER_CHECK(tr->unknown());
  MUSTER_CHECK(top.unknown());
  if (c.resume && c.savePath.empty() && top.has("resume")) {
    return top.error("resume", "needs save_path (the checkpoint to resume from)");
  }
  if (!c.savePath.empty()) {
    // Checked now, not after the first epoch: the checkpoint's directory (made when missing)
    // must take a file.
    std::filesystem::path dir = std::filesystem::path(c.savePath).parent_path();
    if (dir.empty()) dir = ".";
    std::error_code ec;
    std::filesystem::path existing = dir;
    while (!existing.empty() && !std::filesystem::exists(existing, ec)) existing = existing.parent_path();
    if (existing.empty()) existing = ".";
    if (!std::filesystem::is_directory(existing, ec)) {
      return top.error("save_path", fmt::format("cannot be written: {} is not a directory", existing.string()));
    }
    if (access(existing.c_str(), W_OK) != 0 ||
        (std::filesystem::exists(c.savePath, ec) && access(c.savePath.c_str(), W_OK) != 0)) {
      return top.error("save_path", fmt::format("cannot be written ({}): {}", existing.string(),
                                                std::strerror(errno)));
    }
  }
  return c;
}

absl::StatusOr<DecodeConfig> loadDecodeConfig(const std::string& path) {
  auto j = readJson(path);
  if (!j.ok()) return j.status();
  DecodeConfig c;
  c.path = path;
  Fields top(*j, "", path);
  MUSTER_CHECK(top.integer("distributed_world_size", c.distributedWorldSize, 0));
  MUSTER_CHECK(top.path("checkpoint", c.checkpoint));
  MUSTER_CHECK(top.path("input_path", c.inputPath));
  MUSTER_CHECK(top.path("output_path", c.outputPath));
  MUSTER_CHECK(top.path("shared_dir", c.sharedDir));
  MUSTER_CHECK(top.integer("batch_size", c.batchSize, 1));
  MUSTER_CHECK(top.require("checkpoint", c.checkpoint));
  MUSTER_CHECK(top.require("input_path", c.inputPath));
  MUSTER_CHECK(top.require("output_path", c.outputPath));
  MUSTER_CHECK(top.unknown());
  return c;
}

}  // namespace muster::programs
