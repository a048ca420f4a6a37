// A C++ rank for the roll-call tests, linked with the worker library and so with its native
// stack handler: rank STUCK stands in stuck_in_native_loader(), the others in
// wait_for_the_others(), each with a helper thread in helper_thread_loop(). With a file
// named, every rank exits 0 once the file exists. FAIL_RANK=R: rank R exits with code 3
// instead, soon after it says it is ready.
//   stuck_worker STUCK [EXIT_WHEN_FILE]
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "worker/worker_env.h"

// Outside an anonymous namespace, and the program built with ENABLE_EXPORTS (-rdynamic): a
// native stack names a program's own functions from its dynamic symbols.
namespace {
std::string gExitFile;
bool told() { return !gExitFile.empty() && access(gExitFile.c_str(), F_OK) == 0; }
}  // namespace

__attribute__((noipa)) void helper_thread_loop() {
  while (!told()) usleep(20000);
}

__attribute__((noipa)) void stuck_in_native_loader() {
  while (!told()) usleep(20000);
}

__attribute__((noipa)) void wait_for_the_others() {
  while (!told()) usleep(20000);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: stuck_worker STUCK_RANK [EXIT_WHEN_FILE]\n");
    return 2;
  }
  auto env = muster::worker::WorkerEnv::fromProcess();
  if (!env.ok()) {
    std::fprintf(stderr, "stuck_worker: %s\n", std::string(env.status().message()).c_str());
    return 2;
  }
  int stuck = std::atoi(argv[1]);
  if (argc > 2) gExitFile = argv[2];
  std::thread helper(helper_thread_loop);
  std::printf("rank %d pid %d ready\n", env->rank, getpid());
  std::fflush(stdout);
  if (const char* fail = std::getenv("FAIL_RANK"); fail != nullptr && std::atoi(fail) == env->rank) {
    usleep(200000);  // the others are waiting by then
    _exit(3);        // (the helper thread is still running)
  }
  if (env->rank == stuck) {
    stuck_in_native_loader();
  } else {
    wait_for_the_others();
  }
  helper.join();
  return 0;
}
