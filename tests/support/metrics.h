// Scraping a metrics endpoint in tests: a plain HTTP/1.1 GET over a socket, a sample's value
// from the Prometheus text, and `promtool check metrics` (Debian's prometheus package).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

namespace muster::testing {

// The whole response (status line, headers, body) to `request` sent to 127.0.0.1:port; empty
// when nothing came within `timeout`.
inline std::string httpExchange(int port, const std::string& request,
                                std::chrono::milliseconds timeout = std::chrono::milliseconds(10000)) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    char buffer[65536];
    while (true) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{fd, POLLIN, 0};
      if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
      ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
      if (n <= 0) break;
      out.append(buffer, static_cast<size_t>(n));
    }
  }
  if (fd >= 0) close(fd);
  return out;
}

inline std::string httpGet(int port, const std::string& path) {
  return httpExchange(port, "GET " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
}

// The body of an HTTP response.
inline std::string httpBody(const std::string& response) {
  auto at = response.find("\r\n\r\n");
  return at == std::string::npos ? "" : response.substr(at + 4);
}

// The value of the sample named exactly `sample` ("name" or "name{label=\"v\"}").
inline std::optional<double> metricValue(const std::string& text, const std::string& sample) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.size() > sample.size() && line.compare(0, sample.size(), sample) == 0 && line[sample.size()] == ' ') {
      return std::strtod(line.c_str() + sample.size() + 1, nullptr);
    }
  }
  return std::nullopt;
}

// promtool's verdict on `text`: "" when it passes, else what it said.
inline std::string promtoolProblems(const std::string& text, const std::string& scratchFile) {
  std::ofstream(scratchFile) << text;
  std::string report = scratchFile + ".promtool";
  std::string command = "/usr/bin/promtool check metrics < " + scratchFile + " > " + report + " 2>&1";
  int rc = std::system(command.c_str());
  std::ifstream in(report);
  std::string said((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (rc != 0) return said.empty() ? "promtool failed (is Debian's prometheus installed?)" : said;
  return "";
}

}  // namespace muster::testing
