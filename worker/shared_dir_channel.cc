// SharedDirChannel: files written under a temporary name, renamed, announced in the store;
// read by mapping, checked against the announcement and the header's checksum.
#include "worker/shared_dir_channel.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

#include "common/contract.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace muster::worker {
namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'M', 'U', 'S', 'T', 'R', 'C', 'H', '1'};
// 2: the header carries a checksum of its own (the 64 bytes and the shape after them).
constexpr uint32_t kVersion = 2;
constexpr uint32_t kMaxDims = 64;
constexpr size_t kChunk = 8u << 20;
enum Kind : uint32_t { kTensor = 1, kBytes = 2 };

// On disk, little-endian, 64 bytes, followed by int64 shape[ndim], padded to 64 bytes.
struct FileHeader {
  char magic[8];
  uint32_t version;
  uint32_t kind;
  uint64_t transferId;
  uint64_t payloadBytes;
  uint64_t checksum;
  int32_t dtype;
  uint32_t ndim;
  int32_t srcRank;
  uint32_t headerBytes;
  uint64_t headerChecksum;  // XXH3 of the header region with this field zero
};
static_assert(sizeof(FileHeader) == 64, "the header is 64 bytes on disk");

uint64_t randomId() {
  static thread_local std::mt19937_64 rng{std::random_device{}() ^
                                          (static_cast<uint64_t>(getpid()) << 32)};
  return rng();
}

std::string annKey(const std::string& name) { return "muster/chan/ann/" + name; }
std::string doneKey(const std::string& name) { return "muster/chan/done/" + name; }
// Set by the sender before it writes: "-" (wait for the announcement), or, from the Python
// package for a large payload on one node, "S|<temporary file>|<header bytes>|<payload
// bytes>|<segment bytes>" with part keys "muster/chan/part/<name>/<k>" as segments land, so
// that its receivers check a segment while the next is written. This library's receivers
// wait for the announcement alone, and the last one deletes these keys too.
std::string earlyKey(const std::string& name) { return "muster/chan/early/" + name; }
std::string partKey(const std::string& name, uint64_t k) {
  return fmt::format("muster/chan/part/{}/{}", name, k);
}

std::vector<uint8_t> bytesOf(const std::string& s) { return {s.begin(), s.end()}; }
std::string textOf(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

struct Mapping {
  void* base = nullptr;
  size_t length = 0;
  ~Mapping() {
    if (base != nullptr) munmap(base, length);
  }
};

absl::Status errnoStatus(int err, const std::string& what) {
  auto code = err == ENOSPC || err == EDQUOT ? absl::StatusCode::kResourceExhausted
                                             : absl::StatusCode::kInternal;
  return absl::Status(code, fmt::format("{}: {}", what, std::strerror(err)));
}

bool writeAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

struct SharedDirChannel::Payload {
  Kind kind = kBytes;
  at::ScalarType dtype = at::kByte;
  std::vector<int64_t> shape;
  const char* data = nullptr;
  uint64_t bytes = 0;

  static Payload ofTensor(const at::Tensor& contiguous) {
    Payload p;
    p.kind = kTensor;
    p.dtype = contiguous.scalar_type();
    p.shape = contiguous.sizes().vec();
    p.data = static_cast<const char*>(contiguous.data_ptr());
    p.bytes = contiguous.numel() * contiguous.element_size();
    return p;
  }
  static Payload ofBytes(std::string_view bytes) {
    Payload p;
    p.data = bytes.data();
    p.bytes = bytes.size();
    p.shape = {static_cast<int64_t>(bytes.size())};
    return p;
  }
};

struct SharedDirChannel::Received {
  std::shared_ptr<Mapping> mapping;
  const char* data = nullptr;
  uint64_t bytes = 0;
  Kind kind = kBytes;
  at::ScalarType dtype = at::kByte;
  std::vector<int64_t> shape;

  at::Tensor tensor() const {
    auto options = at::TensorOptions().dtype(dtype);
    if (bytes == 0) return at::empty(shape, options);
    auto keep = mapping;
    // The tensor owns the mapping: it stays valid after the file is deleted.
    return at::from_blob(const_cast<char*>(data), shape, [keep](void*) {}, options);
  }
  std::string text() const { return std::string(data, bytes); }
};

SharedDirChannel::SharedDirChannel(WorkerEnv env, c10::intrusive_ptr<c10d::Store> store,
                                   ChannelOptions options, std::string roundDir)
    : env_(std::move(env)),
      store_(std::move(store)),
      options_(std::move(options)),
      roundDir_(std::move(roundDir)) {}

absl::StatusOr<std::unique_ptr<SharedDirChannel>> SharedDirChannel::create(
    const WorkerEnv& env, c10::intrusive_ptr<c10d::Store> store, ChannelOptions options) {
  if (options.dir.empty()) options.dir = env.sharedDir;
  bool own = false;
  if (options.dir.empty() && env.worldSize == 1) {
    // A world of one, not started by launch: a private directory, removed with the channel.
    options.dir = (fs::temp_directory_path() / fmt::format("muster-channel-{}", getpid())).string();
    own = true;
  }
  if (options.dir.empty() && env.groupWorldSize > 1) {
    return absl::FailedPreconditionError(fmt::format(
        "rank {}: no shared directory: this job spans {} nodes and launch was given no "
        "--shared_dir; give every node's launch --shared_dir DIR on a filesystem they all "
        "share (NFS), or pass ChannelOptions::dir",
        env.rank, env.groupWorldSize));
  }
  if (options.dir.empty()) {
    return absl::FailedPreconditionError(
        "no shared directory: MUSTER_SHARED_DIR is not set (start the program with launch, or "
        "pass ChannelOptions::dir)");
  }
  fs::path jobDir = fs::path(options.dir) / (env.jobId.empty() ? env.runId : env.jobId);
  fs::path roundDir = contract::roundDirectory(options.dir, env.jobId.empty() ? env.runId : env.jobId, env.round);
  std::error_code ec;
  fs::create_directories(roundDir, ec);
  if (ec) {
    return absl::FailedPreconditionError(fmt::format(
        "rank {}: cannot create the channel directory {}: {}", env.rank, roundDir.string(),
        ec.message()));
  }
  if (env.localRank == 0) {
    // Leftovers of dead rounds go when a new round starts.
    for (const auto& entry : fs::directory_iterator(jobDir, ec)) {
      std::string name = entry.path().filename().string();
      if (name.find_first_not_of("0123456789") == std::string::npos &&
          std::stoll(name) < env.round) {
        fs::remove_all(entry.path(), ec);
      }
    }
  }
  std::unique_ptr<SharedDirChannel> channel(
      new SharedDirChannel(env, std::move(store), std::move(options), roundDir.string()));
  if (own) channel->ownedDir_ = channel->options_.dir;
  if (auto s = channel->probe(); !s.ok()) return s;
  return channel;
}

SharedDirChannel::~SharedDirChannel() {
  if (!ownedDir_.empty()) {
    std::error_code ec;
    fs::remove_all(ownedDir_, ec);
  }
}

absl::Status SharedDirChannel::probe() {
  if (env_.worldSize == 1) return absl::OkStatus();
  Millis timeout = options_.startTimeout.count() > 0 ? options_.startTimeout : options_.timeout;
  std::string path = (fs::path(roundDir_) / ".probe").string();
  try {
    if (env_.rank == 0) {
      std::string nonce = fmt::format("{:016x}", randomId());
      std::string tmp = path + fmt::format(".{}.tmp", getpid());
      int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0 || !writeAll(fd, nonce.data(), nonce.size()) || close(fd) != 0 ||
          rename(tmp.c_str(), path.c_str()) != 0) {
        return errnoStatus(errno, fmt::format("rank 0: writing the probe file {}", path));
      }
      store_->set("muster/chan/probe", bytesOf(nonce));
    }
    store_->wait({"muster/chan/probe"}, timeout);
    std::string nonce = textOf(store_->get("muster/chan/probe"));
    std::string seen;
    {
      int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd >= 0) {
        char buf[64] = {};
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n > 0) seen.assign(buf, static_cast<size_t>(n));
        close(fd);
      }
    }
    store_->set(fmt::format("muster/chan/probe/{}", env_.rank), bytesOf(seen == nonce ? "ok" : "no"));
    std::vector<std::string> keys;
    for (int r = 0; r < env_.worldSize; ++r) keys.push_back(fmt::format("muster/chan/probe/{}", r));
    store_->wait(keys, timeout);
    std::vector<int> blind;
    for (int r = 0; r < env_.worldSize; ++r) {
      if (textOf(store_->get(keys[r])) != "ok") blind.push_back(r);
    }
    if (store_->add("muster/chan/probe/done", 1) == env_.worldSize) unlink(path.c_str());
    if (!blind.empty()) {
      std::string list;
      for (size_t i = 0; i < blind.size(); ++i) list += (i ? ", " : "") + std::to_string(blind[i]);
      return absl::FailedPreconditionError(fmt::format(
          "the shared directory {} is not shared by every rank: rank{} {} cannot see {} written "
          "by rank 0 (is it local to each node? give launch --shared_dir a path on a shared "
          "filesystem)",
          options_.dir, blind.size() > 1 ? "s" : "", list, path));
    }
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return absl::DeadlineExceededError(fmt::format(
        "rank {}: checking that {} is shared failed: {}", env_.rank, options_.dir,
        std::string(e.what()).substr(0, std::string(e.what()).find('\n'))));
  }
}

std::string SharedDirChannel::nextName(const std::string& stream, char direction) {
  // Sends and receives count apart: a rank that sends to itself must match its own sends.
  return fmt::format("{}.{}", stream, sequence_[direction + stream]++);
}

absl::Status SharedDirChannel::publish(const std::string& name, const Payload& p, int receivers) {
  std::string path = (fs::path(roundDir_) / (name + ".mt")).string();
  std::string tmp = (fs::path(roundDir_) / fmt::format(".{}.{}.tmp", name, getpid())).string();
  try {
    store_->set(earlyKey(name), bytesOf("-"));
  } catch (const std::exception& e) {
    return absl::UnavailableError(fmt::format("rank {}: starting {}: {}", env_.rank, path, e.what()));
  }
  auto announceError = [&](const absl::Status& s) {
    try {
      store_->set(annKey(name), bytesOf(fmt::format("ERROR|{}|{}", static_cast<int>(s.code()),
                                                    std::string(s.message()))));
    } catch (const std::exception&) {
    }
    return s;
  };
  if (p.shape.size() > kMaxDims) {
    return announceError(absl::InvalidArgumentError(
        fmt::format("rank {}: a tensor of {} dimensions is more than {}", env_.rank, p.shape.size(), kMaxDims)));
  }
  FileHeader h{};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.version = kVersion;
  h.kind = p.kind;
  h.transferId = randomId();
  h.payloadBytes = p.bytes;
  h.dtype = static_cast<int32_t>(p.dtype);
  h.ndim = static_cast<uint32_t>(p.shape.size());
  h.srcRank = env_.rank;
  h.headerBytes = static_cast<uint32_t>((sizeof(FileHeader) + 8 * p.shape.size() + 63) / 64 * 64);
  std::string head(h.headerBytes, '\0');

  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return announceError(errnoStatus(errno, fmt::format("rank {}: creating {}", env_.rank, tmp)));
  bool ok = writeAll(fd, head.data(), head.size());
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  for (uint64_t off = 0; ok && off < p.bytes; off += kChunk) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, p.bytes - off));
    XXH3_64bits_update(state, p.data + off, n);
    ok = writeAll(fd, p.data + off, n);
  }
  h.checksum = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  std::memcpy(head.data(), &h, sizeof(h));
  // A 0-dim tensor's shape is empty, and its data() may be null, which memcpy may not take
  // even for no bytes (UBSan, tests/sanitize.sh).
  if (!p.shape.empty()) std::memcpy(head.data() + sizeof(h), p.shape.data(), 8 * p.shape.size());
  h.headerChecksum = XXH3_64bits(head.data(), head.size());
  std::memcpy(head.data(), &h, sizeof(h));
  ok = ok && pwrite(fd, head.data(), head.size(), 0) == static_cast<ssize_t>(head.size());
  int err = errno;
  if (close(fd) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
    if (ok) err = errno;
    unlink(tmp.c_str());
    return announceError(errnoStatus(
        err, fmt::format("rank {}: writing {} ({} bytes)", env_.rank, path, p.bytes)));
  }
  try {
    store_->set(annKey(name), bytesOf(fmt::format("{}|{:016x}|{}|{:016x}|{}", path, h.transferId,
                                                  p.bytes, h.checksum, receivers)));
  } catch (const std::exception& e) {
    unlink(path.c_str());
    return absl::UnavailableError(fmt::format("rank {}: announcing {}: {}", env_.rank, path, e.what()));
  }
  return absl::OkStatus();
}

absl::StatusOr<SharedDirChannel::Received> SharedDirChannel::fetch(const std::string& name, int src) {
  std::string expectedPath = (fs::path(roundDir_) / (name + ".mt")).string();
  std::string announcement;
  try {
    store_->wait({annKey(name)}, options_.timeout);
    announcement = textOf(store_->get(annKey(name)));
  } catch (const std::exception& e) {
    return absl::DeadlineExceededError(fmt::format(
        "rank {} did not announce {} within {:.1f} s (rank {} waiting)", src, expectedPath,
        options_.timeout.count() / 1000.0, env_.rank));
  }
  std::vector<std::string> f = absl::StrSplit(announcement, absl::MaxSplits('|', 4));
  auto malformed = [&] {
    return absl::DataLossError(fmt::format("the announcement of {} by rank {} is malformed: '{}'",
                                           expectedPath, src, announcement));
  };
  if (f.size() >= 3 && f[0] == "ERROR") {
    int code = 0;
    if (!absl::SimpleAtoi(f[1], &code) || code <= 0 || code > 16) return malformed();
    return absl::Status(static_cast<absl::StatusCode>(code),
                        fmt::format("rank {} could not send {}: {}", src, expectedPath, f[2]));
  }
  if (f.size() != 5) return malformed();
  const std::string& path = f[0];
  uint64_t transferId = 0, bytes = 0, checksum = 0;
  int receivers = 0;
  if (!absl::SimpleHexAtoi(f[1], &transferId) || !absl::SimpleAtoi(f[2], &bytes) ||
      !absl::SimpleHexAtoi(f[3], &checksum) || !absl::SimpleAtoi(f[4], &receivers) || receivers < 1) {
    return malformed();
  }
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(fmt::format("{} from rank {}: {}", path, src, why));
  };

  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return bad(fmt::format("cannot open it: {}", std::strerror(errno)));
  struct stat st {};
  fstat(fd, &st);
  auto size = static_cast<uint64_t>(st.st_size);
  if (size < sizeof(FileHeader)) {
    close(fd);
    return bad(fmt::format("truncated: {} bytes, not even a header", size));
  }
  auto mapping = std::make_shared<Mapping>();
  mapping->length = size;
  // A private, writable mapping: the received tensor is an ordinary tensor that in-place ops
  // may change (copy on write, page by page); the file and the other receivers never see it.
  mapping->base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  close(fd);
  if (mapping->base == MAP_FAILED) {
    mapping->base = nullptr;
    return bad(fmt::format("cannot map it: {}", std::strerror(errno)));
  }
  // Map every page at once, read-only until written: far cheaper than a fault per 4 KiB.
  // (MAP_POPULATE would copy every page of a writable private mapping.)
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
  if (madvise(mapping->base, size, MADV_POPULATE_READ) != 0) madvise(mapping->base, size, MADV_WILLNEED);
  madvise(mapping->base, size, MADV_SEQUENTIAL);
  FileHeader h;
  std::memcpy(&h, mapping->base, sizeof(h));
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) return bad("not a muster channel file (bad magic)");
  if (h.version != kVersion) return bad(fmt::format("format version {} is not {}", h.version, kVersion));
  if (h.transferId != transferId) {
    return bad("a foreign file: its transfer id is not the one rank announced");
  }
  if (h.payloadBytes != bytes || h.ndim > kMaxDims || h.headerBytes < sizeof(FileHeader) + 8 * h.ndim ||
      h.headerBytes > size) {
    return bad("its header disagrees with the announcement");
  }
  {
    FileHeader zeroed = h;
    zeroed.headerChecksum = 0;
    std::string head(static_cast<const char*>(mapping->base), h.headerBytes);
    std::memcpy(head.data(), &zeroed, sizeof(zeroed));
    if (XXH3_64bits(head.data(), head.size()) != h.headerChecksum) {
      return bad("corrupted: the header's checksum does not match");
    }
  }
  if (size != h.headerBytes + bytes) {
    return bad(fmt::format("truncated or padded: {} bytes where {} were announced", size,
                           h.headerBytes + bytes));
  }
  const char* data = static_cast<const char*>(mapping->base) + h.headerBytes;
  if (XXH3_64bits(data, bytes) != checksum || h.checksum != checksum) {
    return bad("corrupted: the checksum does not match");
  }
  Received r;
  r.mapping = mapping;
  r.data = data;
  r.bytes = bytes;
  r.kind = static_cast<Kind>(h.kind);
  r.dtype = static_cast<at::ScalarType>(h.dtype);
  r.shape.resize(h.ndim);
  if (h.ndim > 0) std::memcpy(r.shape.data(), static_cast<const char*>(mapping->base) + sizeof(h), 8 * h.ndim);
  int64_t elements = 1;
  for (int64_t d : r.shape) {
    if (d < 0) return bad(fmt::format("its shape has a negative dimension ({})", d));
    if (__builtin_mul_overflow(elements, d, &elements)) return bad("its shape's element count overflows");
  }
  // Every file's dtype and shape must add up to its length, whatever its kind (bytes are
  // written as uint8 of their length): recv() of a file whose header said bytes, or another
  // kind, skipped this and made a tensor of the header's dtype and shape over a shorter mapping
  // (found reading the channel for the fuzz targets).
  if (r.kind != kTensor && r.kind != kBytes) return bad(fmt::format("unknown payload kind {}", h.kind));
  // Undefined lies below NumOptions and has no size: elementSize threw c10::Error out of recv()
  // (found reviewing the channel_files target; corpus regress-dtype-undefined).
  if (h.dtype < 0 || h.dtype >= static_cast<int32_t>(at::ScalarType::NumOptions) ||
      r.dtype == at::ScalarType::Undefined) {
    return bad(fmt::format("unknown dtype code {}", h.dtype));
  }
  uint64_t total = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(elements), static_cast<uint64_t>(c10::elementSize(r.dtype)), &total) ||
      total != bytes) {
    return bad("its shape and dtype do not add up to its length");
  }
  // The last receiver deletes the file; the mapping keeps the data. Across nodes the file is
  // left to the round's clean-up (launch removes the round's directory): another node may
  // still map it, and a network file system does not keep an unlinked file for it.
  try {
    if (store_->add(doneKey(name), 1) >= receivers) {
      if (env_.groupWorldSize <= 1) unlink(path.c_str());
      store_->deleteKey(annKey(name));
      store_->deleteKey(doneKey(name));
      // Part keys are counted from the start only if it agrees with the announcement.
      if (store_->check({earlyKey(name)})) {
        std::vector<std::string> early = absl::StrSplit(textOf(store_->get(earlyKey(name))), '|');
        uint64_t streamed = 0, segment = 0;
        if (early.size() == 5 && early[0] == "S" && absl::SimpleAtoi(early[3], &streamed) &&
            streamed == bytes && absl::SimpleAtoi(early[4], &segment) && segment >= 4096 &&
            segment % 4096 == 0) {
          for (uint64_t k = 0; k < (streamed + segment - 1) / segment; ++k) store_->deleteKey(partKey(name, k));
        }
        store_->deleteKey(earlyKey(name));
      }
    }
  } catch (const std::exception&) {
  }
  return r;
}

// The five transfer patterns, on payloads; `stream` keeps tensor and byte transfers apart.

absl::Status SharedDirChannel::sendPayload(const Payload& p, int dst, int tag, const char* stream) {
  if (dst < 0 || dst >= env_.worldSize) {
    return absl::InvalidArgumentError(fmt::format("send to rank {} of {}", dst, env_.worldSize));
  }
  return publish(nextName(fmt::format("{}.{}.{}.{}", stream, env_.rank, dst, tag), 's'), p, 1);
}

absl::StatusOr<SharedDirChannel::Received> SharedDirChannel::recvPayload(int src, int tag, const char* stream) {
  if (src < 0 || src >= env_.worldSize) {
    return absl::InvalidArgumentError(fmt::format("recv from rank {} of {}", src, env_.worldSize));
  }
  return fetch(nextName(fmt::format("{}.{}.{}.{}", stream, src, env_.rank, tag), 'r'), src);
}

absl::StatusOr<std::optional<SharedDirChannel::Received>> SharedDirChannel::broadcastPayload(
    const Payload& p, int root, int tag, const char* stream) {
  std::string name = nextName(fmt::format("{}.{}.{}", stream, root, tag));
  if (env_.rank == root) {
    if (env_.worldSize > 1) {
      if (auto s = publish(name, p, env_.worldSize - 1); !s.ok()) return s;
    }
    return std::optional<Received>();  // the root keeps its own
  }
  auto r = fetch(name, root);
  if (!r.ok()) return r.status();
  return std::optional<Received>(std::move(*r));
}

absl::StatusOr<std::vector<std::optional<SharedDirChannel::Received>>> SharedDirChannel::gatherPayload(
    const Payload& p, int root, int tag, const char* stream) {
  std::string base = nextName(fmt::format("{}.{}.{}", stream, root, tag));
  std::vector<std::optional<Received>> out;
  if (env_.rank != root) {
    if (auto s = publish(fmt::format("{}.from{}", base, env_.rank), p, 1); !s.ok()) return s;
    return out;
  }
  out.resize(static_cast<size_t>(env_.worldSize));
  for (int r = 0; r < env_.worldSize; ++r) {
    if (r == root) continue;  // empty: the root's own
    auto got = fetch(fmt::format("{}.from{}", base, r), r);
    if (!got.ok()) return got.status();
    out[static_cast<size_t>(r)] = std::move(*got);
  }
  return out;
}

absl::StatusOr<std::vector<std::optional<SharedDirChannel::Received>>> SharedDirChannel::allGatherPayload(
    const Payload& p, int tag, const char* stream) {
  std::string base = nextName(fmt::format("{}.{}", stream, tag));
  if (env_.worldSize > 1) {
    if (auto s = publish(fmt::format("{}.from{}", base, env_.rank), p, env_.worldSize - 1); !s.ok()) return s;
  }
  std::vector<std::optional<Received>> out(static_cast<size_t>(env_.worldSize));
  for (int r = 0; r < env_.worldSize; ++r) {
    if (r == env_.rank) continue;  // empty: this rank's own
    auto got = fetch(fmt::format("{}.from{}", base, r), r);
    if (!got.ok()) return got.status();
    out[static_cast<size_t>(r)] = std::move(*got);
  }
  return out;
}

namespace {

// Received payloads as tensors or strings; an empty slot is the caller's own value.
template <typename T, typename Own>
std::vector<T> unpack(std::vector<std::optional<SharedDirChannel::Received>>& got, const Own& own);

template <>
std::vector<at::Tensor> unpack(std::vector<std::optional<SharedDirChannel::Received>>& got, const at::Tensor& own) {
  std::vector<at::Tensor> out;
  for (auto& r : got) out.push_back(r ? r->tensor() : own);
  return out;
}

template <>
std::vector<std::string> unpack(std::vector<std::optional<SharedDirChannel::Received>>& got,
                                const std::string_view& own) {
  std::vector<std::string> out;
  for (auto& r : got) out.push_back(r ? r->text() : std::string(own));
  return out;
}

}  // namespace

absl::Status SharedDirChannel::send(const at::Tensor& tensor, int dst, int tag) {
  at::Tensor c = tensor.contiguous().cpu();
  return sendPayload(Payload::ofTensor(c), dst, tag, "p2p");
}

absl::StatusOr<at::Tensor> SharedDirChannel::recv(int src, int tag) {
  auto r = recvPayload(src, tag, "p2p");
  if (!r.ok()) return r.status();
  return r->tensor();
}

absl::Status SharedDirChannel::sendBytes(std::string_view bytes, int dst, int tag) {
  return sendPayload(Payload::ofBytes(bytes), dst, tag, "p2pb");
}

absl::StatusOr<std::string> SharedDirChannel::recvBytes(int src, int tag) {
  auto r = recvPayload(src, tag, "p2pb");
  if (!r.ok()) return r.status();
  return r->text();
}

absl::StatusOr<at::Tensor> SharedDirChannel::broadcast(const at::Tensor& tensor, int root, int tag) {
  at::Tensor c = env_.rank == root ? tensor.contiguous().cpu() : at::Tensor();
  auto r = broadcastPayload(env_.rank == root ? Payload::ofTensor(c) : Payload(), root, tag, "bcast");
  if (!r.ok()) return r.status();
  return *r ? (*r)->tensor() : tensor;
}

absl::StatusOr<std::string> SharedDirChannel::broadcastBytes(std::string_view bytes, int root, int tag) {
  auto r = broadcastPayload(Payload::ofBytes(bytes), root, tag, "bcastb");
  if (!r.ok()) return r.status();
  return *r ? (*r)->text() : std::string(bytes);
}

absl::StatusOr<std::vector<at::Tensor>> SharedDirChannel::gather(const at::Tensor& tensor, int root, int tag) {
  at::Tensor c = tensor.contiguous().cpu();
  auto got = gatherPayload(Payload::ofTensor(c), root, tag, "gather");
  if (!got.ok()) return got.status();
  return unpack<at::Tensor>(*got, tensor);
}

absl::StatusOr<std::vector<std::string>> SharedDirChannel::gatherBytes(std::string_view bytes, int root, int tag) {
  auto got = gatherPayload(Payload::ofBytes(bytes), root, tag, "gatherb");
  if (!got.ok()) return got.status();
  return unpack<std::string>(*got, bytes);
}

absl::StatusOr<std::vector<at::Tensor>> SharedDirChannel::allGather(const at::Tensor& tensor, int tag) {
  at::Tensor c = tensor.contiguous().cpu();
  auto got = allGatherPayload(Payload::ofTensor(c), tag, "allgather");
  if (!got.ok()) return got.status();
  return unpack<at::Tensor>(*got, tensor);
}

absl::StatusOr<std::vector<std::string>> SharedDirChannel::allGatherBytes(std::string_view bytes, int tag) {
  auto got = allGatherPayload(Payload::ofBytes(bytes), tag, "allgatherb");
  if (!got.ok()) return got.status();
  return unpack<std::string>(*got, bytes);
}

}  // namespace muster::worker
