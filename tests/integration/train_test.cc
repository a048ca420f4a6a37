// worker train and worker decode as real processes under launch: equivalence of world sizes,
// update_cycle, byte-identical decoding, resume, accuracy, and clear config errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "tests/support/child.h"
#include "tests/support/programs.h"
#include "worker/process_group.h"
#include "worker/programs/docnn.h"
#include "worker/programs/sst_data.h"

namespace muster {
namespace {

using testing::launchPath;
using testing::workerPath;
using testing::Child;
namespace fs = std::filesystem;
constexpr std::chrono::milliseconds kRun{300000};


class Train : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = fs::temp_directory_path() / ("muster-train-data-" + std::to_string(getpid()));
    ASSERT_TRUE(programs::generateDataset(data_.string(), 1600, 200, 200, 11).ok());
  }
  static void TearDownTestSuite() { fs::remove_all(data_); }
  void SetUp() override {
    dir_ = muster::testing::freshTestDir("muster-train");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A training config: deterministic (no dropout, SGD) unless told otherwise.
  std::string config(const std::string& name, int batch, int updateCycle, int epochs,
                     const std::string& extra = "", const std::string& optimizer = "sgd") {
    fs::path p = dir_ / (name + ".json");
    std::ofstream(p) << "{\"train_path\": \"" << (data_ / "train.tsv").string() << "\", "
                     << "\"eval_path\": \"" << (data_ / "dev.tsv").string() << "\", "
                     << "\"save_path\": \"" << (dir_ / (name + ".ckpt")).string() << "\", "
                     << "\"resume\": true, " << extra
                     << "\"model\": {\"embed_dim\": 16, \"kernel_num\": 8, \"kernel_sizes\": [2, 3], "
                     << "\"dropout\": 0.0, \"max_seq_len\": 24}, "
                     << "\"optimizer\": {\"type\": \"" << optimizer << "\", \"lr\": "
                     << (optimizer == "sgd" ? "0.2" : "0.01") << "}, "
                     << "\"trainer\": {\"epochs\": " << epochs << ", \"batch_size\": " << batch
                     << ", \"update_cycle\": " << updateCycle << ", \"seed\": 3}}";
    return p.string();
  }
  testing::ExitStatus run(int nproc, const std::vector<std::string>& args, std::string* err = nullptr) {
    std::vector<std::string> argv{launchPath(), "--nproc_per_node=" + std::to_string(nproc),
                                  "--master_port=0", workerPath()};
    argv.insert(argv.end(), args.begin(), args.end());
    Child c(argv);
    auto exit = c.wait(kRun);
    if (err) *err = c.stderrText();
    EXPECT_TRUE(exit.has_value());
    return exit.value_or(testing::ExitStatus{});
  }
  std::vector<torch::Tensor> params(const std::string& name) {
    std::string path = (dir_ / (name + ".ckpt")).string();
    auto meta = programs::readCheckpointMeta(path);
    EXPECT_TRUE(meta.ok()) << meta.status();
    programs::DocNN model(programs::Vocab::parse(meta->vocab)->size(), meta->model);
    EXPECT_TRUE(programs::loadCheckpoint(path, model, nullptr).ok());
    return model->parameters();
  }
  void expectSameParameters(const std::string& a, const std::string& b) {
    auto pa = params(a), pb = params(b);
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
      EXPECT_TRUE(torch::allclose(pa[i], pb[i], 1e-4, 1e-5))
          << "parameter " << i << " differs by " << (pa[i] - pb[i]).abs().max().item<float>();
    }
  }

  static fs::path data_;
  fs::path dir_;
};
fs::path Train::data_;

TEST_F(Train, TwoRanksWithHalfTheBatchEndWhereOneRankWithTheWholeBatchEnds) {
  std::string err;
  ASSERT_EQ(run(1, {"train", "--config", config("one", 16, 1, 2)}, &err).code, 0) << err;
  ASSERT_EQ(run(2, {"train", "--config", config("two", 8, 1, 2)}, &err).code, 0) << err;
  expectSameParameters("one", "two");
  // And they did move: not the initial parameters.
  ASSERT_EQ(run(1, {"train", "--config", config("brief", 16, 1, 1)}, &err).code, 0) << err;
  auto one = params("one"), brief = params("brief");
  EXPECT_FALSE(torch::allclose(one[0], brief[0]));
}

TEST_F(Train, UpdateCycleOfTwoHalfBatchesEqualsOneWholeBatch) {
  std::string err;
  ASSERT_EQ(run(1, {"train", "--config", config("whole", 16, 1, 1)}, &err).code, 0) << err;
  ASSERT_EQ(run(1, {"train", "--config", config("cycled", 8, 2, 1)}, &err).code, 0) << err;
  expectSameParameters("whole", "cycled");
}

TEST_F(Train, AccuracyRisesAndDecodingIsByteIdenticalForOneTwoAndFourRanks) {
  std::string err;
  std::string cfg = config("model", 16, 1, 4, "\"test_path\": \"" + (data_ / "test.tsv").string() + "\", ", "adam");
  Child c({launchPath(), "--nproc_per_node=2", "--master_port=0", workerPath(), "train", "--config", cfg});
  auto exit = c.wait(kRun);
  ASSERT_EQ(exit->code, 0) << c.stderrText();
  std::string log = c.stderrText();
  std::vector<double> accuracy;
  const std::regex evalLine(R"(eval accuracy ([0-9.]+))");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), evalLine);
       it != std::sregex_iterator(); ++it) {
    accuracy.push_back(std::stod((*it)[1]));
  }
  ASSERT_EQ(accuracy.size(), 4u) << log;
  EXPECT_GT(accuracy.back(), accuracy.front()) << log;
  EXPECT_GT(accuracy.back(), 0.75) << log;
  EXPECT_NE(log.find("test: loss"), std::string::npos);

  std::vector<std::string> outputs;
  for (int n : {1, 2, 4}) {
    fs::path out = dir_ / ("pred" + std::to_string(n) + ".tsv");
    fs::path dc = dir_ / ("decode" + std::to_string(n) + ".json");
    std::ofstream(dc) << "{\"checkpoint\": \"" << (dir_ / "model.ckpt").string() << "\", \"input_path\": \""
                      << (data_ / "test_unlabelled.tsv").string() << "\", \"output_path\": \""
                      << out.string() << "\", \"batch_size\": 16}";
    ASSERT_EQ(run(n, {"decode", "--config", dc.string()}, &err).code, 0) << err;
    std::ifstream in(out);
    outputs.emplace_back((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  EXPECT_EQ(std::count(outputs[0].begin(), outputs[0].end(), '\n'), 201);
  EXPECT_EQ(outputs[0], outputs[1]) << "world size 2 decoded differently from 1";
  EXPECT_EQ(outputs[0], outputs[2]) << "world size 4 decoded differently from 1";
}

TEST_F(Train, ResumesFromTheCheckpoint) {
  std::string err;
  ASSERT_EQ(run(2, {"train", "--config", config("r", 16, 1, 2)}, &err).code, 0) << err;
  ASSERT_EQ(run(2, {"train", "--config", config("r", 16, 1, 3)}, &err).code, 0) << err;
  EXPECT_NE(err.find("resumed from " + (dir_ / "r.ckpt").string() + " after epoch 2"), std::string::npos) << err;
  EXPECT_NE(err.find("trained 1 epoch(s)"), std::string::npos) << err;
}

TEST_F(Train, WorldSizeThatDisagreesWithTheConfigIsOneClearLine) {
  std::string err;
  auto exit = run(2, {"train", "--config", config("w", 16, 1, 1, "\"distributed_world_size\": 3, ")}, &err);
  EXPECT_EQ(exit.code, 1);  // launch reports the workers' exit code 2 as a failure
  EXPECT_NE(err.find("distributed_world_size is 3 but launch started 2 ranks"), std::string::npos) << err;
}

// Inputs that used to fail late (after an epoch, with a LibTorch stack) or not at all are
// refused before training starts, naming the field.
TEST_F(Train, BadInputsAreRefusedBeforeTrainingStarts) {
  std::ofstream(dir_ / "empty.tsv") << "sentence\tlabel\n";
  fs::path p = dir_ / "empty.json";
  std::ofstream(p) << "{\"train_path\": \"" << (dir_ / "empty.tsv").string() << "\"}";
  Child empty({workerPath(), "train", "--config", p.string()});
  EXPECT_EQ(empty.wait(kRun)->code, 2);
  EXPECT_NE(empty.stderrText().find("holds no examples"), std::string::npos) << empty.stderrText();
  // A checkpoint that cannot be written fails now, on every rank, not after the first epoch.
  std::ofstream(dir_ / "afile") << "not a directory";
  fs::path q = dir_ / "nosave.json";
  std::ofstream(q) << "{\"train_path\": \"" << (data_ / "train.tsv").string() << "\", \"save_path\": \""
                   << (dir_ / "afile" / "m.ckpt").string() << "\"}";
  std::string err;
  auto exit = run(2, {"train", "--config", q.string()}, &err);
  EXPECT_EQ(exit.code, 1);
  EXPECT_NE(err.find("save_path cannot be written: " + (dir_ / "afile").string() + " is not a directory"),
            std::string::npos)
      << err;
  EXPECT_EQ(err.find("epoch"), std::string::npos) << "no training started: " << err;
}

// --backend: an unknown name is refused by the flag; nccl where this build has no
// ProcessGroupNCCL (Debian's LibTorch has no CUDA) is one line naming the cause, before any
// training, in worker train and in the self-check alike.
TEST_F(Train, BackendsThisBuildLacksAreOneClearLine) {
  std::string cfg = config("backend", 16, 1, 1);
  std::string err;
  auto bogus = run(1, {"train", "--config", cfg, "--backend", "mpi"}, &err);
  EXPECT_EQ(bogus.code, 1) << "launch's summary of a rank that exited 2: " << err;
  EXPECT_NE(err.find("--backend: mpi not in {gloo,nccl,auto}"), std::string::npos) << err;
  if (worker::kHaveTorchNccl) GTEST_SKIP() << "this build has ProcessGroupNCCL";
  auto nccl = run(1, {"train", "--config", cfg, "--backend", "nccl"}, &err);
  EXPECT_EQ(nccl.code, 1);
  EXPECT_NE(err.find("backend nccl: this LibTorch was built without CUDA"), std::string::npos) << err;
  EXPECT_EQ(err.find("epoch"), std::string::npos) << "no training started: " << err;
  auto check = run(1, {"--backend", "nccl"}, &err);
  EXPECT_EQ(check.code, 1);
  EXPECT_NE(err.find("backend nccl: this LibTorch was built without CUDA"), std::string::npos) << err;
}

TEST_F(Train, MalformedDataLineIsNamedByFileAndLine) {
  std::ofstream(dir_ / "bad.tsv") << "sentence\tlabel\nfine\t1\nbroken line\n";
  fs::path p = dir_ / "bad.json";
  std::ofstream(p) << "{\"train_path\": \"" << (dir_ / "bad.tsv").string() << "\"}";
  Child c({workerPath(), "train", "--config", p.string()});
  auto exit = c.wait(kRun);
  EXPECT_EQ(exit->code, 2);
  EXPECT_NE(c.stderrText().find("bad.tsv:3: expected 'sentence<TAB>label'"), std::string::npos) << c.stderrText();
}

}  // namespace
}  // namespace muster
