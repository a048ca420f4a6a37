// What --rdzv_endpoint and --rdzv_conf say to the etcd client (endpoints, KEY=VALUE pairs, the
// checks made before any file is read), and the escaping of a run id into etcd's keys: ids that
// differ have keys that differ, and an id never adds a level to the key.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <string>

#include "etcd/client.h"
#include "etcd/options.h"
#include "etcd/run_keys.h"

using namespace muster::etcd;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider p(data, size);
  switch (p.ConsumeIntegralInRange(0, 2)) {
    case 0: {
      bool https = false;
      auto endpoints = parseEndpoints(p.ConsumeRemainingBytesAsString(), &https);
      if (endpoints.ok() && endpoints->empty()) __builtin_trap();
      break;
    }
    case 1: {
      bool https = p.ConsumeBool();
      auto conf = parseConf(p.ConsumeRemainingBytesAsString(), "--rdzv_conf");
      if (conf.ok()) (void)checkConf(*conf, https, "--rdzv_conf");
      break;
    }
    default: {
      std::string a = p.ConsumeRandomLengthString(64), b = p.ConsumeRemainingBytesAsString();
      std::string pa = runPrefix(a), pb = runPrefix(b);
      if ((a == b) != (pa == pb)) __builtin_trap();
      const std::string root = "/muster/runs/";
      if (pa.compare(0, root.size(), root) != 0) __builtin_trap();
      std::string id = pa.substr(root.size());
      if (!id.empty() && id.back() == '/') id.pop_back();
      if (id.find('/') != std::string::npos) __builtin_trap();
      break;
    }
  }
  return 0;
}
