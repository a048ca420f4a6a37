// launch's flags for etcd as the etcd client's options: the endpoints of --rdzv_endpoint, and
// --rdzv_conf's TLS (torchrun's etcd keys: protocol, cacert, cert, key) and auth (user,
// password_file) with the files read.
#pragma once

#include "absl/status/statusor.h"
#include "etcd/client.h"
#include "launcher/options.h"

namespace muster::launcher {

// A file that cannot be read is one line naming the key and the file.
absl::StatusOr<etcd::Options> etcdClientOptions(const LaunchOptions& options);

}  // namespace muster::launcher
