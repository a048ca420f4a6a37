// The programs' building blocks: configs, SST files, vocabulary, sharding.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>

#include "worker/programs/config.h"
#include "worker/programs/programs.h"
#include "worker/programs/sst_data.h"

namespace muster::programs {
namespace {

namespace fs = std::filesystem;

class Files : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("muster-prog-" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
    return (dir_ / name).string();
  }
  std::string configError(const std::string& json) {
    auto c = loadTrainConfig(write("c.json", json));
    EXPECT_FALSE(c.ok());
    return std::string(c.status().message());
  }
  fs::path dir_;
};

TEST_F(Files, TrainConfigReadsEveryFieldAndResolvesPathsFromItsDirectory) {
  auto c = loadTrainConfig(write("c.json", R"({
    "distributed_world_size": 2, "use_cuda_if_available": true, "train_path": "data/train.tsv",
    "eval_path": "/abs/dev.tsv", "save_path": "out/m.ckpt", "resume": false, "num_threads": 1,
    "model": {"embed_dim": 8, "kernel_num": 4, "kernel_sizes": [2, 3], "dropout": 0.0, "max_seq_len": 10},
    "optimizer": {"type": "sgd", "lr": 0.1, "momentum": 0.9},
    "trainer": {"epochs": 3, "batch_size": 16, "update_cycle": 2, "seed": 7, "bucket_mib": 1}})"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->distributedWorldSize, 2);
  EXPECT_EQ(c->trainPath, (dir_ / "data/train.tsv").string());
  EXPECT_EQ(c->evalPath, "/abs/dev.tsv");
  EXPECT_EQ(c->model.kernelSizes, (std::vector<int>{2, 3}));
  EXPECT_EQ(c->optimizer.type, "sgd");
  EXPECT_EQ(c->trainer.updateCycle, 2);
  EXPECT_EQ(c->trainer.seed, 7u);
}

TEST_F(Files, TrainConfigErrorsNameTheFileAndTheField) {
  EXPECT_NE(configError(R"({"train_path": "t", "trainer": {"batchsize": 4}})").find("c.json: trainer.batchsize is not a known field"), std::string::npos);
  EXPECT_NE(configError(R"({"train_path": "t", "trainer": {"batch_size": "a"}})").find("trainer.batch_size must be an integer >= 1 (got \"a\")"), std::string::npos);
  EXPECT_NE(configError(R"({"model": {}})").find("train_path is required"), std::string::npos);
  EXPECT_NE(configError(R"({"train_path": "t", "optimizer": {"type": "lamb"}})").find("optimizer.type must be adam or sgd"), std::string::npos);
  EXPECT_NE(configError(R"({"train_path": "t", "model": {"kernel_sizes": [3, 9], "max_seq_len": 5}})").find("max_seq_len must be at least the widest kernel (9)"), std::string::npos);
  EXPECT_NE(configError(R"({"train_path": "t",)").find("malformed JSON"), std::string::npos);
  // A number past a double's range is nlohmann's out_of_range, not a parse_error: it ended the
  // worker (std::terminate; found by fuzz/worker_config's campaign).
  EXPECT_NE(configError(R"({"train_path": "t", "trainer": {"seed": 666e666}})").find("c.json: malformed JSON"),
            std::string::npos);
  // A value nested 200,000 deep overflowed the stack (SIGSEGV: a recursive copy and dump()).
  std::string deep = std::string(200000, '[') + std::string(200000, ']');
  EXPECT_NE(configError(R"({"train_path": "t", "distributed_world_size": )" + deep + "}")
                .find("c.json: nested deeper than 32 levels"),
            std::string::npos);
  EXPECT_NE(configError(R"({"train_path": "t", "distributed_world_size": [[1]]})")
                .find("distributed_world_size must be an integer >= 0 (got an array of 1)"),
            std::string::npos);
  // Sizes that LibTorch would abort on are refused before anything is allocated.
  EXPECT_NE(configError(R"({"train_path": "t", "model": {"embed_dim": 1099511627776}})")
                .find("model.embed_dim must be at most 65536 (got 1099511627776)"),
            std::string::npos);
  EXPECT_NE(configError(R"({"train_path": "t", "model": {"embed_dim": 65536, "max_vocab": 100000000}})")
                .find("GiB embedding table"),
            std::string::npos);
  EXPECT_NE(configError(R"({"train_path": "t", "resume": true})").find("resume needs save_path"),
            std::string::npos);
  std::ofstream(dir_ / "afile") << "x";
  EXPECT_NE(configError(R"({"train_path": "t", "save_path": "afile/m.ckpt"})")
                .find("save_path cannot be written: " + (dir_ / "afile").string() + " is not a directory"),
            std::string::npos);
  EXPECT_NE(loadTrainConfig((dir_ / "none.json").string()).status().message().find("cannot read config file"), std::string::npos);
}

TEST_F(Files, TsvErrorsNameTheFileAndTheLine) {
  EXPECT_EQ(readTsv(write("a.tsv", "sentence\tlabel\ngood film\t1\nbad film\t0\n"))->size(), 2u);
  auto noTab = readTsv(write("b.tsv", "sentence\tlabel\nfine\t1\nno tab here\n"));
  EXPECT_NE(noTab.status().message().find("b.tsv:3: expected 'sentence<TAB>label'"), std::string::npos) << noTab.status();
  auto label = readTsv(write("c.tsv", "sentence\tlabel\nx\t2\n"));
  EXPECT_NE(label.status().message().find("c.tsv:2: label '2' is not 0 or 1"), std::string::npos);
  auto header = readTsv(write("d.tsv", "good\t1\n"));
  EXPECT_NE(header.status().message().find("d.tsv:1: expected the header"), std::string::npos);
  EXPECT_EQ(readTsv(write("e.tsv", "sentence\nan unlabelled line\n"), false)->at(0).sentence, "an unlabelled line");
}

TEST(Vocab, BuildsByFrequencyAndRoundTrips) {
  std::vector<Example> data{{"The film, the FILM!", 1}, {"a film", 0}};
  auto v = Vocab::build(data, 1, 100);
  EXPECT_EQ(v.id("film"), 2);  // most frequent first
  EXPECT_EQ(v.id("never-seen"), Vocab::kUnk);
  auto again = Vocab::parse(v.serialize());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->encode("the film !", 5), v.encode("the film !", 5));
  EXPECT_EQ(v.encode("film", 3), (std::vector<int64_t>{2, Vocab::kPad, Vocab::kPad}));
  EXPECT_FALSE(Vocab::parse("x\ny\n").ok());
}

TEST(Sharding, MatchesDistributedSampler) {
  // 10 examples on 4 ranks: padded to 12, every rank 3, together every example at least once.
  std::multiset<int64_t> all;
  for (int r = 0; r < 4; ++r) {
    auto mine = shardIndices(10, 4, r, 5, 2, true);
    EXPECT_EQ(mine.size(), 3u);
    all.insert(mine.begin(), mine.end());
  }
  for (int64_t i = 0; i < 10; ++i) EXPECT_GE(all.count(i), 1u);
  // The same permutation on every rank for an epoch, another one the next epoch.
  EXPECT_NE(shardIndices(10, 1, 0, 5, 2, true), shardIndices(10, 1, 0, 5, 3, true));
  // World 2 is world 1 split in two, interleaved: what makes batch B/2 on 2 ranks equal batch B.
  auto whole = shardIndices(8, 1, 0, 3, 0, true);
  auto r0 = shardIndices(8, 2, 0, 3, 0, true), r1 = shardIndices(8, 2, 1, 3, 0, true);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(r0[i], whole[2 * i]);
    EXPECT_EQ(r1[i], whole[2 * i + 1]);
  }
}

TEST_F(Files, GeneratedDataIsDeterministicAndBalanced) {
  ASSERT_TRUE(generateDataset((dir_ / "a").string(), 200, 20, 20, 3).ok());
  ASSERT_TRUE(generateDataset((dir_ / "b").string(), 200, 20, 20, 3).ok());
  auto a = readTsv((dir_ / "a/train.tsv").string()), b = readTsv((dir_ / "b/train.tsv").string());
  ASSERT_TRUE(a.ok());
  ASSERT_EQ(a->size(), 200u);
  int positive = 0;
  for (size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ((*a)[i].sentence, (*b)[i].sentence);
    positive += (*a)[i].label;
  }
  EXPECT_GT(positive, 60);
  EXPECT_LT(positive, 140);
}

}  // namespace
}  // namespace muster::programs
