// infoflow stats: model info and store statistics of a running server.
#include <algorithm>
#include <cstdio>

#include "client/cli_common.h"
#include "client/commands.h"
#include "client/flags.h"

namespace infoflow::cli {

int RunStats(int argc, char** argv) {
  Flags flags;
  std::set<std::string> value_flags = kConnectFlags;
  if (!flags.Parse(argc, argv, value_flags, {"help"}) || flags.Has("help")) {
    if (!flags.Has("help")) std::fprintf(stderr, "infoflow stats: %s\n", flags.error().c_str());
    std::fprintf(flags.Has("help") ? stdout : stderr, "usage: infoflow stats [--server ADDR]\n%s",
                 kConnectUsage);
    return flags.Has("help") ? 0 : 2;
  }
  auto options = MakeClientOptions(flags.Get("server"), flags.Get("token-file"), flags.Get("tls-ca"),
                                   flags.Get("timeout-ms"));
  if (!options.ok()) {
    std::fprintf(stderr, "infoflow stats: %s\n", std::string(options.status().message()).c_str());
    return 2;
  }
  client::Client c(*options);
  auto info = c.ModelInfo();
  auto stats = info.ok() ? c.Stats() : absl::StatusOr<infoflow::v1::StatsResponse>(info.status());
  if (!stats.ok()) {
    std::fprintf(stderr, "infoflow stats: %s\n", stats.status().ToString().c_str());
    return 1;
  }
  std::printf("model        %s (%s, %d layers, %s on %s)\n", info->name().c_str(),
              info->model_type().c_str(), info->n_layers(), info->dtype().c_str(),
              info->device().c_str());
  std::printf("fingerprint  %s\n", info->fingerprint().c_str());
  std::printf("kv codec     %s: %.0f bytes/token stored (%.0f in %s, %.2fx smaller)\n",
              info->kv_codec().c_str(), info->kv_bytes_per_token(),
              info->raw_kv_bytes_per_token(), info->dtype().c_str(),
              info->raw_kv_bytes_per_token() / std::max(info->kv_bytes_per_token(), 1e-9));
  std::printf("records      %llu (%llu bytes; disk %llu bytes)\n",
              static_cast<unsigned long long>(stats->records()),
              static_cast<unsigned long long>(stats->bytes()),
              static_cast<unsigned long long>(stats->disk_bytes()));
  std::printf("hits         ram %llu, disk %llu; misses %llu; corrupt %llu; evictions %llu\n",
              static_cast<unsigned long long>(stats->ram_hits()),
              static_cast<unsigned long long>(stats->disk_hits()),
              static_cast<unsigned long long>(stats->misses()),
              static_cast<unsigned long long>(stats->corrupt()),
              static_cast<unsigned long long>(stats->evictions()));
  std::printf("io           read %llu bytes, written %llu bytes; ram tier %llu bytes\n",
              static_cast<unsigned long long>(stats->bytes_read()),
              static_cast<unsigned long long>(stats->bytes_written()),
              static_cast<unsigned long long>(stats->ram_bytes()));
  return 0;
}

}  // namespace infoflow::cli
