// parseDump: faulthandler's text and the native handler's backtrace_symbols_fd lines.
#include <cxxabi.h>

#include <cstdlib>
#include <filesystem>
#include <memory>

#include <fmt/format.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "stacks/stacks.h"

namespace muster::stacks {

namespace {

// `text` with every byte that does not belong to a well-formed UTF-8 sequence replaced by
// U+FFFD. A dump is a process's bytes: the kernel cuts a thread's name at 15 bytes, mid-character
// if need be, and file names are whatever the file system holds; the report and the JSON sent to
// the rendezvous must be text (nlohmann's dump() throws on anything else).
std::string validUtf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  auto continuation = [&](size_t i) { return i < text.size() && (byte(i) & 0xC0) == 0x80; };
  for (size_t i = 0; i < text.size();) {
    unsigned char c = byte(i);
    size_t n = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
    bool ok = n != 0;
    for (size_t k = 1; ok && k < n; ++k) ok = continuation(i + k);
    if (ok && n == 3) {  // no overlong forms, no surrogates
      unsigned char d = byte(i + 1);
      ok = !(c == 0xE0 && d < 0xA0) && !(c == 0xED && d > 0x9F);
    }
    if (ok && n == 4) {  // no overlong forms, nothing past U+10FFFF
      unsigned char d = byte(i + 1);
      ok = !(c == 0xF0 && d < 0x90) && !(c == 0xF4 && d > 0x8F);
    }
    if (ok) {
      out.append(text.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += 1;
    }
  }
  return out;
}

std::string demangle(const std::string& name) {
  if (name.rfind("_Z", 0) != 0) return name;
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status),
                                             std::free);
  return status == 0 && out ? std::string(out.get()) : name;
}

// `  File "/x/train.py", line 88 in train_step`
bool pythonFrame(absl::string_view line, Frame& frame) {
  if (!absl::ConsumePrefix(&line, "  File \"")) return false;
  size_t quote = line.rfind("\", line ");
  if (quote == absl::string_view::npos) return false;
  frame.file = std::string(line.substr(0, quote));
  absl::string_view rest = line.substr(quote + 8);
  size_t in = rest.find(" in ");
  if (in == absl::string_view::npos || !absl::SimpleAtoi(rest.substr(0, in), &frame.line)) return false;
  frame.function = std::string(rest.substr(in + 4));
  return true;
}

// `/path/prog(_ZN6muster5stuckEv+0x1e)[0x55d0c2f1a2b3]`, `/lib/libc.so.6(+0x8f2a1)[0x7f..]`,
// `[0x7f...]`.
bool nativeFrame(absl::string_view line, Frame& frame) {
  frame.native = true;
  size_t open = line.find('(');
  size_t close = line.rfind(")[");
  if (open == absl::string_view::npos || close == absl::string_view::npos || close < open) {
    if (line.empty() || line.front() != '[') return false;
    frame.function = "??";
    frame.offset = std::string(absl::StripSuffix(absl::StripPrefix(line, "["), "]"));
    return true;
  }
  frame.file = std::string(line.substr(0, open));
  absl::string_view inside = line.substr(open + 1, close - open - 1);
  size_t plus = inside.rfind('+');
  std::string symbol(inside.substr(0, plus));
  frame.offset = plus == absl::string_view::npos ? "" : std::string(inside.substr(plus));
  frame.function = symbol.empty() ? "??" : demangle(symbol);
  return true;
}

}  // namespace

std::vector<Thread> parseDump(std::string_view text) {
  std::vector<Thread> threads;
  for (absl::string_view line : absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    if (line.rfind("muster-stacks ", 0) == 0) continue;  // a handler's ready line, or an end
    absl::string_view head = line;
    bool current = absl::ConsumePrefix(&head, "Current thread ");
    if (current || absl::ConsumePrefix(&head, "Thread ")) {
      Thread t;
      t.current = current;
      if (absl::ConsumeSuffix(&head, " (most recent call first):")) {
        t.id = std::string(head);  // faulthandler
      } else {
        // native: "TID (NAME) current:", "TID (NAME):", "TID did not answer"
        if (absl::ConsumeSuffix(&head, " did not answer")) t.note = "did not answer";
        t.current = absl::ConsumeSuffix(&head, " current:");
        absl::ConsumeSuffix(&head, ":");
        size_t paren = head.find(" (");
        t.id = std::string(head.substr(0, paren));
        if (paren != absl::string_view::npos) {
          t.name = std::string(absl::StripSuffix(head.substr(paren + 2), ")"));
        }
      }
      threads.push_back(std::move(t));
      continue;
    }
    if (threads.empty() || line.empty()) continue;
    Thread& t = threads.back();
    Frame f;
    if (pythonFrame(line, f)) {
      t.frames.push_back(std::move(f));
    } else if (line == "  Garbage-collecting" || line == "  <no Python frame>" || line == "  ...") {
      t.note = std::string(absl::StripPrefix(line, "  "));
    } else if (line.rfind("  ", 0) != 0 && nativeFrame(line, f)) {
      t.frames.push_back(std::move(f));
    }
  }
  // Every field text, whatever bytes the dump held (the demangler copies a name's bytes too).
  for (auto& t : threads) {
    for (std::string* field : {&t.id, &t.name, &t.note}) *field = validUtf8(*field);
    for (auto& f : t.frames) {
      for (std::string* field : {&f.function, &f.file, &f.offset}) *field = validUtf8(*field);
    }
  }
  return threads;
}

std::string frameText(const Frame& f, bool fullPath) {
  std::string file = fullPath ? f.file : std::filesystem::path(f.file).filename().string();
  if (!f.native) return fmt::format("{} ({}:{})", f.function, file, f.line);
  if (f.function == "??") return fmt::format("?? ({}{})", file, f.offset);
  return fmt::format("{} ({})", f.function, file);
}

}  // namespace muster::stacks
