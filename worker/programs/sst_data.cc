// SST data: TSV reading with line-numbered errors, tokenizer, vocabulary, generator.
#include "worker/programs/sst_data.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

namespace muster::programs {

absl::StatusOr<std::vector<Example>> readTsv(const std::string& path, bool labelled) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(fmt::format("cannot read data file {}", path));
  std::vector<Example> out;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (number == 1) {
      if (line.rfind("sentence", 0) != 0) {
        return absl::InvalidArgumentError(fmt::format(
            "{}:1: expected the header 'sentence<TAB>label', got '{}'", path, line.substr(0, 60)));
      }
      continue;
    }
    if (line.empty()) continue;
    Example e;
    auto tab = line.rfind('\t');
    if (!labelled) {
      e.sentence = tab == std::string::npos ? line : line.substr(0, tab);
    } else {
      if (tab == std::string::npos) {
        return absl::InvalidArgumentError(fmt::format(
            "{}:{}: expected 'sentence<TAB>label', found no tab", path, number));
      }
      e.sentence = line.substr(0, tab);
      std::string label = line.substr(tab + 1);
      if (label != "0" && label != "1") {
        return absl::InvalidArgumentError(
            fmt::format("{}:{}: label '{}' is not 0 or 1", path, number, label));
      }
      e.label = label[0] - '0';
    }
    out.push_back(std::move(e));
  }
  if (number == 0) return absl::InvalidArgumentError(fmt::format("{} is empty", path));
  return out;
}

std::vector<std::string> tokenize(const std::string& sentence) {
  std::vector<std::string> out;
  std::string cur;
  for (unsigned char c : sentence) {
    if (std::isalnum(c) || c == '\'' || c >= 0x80) {
      cur += static_cast<char>(std::tolower(c));
    } else {
      if (!cur.empty()) out.push_back(std::move(cur));
      cur.clear();
      if (!std::isspace(c)) out.emplace_back(1, static_cast<char>(c));
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

Vocab Vocab::build(const std::vector<Example>& examples, int minFreq, int maxSize) {
  std::map<std::string, int64_t> counts;
  for (const auto& e : examples) {
    for (auto& t : tokenize(e.sentence)) ++counts[t];
  }
  std::vector<std::pair<std::string, int64_t>> sorted(counts.begin(), counts.end());
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  Vocab v;
  v.tokens_ = {"<pad>", "<unk>"};
  for (const auto& [token, count] : sorted) {
    if (count < minFreq || v.size() >= maxSize) break;
    v.tokens_.push_back(token);
  }
  for (int i = 0; i < v.size(); ++i) v.ids_[v.tokens_[i]] = i;
  return v;
}

absl::StatusOr<Vocab> Vocab::parse(const std::string& text) {
  Vocab v;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) v.tokens_.push_back(line);
  if (v.tokens_.size() < 2 || v.tokens_[0] != "<pad>" || v.tokens_[1] != "<unk>") {
    return absl::DataLossError("the vocabulary does not start with <pad> and <unk>");
  }
  for (int i = 0; i < v.size(); ++i) v.ids_[v.tokens_[i]] = i;
  return v;
}

std::string Vocab::serialize() const {
  std::string out;
  for (const auto& t : tokens_) out += t + "\n";
  return out;
}

int Vocab::id(const std::string& token) const {
  auto it = ids_.find(token);
  return it == ids_.end() ? kUnk : it->second;
}

std::vector<int64_t> Vocab::encode(const std::string& sentence, int length) const {
  std::vector<int64_t> ids(static_cast<size_t>(length), kPad);
  auto tokens = tokenize(sentence);
  for (size_t i = 0; i < tokens.size() && i < ids.size(); ++i) ids[i] = id(tokens[i]);
  return ids;
}

absl::Status generateDataset(const std::string& dir, int train, int dev, int test, uint64_t seed) {
  static const std::vector<std::string> kGood = {
      "wonderful", "moving", "brilliant", "charming", "delightful", "gripping", "superb",
      "heartfelt", "funny", "beautiful", "clever", "warm", "engaging", "fresh", "stunning"};
  static const std::vector<std::string> kBad = {
      "dull", "tedious", "clumsy", "boring", "lifeless", "awful", "bland", "messy",
      "predictable", "shallow", "tiresome", "flat", "forgettable", "grating", "weak"};
  static const std::vector<std::string> kNeutral = {
      "the", "film", "a", "story", "of", "its", "cast", "and", "director", "plot", "this",
      "movie", "is", "with", "an", "ending", "script", "scenes", "characters", "performance",
      "music", "pace", "it", "feels", "at", "times", "by", "turns", "yet", "often"};
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(fmt::format("cannot create {}: {}", dir, ec.message()));
  std::mt19937_64 rng(seed);
  auto pick = [&](const std::vector<std::string>& words) {
    return words[std::uniform_int_distribution<size_t>(0, words.size() - 1)(rng)];
  };
  auto write = [&](const std::string& name, int n, bool labelled) -> absl::Status {
    std::ofstream out(std::filesystem::path(dir) / name);
    out << (labelled ? "sentence\tlabel\n" : "sentence\n");
    for (int i = 0; i < n; ++i) {
      int label = static_cast<int>(rng() % 2);
      int length = 6 + static_cast<int>(rng() % 14);
      int strong = 1 + static_cast<int>(rng() % 3);
      int weak = static_cast<int>(rng() % strong);
      std::vector<std::string> words;
      for (int k = 0; k < strong; ++k) words.push_back(pick(label ? kGood : kBad));
      for (int k = 0; k < weak; ++k) words.push_back(pick(label ? kBad : kGood));
      while (static_cast<int>(words.size()) < length) words.push_back(pick(kNeutral));
      std::shuffle(words.begin(), words.end(), rng);
      if (rng() % 20 == 0) label = 1 - label;  // 5% label noise
      std::string sentence;
      for (const auto& w : words) sentence += (sentence.empty() ? "" : " ") + w;
      sentence += rng() % 2 ? " ." : " !";
      out << sentence;
      if (labelled) out << '\t' << label;
      out << '\n';
    }
    return out ? absl::OkStatus() : absl::InternalError(fmt::format("cannot write {}/{}", dir, name));
  };
  for (auto [name, n, labelled] : {std::tuple{"train.tsv", train, true},
                                   std::tuple{"dev.tsv", dev, true},
                                   std::tuple{"test.tsv", test, true},
                                   std::tuple{"test_unlabelled.tsv", test, false}}) {
    if (auto s = write(name, n, labelled); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace muster::programs
