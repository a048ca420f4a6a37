// SST-2-format data for the example programs: TSV files (a header line, then
// sentence<TAB>label), a tokenizer, a vocabulary, and a generator of small learnable datasets.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace muster::programs {

struct Example {
  std::string sentence;
  int label = -1;  // -1: unlabelled (decode input)
};

// Reads an SST-2 TSV. Errors name the file and the line: a missing header, a line without a
// tab, a label that is not 0 or 1 (when `labelled`).
absl::StatusOr<std::vector<Example>> readTsv(const std::string& path, bool labelled = true);

// Lower-cased words; punctuation is split off as tokens of its own.
std::vector<std::string> tokenize(const std::string& sentence);

class Vocab {
 public:
  static constexpr int kPad = 0;
  static constexpr int kUnk = 1;

  // Tokens seen at least `minFreq` times, most frequent first (ties alphabetical), at most
  // `maxSize` entries including <pad> and <unk>.
  static Vocab build(const std::vector<Example>& examples, int minFreq, int maxSize);
  // One token per line, as serialize() writes it. Errors: empty, or not starting <pad> <unk>.
  static absl::StatusOr<Vocab> parse(const std::string& text);
  std::string serialize() const;

  int size() const { return static_cast<int>(tokens_.size()); }
  int id(const std::string& token) const;
  // Token ids padded with kPad (or cut) to exactly `length`.
  std::vector<int64_t> encode(const std::string& sentence, int length) const;

 private:
  std::vector<std::string> tokens_;
  std::map<std::string, int> ids_;
};

// Writes train.tsv, dev.tsv and test.tsv (plus test_unlabelled.tsv for decoding) under `dir`:
// sentences of sentiment-bearing and neutral words whose label follows their balance, with a
// little label noise. Deterministic for a seed.
absl::Status generateDataset(const std::string& dir, int train, int dev, int test, uint64_t seed);

}  // namespace muster::programs
