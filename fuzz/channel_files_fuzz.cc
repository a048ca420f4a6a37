// The shared-dir channel's files (worker/shared_dir_channel.h) as a receiving rank maps them:
// any bytes in the file a sender announced, with the announcement its own header makes, and
// (chosen by the input) the header's and the payload's checksums made right, as a forger or a
// foreign writer would. recv() and recvBytes() give what the header says, of exactly the
// announced length, or an error status; they never throw and never make a tensor that reaches
// past the file.
#include <fuzzer/FuzzedDataProvider.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <fmt/format.h>

#include "common/log.h"
#include "rendezvous/store/local_store.h"
#include "rendezvous/store/memory_store.h"
#include "worker/c10d_store.h"
#include "worker/shared_dir_channel.h"

namespace fs = std::filesystem;
using namespace muster;

namespace {

constexpr size_t kHeader = 64;

struct Rank {
  std::string dir;
  c10::intrusive_ptr<worker::C10dStore> store;
  std::unique_ptr<worker::SharedDirChannel> channel;
  std::map<std::string, uint64_t> sequence;  // per stream, as the channel counts its receives
  ~Rank() {
    channel.reset();
    std::error_code ignored;
    fs::remove_all(dir, ignored);
  }
};

Rank* instance = nullptr;

Rank& rank() {
  static Rank* r = [] {
    auto* r = instance = new Rank;
    r->dir = fmt::format("/dev/shm/muster-channel-fuzz-{}", getpid());
    fs::create_directories(r->dir);
    auto memory = std::make_shared<rendezvous::MemoryStore>();
    r->store = c10::make_intrusive<worker::C10dStore>(std::make_shared<rendezvous::LocalStore>(memory, "job/0"),
                                                      std::chrono::milliseconds(10));
    worker::WorkerEnv env;
    env.rank = env.localRank = 0;
    env.worldSize = env.localWorldSize = 1;
    env.runId = env.jobId = "job";
    env.sharedDir = r->dir;
    auto c = worker::SharedDirChannel::create(env, r->store, {.dir = r->dir, .timeout = Millis(10)});
    if (!c.ok()) {
      fmt::print(stderr, "channel_files: {}\n", c.status().ToString());
      std::abort();
    }
    r->channel = std::move(*c);
    std::atexit([] { delete instance; });
    return r;
  }();
  return *r;
}

template <typename T>
T field(const std::string& file, size_t offset) {
  T v{};
  if (file.size() >= offset + sizeof(T)) std::memcpy(&v, file.data() + offset, sizeof(T));
  return v;
}

// The checksums a writer of the format computes: the payload's (after headerBytes) into the
// header, then the header's own over its headerBytes with that field zero.
void fixChecksums(std::string& file) {
  if (file.size() < kHeader) return;
  uint64_t headerBytes = std::min<uint64_t>(field<uint32_t>(file, 52), file.size());
  if (headerBytes < kHeader) return;
  uint64_t payload = XXH3_64bits(file.data() + headerBytes, file.size() - headerBytes);
  std::memcpy(file.data() + 32, &payload, 8);
  std::memset(file.data() + 56, 0, 8);
  uint64_t own = XXH3_64bits(file.data(), headerBytes);
  std::memcpy(file.data() + 56, &own, 8);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  log::setLevel("off");
  (void)rank();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Rank& r = rank();
  FuzzedDataProvider p(data, size);
  bool fix = p.ConsumeBool(), bytes = p.ConsumeBool();
  std::string file = p.ConsumeRemainingBytesAsString();
  if (fix) fixChecksums(file);
  std::string stream = bytes ? "p2pb" : "p2p";
  std::string name = fmt::format("{}.0.0.0.{}", stream, r.sequence[stream]++);
  std::string path = r.channel->roundDir() + "/" + name + ".mt";
  std::ofstream(path, std::ios::binary).write(file.data(), static_cast<std::streamsize>(file.size()));
  auto payloadBytes = field<uint64_t>(file, 24);
  std::string announcement = fmt::format("{}|{:016x}|{}|{:016x}|1", path, field<uint64_t>(file, 16), payloadBytes,
                                         field<uint64_t>(file, 32));
  r.store->set("muster/chan/ann/" + name, std::vector<uint8_t>(announcement.begin(), announcement.end()));
  // What a received payload must be: the announced bytes, all inside the file.
  auto whole = [&](uint64_t got) {
    uint64_t headerBytes = field<uint32_t>(file, 52);
    if (got != payloadBytes || headerBytes + got != file.size()) __builtin_trap();
  };
  try {
    if (bytes) {
      auto text = r.channel->recvBytes(0);
      if (text.ok()) whole(text->size());
    } else if (auto t = r.channel->recv(0); t.ok()) {
      whole(static_cast<uint64_t>(t->numel()) * t->element_size());
      // Every byte read: past the mapping would fault.
      const auto* at = static_cast<const unsigned char*>(t->data_ptr());
      unsigned sum = 0;
      for (uint64_t i = 0, n = static_cast<uint64_t>(t->numel()) * t->element_size(); i < n; ++i) sum += at[i];
      asm volatile("" : : "r"(sum));  // kept: the reads are the check
    }
  } catch (...) {
    __builtin_trap();  // an exception out of recv is a crash of the rank that called it
  }
  r.store->deleteKey("muster/chan/ann/" + name);
  r.store->deleteKey("muster/chan/done/" + name);
  ::unlink(path.c_str());
  return 0;
}
