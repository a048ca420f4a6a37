// watchScreen: a self-pipe for SIGWINCH, SIGINT and SIGTERM, poll() on it and on the keyboard
// with the interval as the timeout, ANSI sequences for the alternate screen.
#include "rendezvous/programs/watch_screen.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <vector>

namespace muster::rendezvous {

namespace {

int gPipe[2] = {-1, -1};

void onSignal(int sig) {
  unsigned char b = static_cast<unsigned char>(sig);
  ssize_t ignored = write(gPipe[1], &b, 1);
  (void)ignored;
}

void writeAll(const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = write(STDOUT_FILENO, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

// The terminal's size; {0, 0} when unknown.
std::pair<int, int> terminalSize() {
  winsize ws{};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) != 0) return {0, 0};
  return {ws.ws_col, ws.ws_row};
}

std::string timeOfDay() {
  std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%H:%M:%S", std::localtime(&now));
  return buf;
}

// The view fitted to `cols` x `rows`: a header line, then as many lines as fit, each cut.
std::string fit(const std::string& view, int cols, int rows, double intervalS) {
  constexpr int kMinCols = 20, kMinRows = 3;
  if (cols < kMinCols || rows < kMinRows) {
    // The longest of these that fits, so that even a few columns say what is wrong.
    std::string size = "(" + std::to_string(cols) + "x" + std::to_string(rows) + ")";
    for (std::string msg : {"terminal too small " + size, "too small " + size, std::string("too small")}) {
      if (static_cast<int>(msg.size()) <= cols) return msg;
    }
    return std::string("too small").substr(0, static_cast<size_t>(std::max(cols, 0)));
  }
  char head[96];
  std::snprintf(head, sizeof head, "every %gs, q to quit", intervalS);
  std::string header = head;
  std::string right = timeOfDay();
  if (static_cast<int>(header.size() + right.size()) + 1 <= cols) {
    header += std::string(static_cast<size_t>(cols) - header.size() - right.size(), ' ') + right;
  }
  if (static_cast<int>(header.size()) > cols) header.resize(static_cast<size_t>(cols));
  std::vector<std::string> lines{header, ""};
  size_t start = 0;
  while (start < view.size()) {
    size_t end = view.find('\n', start);
    if (end == std::string::npos) end = view.size();
    std::string line = view.substr(start, end - start);
    if (static_cast<int>(line.size()) > cols) line.resize(static_cast<size_t>(cols));
    lines.push_back(line);
    start = end + 1;
  }
  int room = rows - 1;  // the cursor's line stays free: no scroll
  std::string out;
  int total = static_cast<int>(lines.size());
  for (int i = 0; i < total && i < room; ++i) {
    // The last row that fits says how many did not, when some do not.
    if (i == room - 1 && total > room) {
      std::string more = "... " + std::to_string(total - room + 1) + " more line(s)";
      if (static_cast<int>(more.size()) > cols) more.resize(static_cast<size_t>(cols));
      out += more;
      break;
    }
    out += lines[static_cast<size_t>(i)] + (i + 1 < std::min(total, room) ? "\r\n" : "");
  }
  return out;
}

}  // namespace

int watchScreen(const std::function<std::string(int width)>& render, double intervalS) {
  if (pipe2(gPipe, O_CLOEXEC | O_NONBLOCK) != 0) return 1;
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGWINCH, SIGINT, SIGTERM}) sigaction(sig, &sa, nullptr);
  bool tty = isatty(STDOUT_FILENO) != 0;
  bool keys = tty && isatty(STDIN_FILENO) != 0;
  termios saved{};
  if (keys && tcgetattr(STDIN_FILENO, &saved) == 0) {
    termios raw = saved;
    raw.c_lflag &= static_cast<tcflag_t>(~(ICANON | ECHO));
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    tcsetattr(STDIN_FILENO, TCSANOW, &raw);
  } else {
    keys = false;
  }
  // The alternate screen, cursor hidden; both put back on the way out.
  if (tty) writeAll("\x1b[?1049h\x1b[?25l");
  int code = -1;
  auto interval = std::chrono::milliseconds(static_cast<int64_t>(intervalS * 1000));
  auto next = std::chrono::steady_clock::now();
  bool first = true;
  while (code < 0) {
    auto now = std::chrono::steady_clock::now();
    if (now >= next) {
      if (tty) {
        auto [cols, rows] = terminalSize();
        if (cols == 0) cols = 80, rows = 24;
        writeAll("\x1b[H\x1b[2J" + fit(render(cols), cols, rows, intervalS));
      } else {
        writeAll((first ? "" : "\n") + render(0));
      }
      first = false;
      next = std::chrono::steady_clock::now() + interval;
    }
    int wait = static_cast<int>(std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(next - std::chrono::steady_clock::now()).count()));
    pollfd fds[2] = {{gPipe[0], POLLIN, 0}, {STDIN_FILENO, POLLIN, 0}};
    int n = poll(fds, keys ? 2 : 1, wait);
    if (n <= 0) continue;
    if (fds[0].revents & POLLIN) {
      unsigned char sig = 0;
      while (read(gPipe[0], &sig, 1) == 1) {
        if (sig == SIGINT) code = 130;
        if (sig == SIGTERM) code = 143;
        if (sig == SIGWINCH) next = std::chrono::steady_clock::now();  // redraw for the new size now
      }
    }
    if (keys && (fds[1].revents & POLLIN)) {
      char c = 0;
      while (read(STDIN_FILENO, &c, 1) == 1) {
        if (c == 'q' || c == 'Q') code = 0;
        if (c == ' ') next = std::chrono::steady_clock::now();
      }
    }
  }
  if (tty) writeAll("\x1b[?25h\x1b[?1049l");
  if (keys) tcsetattr(STDIN_FILENO, TCSANOW, &saved);
  return code;
}

}  // namespace muster::rendezvous
