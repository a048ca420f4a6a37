// The etcd client's options as programs take them: the members' list, and TLS and auth under
// the keys torchrun's etcd backends name (protocol; cacert, cert, key as its "etcd" backend
// names them, or ca_cert, ssl_cert, ssl_cert_key as its "etcd-v2" does; etcd_prefix) with
// etcd's user and a password file (user, password_file). One reading for launch
// (--rdzv_endpoint, --rdzv_conf) and rendezvousctl (--etcd, --etcd-conf).
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "etcd/client.h"

namespace muster::etcd {

using Conf = std::map<std::string, std::string>;

// "KEY=VALUE,KEY=VALUE" -> its pairs, read as torchrun reads --rdzv_conf (every rendezvous
// backend's, launch's own and etcd's): spaces around the whole, a key and a value are not
// theirs; blank is no pair; a later key wins; a pair without a key or a value is one line
// naming `flag`.
absl::StatusOr<Conf> parseConf(const std::string& text, std::string_view flag);

// Checks what the client reads of `conf` without touching a file: protocol http or https (the
// default: https when the endpoints say so), cacert/cert/key (or their etcd-v2 names) only with
// https and not given twice, cert with key, password_file with user, etcd_prefix a path. Keys
// it does not read are left to the caller. Messages name `flag`.
absl::Status checkConf(const Conf& conf, bool httpsEndpoints, std::string_view flag);

// The endpoints parsed, `conf` checked and its files read: a file that cannot be read is one
// line naming the key and the file. Without password_file the password is
// MUSTER_ETCD_PASSWORD's, kept off command lines that every user of a host can read.
absl::StatusOr<Options> clientOptions(const std::string& endpoints, const Conf& conf, std::string_view flag);

}  // namespace muster::etcd
