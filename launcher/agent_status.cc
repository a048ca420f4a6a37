// Agent: what this node says of itself and its ranks to the rendezvous, for
// `rendezvousctl status`: launch's pid and version, the restarts left, and each rank's pid,
// state, the age of its last output and file-timer request, resident memory and exit.
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "common/build_info.h"
#include "launcher/agent.h"

namespace muster::launcher {

namespace {

namespace pb = ::muster::v1;

int64_t agoMs(std::chrono::steady_clock::time_point t, std::chrono::steady_clock::time_point now) {
  if (t == std::chrono::steady_clock::time_point{}) return -1;
  return std::chrono::duration_cast<std::chrono::milliseconds>(now - t).count();
}

// Resident memory of `pid` from /proc/PID/statm (its second field, in pages); 0 when gone.
uint64_t residentBytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/statm");
  uint64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace

void Agent::onTimerRequest(pid_t pid) {
  progress();
  if (!group_) return;
  for (const auto& w : group_->workers()) {
    if (w->pid == pid) w->lastTimer = std::chrono::steady_clock::now();
  }
}

void Agent::publishStatus() {
  if (!rdzv_) return;
  pb::NodeStatus status;
  status.set_launch_pid(static_cast<int32_t>(getpid()));
  status.set_version(build::versionAndCommit());
  status.set_restarts_left(std::max(0, options_.maxRestarts - at_.restartCount));
  auto now = std::chrono::steady_clock::now();
  if (group_) {
    for (const auto& w : group_->workers()) {
      auto* r = status.add_ranks();
      r->set_rank(w->spec.globalRank);
      r->set_local_rank(w->spec.localRank);
      r->set_pid(w->pid);
      r->set_age_ms(agoMs(w->started, w->exit ? w->exit->at : now));
      r->set_output_age_ms(agoMs(w->lastOutput, now));
      r->set_timer_age_ms(agoMs(w->lastTimer, now));
      if (w->exit) {
        bool ok = w->exit->code == 0 && w->exit->signal == 0;
        r->set_state(ok ? pb::RankStatus::SUCCEEDED : pb::RankStatus::FAILED);
        r->set_exit_code(w->exit->signal != 0 ? 128 + w->exit->signal : w->exit->code);
      } else {
        r->set_state(stopping_ == Stopping::kNo ? pb::RankStatus::RUNNING : pb::RankStatus::STOPPING);
        r->set_rss_bytes(residentBytes(w->pid));
      }
    }
  }
  if (stop_) {
    auto* stop = status.mutable_stop();
    stop->set_reason(reasonName(stop_->reason));
    stop->set_agreed(stop_->step >= 0);
    stop->set_step(std::max<int64_t>(stop_->step, 0));
    if (stop_->failed) stop->set_failed(*stop_->failed);
  }
  rdzv_->setStatus(status);
}

void Agent::armStatusTimer() {
  if (!rdzv_) return;
  // Fresh for each keep-alive that carries it: once a second, or each keep-alive if more often.
  statusTimer_.expires_after(std::min<std::chrono::steady_clock::duration>(options_.rdzvConf.keepAliveInterval,
                                                                           std::chrono::seconds(1)));
  statusTimer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || stopping_ == Stopping::kDone) return;
    publishStatus();
    armStatusTimer();
  });
}

}  // namespace muster::launcher
