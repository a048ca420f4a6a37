// makeJobLayout: ids, directories and the token file of one job on one node.
#include "launcher/job_layout.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "common/contract.h"
#include "common/files.h"

namespace muster::launcher {
namespace fs = std::filesystem;

namespace {

std::string makeTempDir(const std::string& parent, const std::string& prefix) {
  std::string pattern = (fs::path(parent) / (prefix + "XXXXXX")).string();
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) return "";
  return buf.data();
}

std::string tempRoot(const std::map<std::string, std::string>& env) {
  auto it = env.find("TMPDIR");
  return it != env.end() && !it->second.empty() ? it->second : "/tmp";
}

// As torchrun's c10d rendezvous without --rdzv_id: a uuid4-shaped id of its own.
std::string newRunId() {
  return randomHex(4) + "-" + randomHex(2) + "-" + randomHex(2) + "-" + randomHex(2) + "-" +
         randomHex(6);
}

absl::Status writePrivateFile(const std::string& path, const std::string& content) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  bool written = fd >= 0 && write(fd, content.data(), content.size()) ==
                                static_cast<ssize_t>(content.size());
  if (fd >= 0 && close(fd) != 0) written = false;
  if (!written) return absl::InternalError(fmt::format("cannot write '{}'", path));
  return absl::OkStatus();
}

// Whether any file (not a folder) is under `dir`: the logs a user asked for.
bool holdsAFile(const std::string& dir) {
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_directory(ec)) return true;
  }
  return false;
}

}  // namespace

std::string randomHex(size_t bytes) {
  std::random_device rd;
  std::string out;
  for (size_t i = 0; i < bytes; ++i) out += fmt::format("{:02x}", rd() & 0xff);
  return out;
}

absl::StatusOr<std::string> makeRuntimeDir(const std::map<std::string, std::string>& env) {
  // $TMPDIR, made absolute (the ranks may change directory); /tmp when $TMPDIR cannot take it
  // (a scheduler's per-job TMPDIR not made yet): a job that never asked for a temporary folder
  // does not fail for want of one.
  std::error_code ec;
  std::string first = fs::absolute(tempRoot(env), ec).string();
  if (ec) first = tempRoot(env);
  std::string dir = makeTempDir(first, "muster-launch-");  // mkdtemp: mode 0700
  int firstErrno = errno;
  if (dir.empty() && first != "/tmp") dir = makeTempDir("/tmp", "muster-launch-");
  if (dir.empty()) {
    return absl::InternalError(fmt::format("cannot create launch's runtime folder under '{}' ({}) or /tmp: {}",
                                           first, strerror(firstErrno), strerror(errno)));
  }
  return dir;
}

absl::StatusOr<JobLayout> makeJobLayout(const LaunchOptions& options,
                                        const std::map<std::string, std::string>& env,
                                        bool multiNode, const std::string& runtimeDir) {
  JobLayout l;
  l.runtimeDir = runtimeDir;
  bool standaloneId = !multiNode && (options.standalone ||
                                     (options.rdzvBackend != "static" && options.rdzvId == "none"));
  l.runId = standaloneId ? newRunId() : options.rdzvId;
  // Whatever is made here goes again when a later step fails.
  struct Undo {
    JobLayout& l;
    bool keep = false;
    ~Undo() {
      if (!keep) l.discard();
    }
  } undo{l};

  if (options.logDir.empty()) {
    l.baseLogDir = makeTempDir(tempRoot(env), "muster_");
    if (l.baseLogDir.empty()) {
      return absl::InternalError(
          fmt::format("cannot create a log directory under '{}'", tempRoot(env)));
    }
    l.ownBaseLogDir = true;
  } else {
    l.baseLogDir = options.logDir;
    std::error_code ec;
    fs::create_directories(l.baseLogDir, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          fmt::format("--log_dir={}: cannot create it: {}", l.baseLogDir, ec.message()));
    }
  }
  l.runDir = makeTempDir(l.baseLogDir, l.runId + "_");
  if (l.runDir.empty()) {
    return absl::InternalError(
        fmt::format("cannot create a log directory under '{}'", l.baseLogDir));
  }
  l.jobId = multiNode ? l.runId : fs::path(l.runDir).filename().string();

  if (options.sharedDir.empty() && options.maxNodes > 1) {
    // Across nodes a per-job temporary directory would be local to each node: the workers get
    // none, and the channel's create() says to give --shared_dir (a DDP script never asks).
  } else if (options.sharedDir.empty()) {
    // In launch's runtime folder: it goes with launch, after a SIGKILL too (the orphan guard).
    std::error_code ec;
    l.sharedDir = runtimeDir.empty() ? makeTempDir(tempRoot(env), "muster-shared-")
                                     : (fs::path(runtimeDir) / "shared").string();
    if (l.sharedDir.empty() || (!runtimeDir.empty() && !fs::create_directory(l.sharedDir, ec))) {
      return absl::InternalError("cannot create a shared directory");
    }
    l.ownSharedDir = true;
  } else {
    l.sharedDir = options.sharedDir;
    if (!fs::is_directory(l.sharedDir)) {
      return absl::InvalidArgumentError(
          fmt::format("--shared_dir={} is not a directory", l.sharedDir));
    }
  }

  // One node: a token of its own, readable by this job's workers only. Several: the token
  // must be the same on every node, so MUSTER_STORE_TOKEN_FILE names it (or none is used).
  l.token = multiNode ? "" : randomHex(16);
  if (multiNode) {
    if (auto it = env.find(contract::kStoreTokenFile); it != env.end() && !it->second.empty()) {
      auto shared = readToken(it->second);
      if (!shared.ok()) {
        return absl::InvalidArgumentError(fmt::format("{} (from {})", std::string(shared.status().message()),
                                                      contract::kStoreTokenFile));
      }
      l.token = *shared;
    }
  }
  l.tokenFile = (fs::path(l.runtimeDir) / "store.token").string();
  if (auto s = writePrivateFile(l.tokenFile, l.token); !s.ok()) return s;
  undo.keep = true;
  return l;
}

void JobLayout::discard() const {
  std::error_code ec;
  if (!runtimeDir.empty()) fs::remove_all(runtimeDir, ec);
  if (ownSharedDir) fs::remove_all(sharedDir, ec);
  if (ownBaseLogDir) {
    fs::remove_all(baseLogDir, ec);
  } else if (!runDir.empty()) {
    fs::remove_all(runDir, ec);
  }
}

void JobLayout::cleanUp(bool succeeded) const {
  std::error_code ec;
  if (!runtimeDir.empty()) fs::remove_all(runtimeDir, ec);
  if (ownSharedDir) {
    fs::remove_all(sharedDir, ec);
  } else if (succeeded && !jobId.empty() && !sharedDir.empty()) {
    fs::remove_all(fs::path(sharedDir) / jobId, ec);  // nothing left after a successful job
  }
  if (ownBaseLogDir && succeeded && !holdsAFile(baseLogDir)) fs::remove_all(baseLogDir, ec);
}

}  // namespace muster::launcher
