// What `worker train` and `worker decode` read from files a user hands them: the JSON configs,
// the SST-2 TSV datasets and the vocabulary beside a checkpoint. Bad input is a status naming the
// file; a config that loads is one the trainer can run (kernels no wider than a sentence, at
// least one class); a vocabulary read back from what it writes is the same.
#include <fuzzer/FuzzedDataProvider.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "worker/programs/config.h"
#include "worker/programs/sst_data.h"

using namespace muster::programs;

namespace {
// The input as a file: a memory file, named through /proc (the loaders take paths).
std::string asFile(const std::string& bytes) {
  static int fd = memfd_create("muster-fuzz-input", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, 0) != 0 || pwrite(fd, bytes.data(), bytes.size(), 0) != static_cast<ssize_t>(bytes.size())) {
    __builtin_trap();
  }
  return "/proc/self/fd/" + std::to_string(fd);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider p(data, size);
  int which = p.ConsumeIntegralInRange(0, 3);
  std::string text = p.ConsumeRemainingBytesAsString();
  switch (which) {
    case 0: {
      auto c = loadTrainConfig(asFile(text));
      if (c.ok()) {
        const auto& m = c->model;
        if (c->trainPath.empty() || m.kernelSizes.empty() || m.numClasses < 1 || m.embedDim < 1 ||
            m.maxSeqLen < *std::max_element(m.kernelSizes.begin(), m.kernelSizes.end())) {
          __builtin_trap();
        }
      }
      break;
    }
    case 1: {
      auto c = loadDecodeConfig(asFile(text));
      if (c.ok() && c->batchSize < 1) __builtin_trap();
      break;
    }
    case 2: {
      for (bool labelled : {true, false}) {
        auto rows = readTsv(asFile(text), labelled);
        if (!rows.ok()) continue;
        for (const auto& e : *rows) {
          if (e.label < -1 || e.label > 1 || (labelled && e.label == -1)) __builtin_trap();
          (void)tokenize(e.sentence);
        }
      }
      break;
    }
    default: {
      auto v = Vocab::parse(text);
      if (!v.ok()) break;
      auto again = Vocab::parse(v->serialize());
      if (!again.ok() || again->size() != v->size() || again->serialize() != v->serialize()) __builtin_trap();
      auto ids = v->encode(text, 32);
      if (ids.size() != 32) __builtin_trap();
      for (auto id : ids) {
        if (id < 0 || id >= v->size()) __builtin_trap();
      }
      break;
    }
  }
  return 0;
}
