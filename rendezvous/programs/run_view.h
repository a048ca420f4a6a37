// rendezvousctl's views of runs: `runs` (every run the service knows) and `status --run ID`
// (one run's nodes and ranks), as text for a terminal of a given width, or as JSON for scripts.
#pragma once

#include <string>

#include "muster/v1/rendezvous.pb.h"

namespace muster::rendezvous::view {

// "1h02m", "3m12s", "4.2 s", "180 ms": an age or a span, short.
std::string age(int64_t ms);
// "1.2 GiB", "312 MiB", "48 KiB".
std::string bytes(uint64_t n);

// A node's ages are as of its last report (heartbeat_age_ms ago): moves its running ranks'
// ages (up, last output, last file-timer request) on to now. Exited ranks keep theirs.
void asOfNow(::muster::v1::StatusReply& status);

// A table a run a line: id, state (with "forgotten in"), round, nodes present/min/max, ranks,
// age; each line cut at `width` columns (0: not cut).
std::string runsTable(const ::muster::v1::RunsReply& runs, int width = 0);
// The run's line, its stop's line when a node has one ("stopping on request (SIGUSR1 to a
// node's launch): every rank stops at step 1200"), then a line a node (group rank, host, its ranks, launch's pid and version,
// the last heartbeat's age, restarts left), each followed by its ranks' lines (pid, state, the
// age of its last output and file-timer request, resident memory, exit code) when the node
// sent them; cut at `width` columns.
std::string statusText(const ::muster::v1::StatusReply& status, int width = 0);

// The replies as JSON for scripts: the proto's field names, numbers as numbers, text as text
// (the wire's bytes fields, which protobuf's own mapping would write in base64), states as
// their names ("RUNNING").
std::string runsJson(const ::muster::v1::RunsReply& runs);
std::string statusJson(const ::muster::v1::StatusReply& status);

}  // namespace muster::rendezvous::view
