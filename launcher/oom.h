// Whether the kernel's OOM killer ended a worker: the kernel log (/dev/kmsg: "Killed process
// PID (name)") and the memory cgroup launch runs in (the OOM kills counted there since the
// round started: cgroup v2's memory.events, v1's memory.oom_control).
#pragma once

#include <sys/types.h>

#include <map>
#include <string>

namespace muster::launcher {

// Thread-safety: one thread. Lifetime: holds /dev/kmsg open (read from where it stood at the
// start; without the right to read it, only the cgroup is asked).
class OomWitness {
 public:
  OomWitness();
  ~OomWitness();
  OomWitness(const OomWitness&) = delete;
  OomWitness& operator=(const OomWitness&) = delete;

  // Notes the cgroup's OOM kill count now (call as a round starts).
  void baseline();
  // For a worker SIGKILL ended: "" when nothing says it was the OOM killer, else the evidence
  // ("the kernel's OOM killer killed it (Memory cgroup out of memory: Killed process 4242
  // (python3) total-vm:..., anon-rss:...)").
  std::string explain(pid_t pid);

 private:
  void readLog();
  long cgroupKills(std::string* where) const;

  int kmsg_ = -1;
  std::map<pid_t, std::string> killed_;  // from the kernel log
  long baseline_ = 0;
};

}  // namespace muster::launcher
