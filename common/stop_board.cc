// The stop board's file, under flock(2) (stop_board.h).
#include "common/stop_board.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include <fmt/format.h>

namespace muster::stopboard {
namespace {

enum Word { kMagicWord = 0, kSlots = 1, kFrozen = 2, kHorizon = 3, kStop = 4, kReason = 5 };

std::string errnoText(int e) { return std::strerror(e); }

// The whole file, read under the caller's lock; checked against the layout.
absl::StatusOr<std::vector<int64_t>> readWords(int fd, const std::string& what) {
  std::array<int64_t, kHeaderWords> head{};
  ssize_t n = pread(fd, head.data(), sizeof head, 0);
  if (n != static_cast<ssize_t>(sizeof head) || std::memcmp(head.data(), kMagic, 8) != 0) {
    return absl::DataLossError(fmt::format("{} is not a stop board (a header of {} bytes)", what, n));
  }
  int64_t slots = head[kSlots];
  if (slots < 0 || slots > kMaxSlots) {
    return absl::DataLossError(fmt::format("{}: a stop board of {} slots", what, slots));
  }
  std::vector<int64_t> words(static_cast<size_t>(kHeaderWords + slots));
  std::copy(head.begin(), head.end(), words.begin());
  n = pread(fd, words.data() + kHeaderWords, slots * 8, kHeaderWords * 8);
  if (n != slots * 8) return absl::DataLossError(fmt::format("{}: its {} slots are cut short", what, slots));
  return words;
}

absl::Status writeWords(int fd, const int64_t* words, int first, int count, const std::string& what) {
  ssize_t n = pwrite(fd, words + first, count * 8, first * 8);
  if (n != count * 8) return absl::InternalError(fmt::format("cannot write {}: {}", what, errnoText(errno)));
  return absl::OkStatus();
}

Board boardOf(const std::vector<int64_t>& w) {
  Board b;
  b.frozen = w[kFrozen] != 0;
  b.horizon = w[kHorizon];
  b.stopStep = w[kStop];
  b.reason = w[kReason];
  b.asked.assign(w.begin() + kHeaderWords, w.end());
  return b;
}

// Holds the file's lock for one change.
class Locked {
 public:
  explicit Locked(int fd) : fd_(fd) {
    while (flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
    }
  }
  ~Locked() { flock(fd_, LOCK_UN); }
  Locked(const Locked&) = delete;
  Locked& operator=(const Locked&) = delete;

 private:
  int fd_;
};

// Opens `path`, locks it and runs change(words) -> the words to write back from `first` on.
template <typename Change>
absl::StatusOr<Board> edit(const std::string& path, Change change) {
  std::string what = fmt::format("the stop board '{}'", path);
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(fmt::format("cannot open {}: {}", what, errnoText(errno)));
  absl::StatusOr<Board> result;
  {
    Locked lock(fd);
    auto words = readWords(fd, what);
    if (!words.ok()) {
      result = words.status();
    } else {
      absl::Status written = change(*words, fd, what);
      result = written.ok() ? absl::StatusOr<Board>(boardOf(*words)) : absl::StatusOr<Board>(written);
    }
  }
  close(fd);
  return result;
}

}  // namespace

absl::Status create(const std::string& path, int slots) {
  if (slots < 0 || slots > kMaxSlots) {
    return absl::InvalidArgumentError(fmt::format("a stop board of {} slots (at most {})", slots, kMaxSlots));
  }
  std::vector<int64_t> words(kHeaderWords + slots, kNone);
  std::memcpy(words.data(), kMagic, 8);
  words[kSlots] = slots;
  words[kFrozen] = 0;
  words[kHorizon] = 0;
  words[kReason] = 0;
  words[6] = words[7] = 0;
  // Made aside and renamed over, so that no rank of an earlier round reads a half-made board.
  std::string temp = path + ".new";
  int fd = open(temp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(fmt::format("cannot make the stop board '{}': {}", temp, errnoText(errno)));
  absl::Status written = writeWords(fd, words.data(), 0, static_cast<int>(words.size()), "the stop board " + temp);
  close(fd);
  if (written.ok() && rename(temp.c_str(), path.c_str()) != 0) {
    written = absl::InternalError(fmt::format("cannot make the stop board '{}': {}", path, errnoText(errno)));
  }
  if (!written.ok()) unlink(temp.c_str());
  return written;
}

absl::StatusOr<Board> read(const std::string& path) {
  return edit(path, [](std::vector<int64_t>&, int, const std::string&) { return absl::OkStatus(); });
}

absl::StatusOr<Board> freeze(const std::string& path) {
  return edit(path, [](std::vector<int64_t>& w, int fd, const std::string& what) {
    if (w[kFrozen] != 0) return absl::OkStatus();
    w[kFrozen] = 1;
    return writeWords(fd, w.data(), kFrozen, 1, what);
  });
}

absl::StatusOr<Board> post(const std::string& path, int64_t stopStep, int64_t reason) {
  return edit(path, [&](std::vector<int64_t>& w, int fd, const std::string& what) {
    if (w[kStop] != kNone) return absl::OkStatus();
    if (w[kFrozen] == 0 || stopStep < w[kHorizon]) {
      return absl::FailedPreconditionError(fmt::format(
          "{}: a stop step of {} below the horizon {} (or on a board not frozen)", what, stopStep, w[kHorizon]));
    }
    w[kStop] = stopStep;
    w[kReason] = reason;
    return writeWords(fd, w.data(), kStop, 2, what);
  });
}

absl::StatusOr<Asked> ask(int fd, int slot, int64_t step, int64_t ahead) {
  const std::string what = "the stop board (MUSTER_STOP_FILE)";
  if (step < 0) return absl::InvalidArgumentError(fmt::format("a step of {}: steps count from 0", step));
  Locked lock(fd);
  auto words = readWords(fd, what);
  if (!words.ok()) return words.status();
  std::vector<int64_t>& w = *words;
  if (slot < 0 || slot >= w[kSlots]) {
    return absl::InvalidArgumentError(fmt::format("{} has {} slots; MUSTER_STOP_SLOT {} is none of them", what, w[kSlots], slot));
  }
  Asked a;
  if (w[kHeaderWords + slot] != step) {
    w[kHeaderWords + slot] = step;
    if (absl::Status s = writeWords(fd, w.data(), kHeaderWords + slot, 1, what); !s.ok()) return s;
  }
  a.stopStep = w[kStop];
  if (w[kStop] != kNone) {
    a.answer = step >= w[kStop] ? Answer::kStop : Answer::kGoOn;
    a.horizon = w[kStop];
    return a;
  }
  if (step < w[kHorizon]) {
    a.horizon = w[kHorizon];
    return a;
  }
  if (w[kFrozen] != 0) {
    a.answer = Answer::kWait;
    a.horizon = w[kHorizon];
    return a;
  }
  ahead = std::max<int64_t>(ahead, 1);
  w[kHorizon] = step > INT64_MAX - ahead ? INT64_MAX : step + ahead;
  if (absl::Status s = writeWords(fd, w.data(), kHorizon, 1, what); !s.ok()) return s;
  a.horizon = w[kHorizon];
  return a;
}

}  // namespace muster::stopboard
