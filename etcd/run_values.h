// The JSON values launch writes at a run's keys in etcd (etcd/run_keys.h), and the checks that
// a value read back has their shape. Anyone holding the run's etcd credentials can write there
// (another program, a hand edit, a launch of another version), and nlohmann's value(key, default)
// throws on a field of the wrong type and casts a number out of its type's range: every reader
// (launch's etcd rendezvous, the run views, the roll-call) checks a value first, and may then
// read each field named here with value(key, default) of the type named, index `nodes` where it
// is required, and add up the ranks in an int. A value that fails is one line naming the field.
//
//   state            {"round": uint64, "phase": string, "min": int 1.., "max": int min..,
//                     "since": int64 >= 0 (Unix ms), "nodes": [join value] (required and not
//                     empty when "phase" is "running"; ranks in all < 2^31),
//                     "event": round event (required when "phase" is "ended")}
//   round event      {"kind": int >= 0 (a RoundEvent kind), "node": string, "host": string,
//                     "group_rank": int >= -1, "exit_code": int, "message": string}
//   join/<r>/<node>  {"id": string, not empty, "host": string, "local_world_size": int 1..,
//                     "master_port": int 0..65535 (these four required), "store_port": int
//                     0..65535, "role": string, "min", "max" as in state}
//   report/<r>/<n>   {"outcome": "succeeded" | "failed", "exit_code": int, "message": string}
//   status/<node>    {"unix_ms": int64 >= 0, "round": uint64, "status": object}
// Fields not named here may be present (a later version's); fields named and absent read as
// the readers' defaults, but for those marked required.
#pragma once

#include <nlohmann/json.hpp>

#include "absl/status/status.h"

namespace muster::etcd {

// OK, or INVALID_ARGUMENT whose message names the field and what it should hold.
absl::Status checkState(const nlohmann::json& value);
absl::Status checkRoundEvent(const nlohmann::json& value);
absl::Status checkJoin(const nlohmann::json& value);
absl::Status checkReport(const nlohmann::json& value);
absl::Status checkStatus(const nlohmann::json& value);

}  // namespace muster::etcd
