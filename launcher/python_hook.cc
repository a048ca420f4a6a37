// writePythonHook: the hook's text, and where it goes.
#include "launcher/python_hook.h"

#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "common/contract.h"

namespace muster::launcher {

namespace {

// It takes launch's variables out of the environment (a child Python process does not answer
// for the rank) and its own folder out of sys.path and PYTHONPATH, leaving no trace.
constexpr const char* kHook = R"PY(# muster's start-up hook, put first on PYTHONPATH by launch: on the roll-call signal,
# faulthandler appends the stacks of all threads to the rank's file. Then the sitecustomize
# this one hides runs, if there is one.
def _muster_hook():
    import os
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    given = os.environ.get("PYTHONPATH", "")
    if given == here:
        os.environ.pop("PYTHONPATH", None)
    elif given.startswith(here + os.pathsep):
        os.environ["PYTHONPATH"] = given[len(here) + 1:]
    path = os.environ.pop("{file}", "")
    signum = os.environ.pop("{signal}", "")
    if path and signum:
        try:
            import faulthandler
            out = open(path, "a", buffering=1)
            faulthandler.register(int(signum), file=out, all_threads=True, chain=False)
            out.write("{ready}%d python\n" % os.getpid())
        except Exception as e:  # never stop the program over its roll-call
            sys.stderr.write("muster: no stack roll-call for this rank: %s\n" % e)
    import importlib.machinery
    import importlib.util
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


_muster_hook()
del _muster_hook
)PY";

}  // namespace

absl::StatusOr<std::string> writePythonHook(const std::string& dir) {
  std::string folder = (std::filesystem::path(dir) / "python").string();
  std::string file = folder + "/sitecustomize.py";
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  std::string text = fmt::format(kHook, fmt::arg("file", contract::kStacksFile),
                                 fmt::arg("signal", contract::kStacksSignal),
                                 fmt::arg("ready", contract::kStacksReady));
  std::ofstream out(file, std::ios::trunc);
  out << text;
  out.close();
  if (ec || !out) return absl::InternalError(fmt::format("cannot write the Python start-up hook {}", file));
  return folder;
}

std::string pythonPathWithHook(const std::map<std::string, std::string>& env, const std::string& hookDir) {
  auto it = env.find("PYTHONPATH");
  if (it == env.end() || it->second.empty()) return hookDir;
  return hookDir + ":" + it->second;
}

}  // namespace muster::launcher
