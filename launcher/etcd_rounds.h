// What EtcdRendezvous's two files share (internal to them): its log, its write deadline, and
// how a round's end is told in `state` and to the agent.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>
#include <spdlog/logger.h>

#include "common/deadline.h"
#include "muster/v1/rendezvous.pb.h"

namespace muster::launcher::etcd_rounds {

std::shared_ptr<spdlog::logger> logger();

// How long a write (a join key, a report, an answer, the state) may take: the cluster answers
// at once, or after an election.
inline constexpr Millis kWriteDeadline{10000};

// A value as etcd keeps it. Bytes that are not UTF-8 (a --role, a worker's failure message) are
// written as U+FFFD: nlohmann's dump() would throw on them, on the rendezvous thread.
inline std::string dumped(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The end of a round on account of `node` (of the running round's nodes, at `rank`; -1 for a
// node not in it).
::muster::v1::RoundEvent nodeEvent(::muster::v1::RoundEvent::Kind kind, const nlohmann::json& node, int rank,
                                   std::string message);

}  // namespace muster::launcher::etcd_rounds
