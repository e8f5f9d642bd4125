// Helpers shared by the reliability test binaries (tests/reliability):
// the generated model they serve, temp dirs, chunk texts, clients, queries.
#ifndef INFOFLOW_TESTS_RELIABILITY_RELIABILITY_UTIL_H_
#define INFOFLOW_TESTS_RELIABILITY_RELIABILITY_UTIL_H_

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/client.h"
#include "engine/model/test_model.h"
#include "infoflow/v1/infoflow.grpc.pb.h"
#include "tests/reliability/server_process.h"

namespace infoflow {

namespace fs = std::filesystem;
namespace v1 = ::infoflow::v1;
using testing::ServerProcess;

inline int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

inline std::string ModelDir() {
  static const std::string dir = [] {
    const std::string d = std::string(INFOFLOW_TEST_DATA_DIR) + "/reliability_model";
    if (!fs::exists(d + "/config.json")) {
      // Several test binaries may get here at once: write aside, then rename
      // (atomic; the loser's copy is dropped).
      const std::string tmp = d + ".tmp-" + std::to_string(getpid());
      absl::Status s = WriteTestModel(tmp, TestModelSpec{});
      if (!s.ok()) {
        std::fprintf(stderr, "WriteTestModel: %s\n", s.ToString().c_str());
        std::abort();
      }
      std::error_code ec;
      fs::rename(tmp, d, ec);
      if (ec) fs::remove_all(tmp, ec);
    }
    return d;
  }();
  return dir;
}

struct TempDir {
  explicit TempDir(const std::string& name)
      : path((fs::temp_directory_path() /
              ("infoflow_rel_" + std::to_string(getpid()) + "_" + name))
                 .string()) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string path;
};

inline const char* const kWords[] = {"river", "lamp",  "garden", "copper", "window", "orange", "street",
                        "quiet", "north", "bridge", "winter", "letter", "silver", "market",
                        "forest", "engine", "paper", "yellow", "harbor", "candle"};

// A distinct chunk text of ~20-30 tokens for a tag like "r3b7c1".
inline std::string ChunkText(const std::string& tag, uint32_t seed) {
  std::string t = "Note " + tag + ":";
  uint32_t x = seed * 2654435761u + 12345u;
  for (int i = 0; i < 12; ++i) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    t += " ";
    t += kWords[x % (sizeof kWords / sizeof kWords[0])];
  }
  return t + ".";
}

inline client::Client MakeClient(const ServerProcess& s, int64_t timeout_ms = 30000) {
  client::ClientOptions o;
  o.address = s.address();
  o.timeout_ms = timeout_ms;
  return client::Client(o);
}

inline v1::QueryRequest QueryKeys(const std::vector<std::string>& keys, v1::Method m = v1::METHOD_NONE) {
  v1::QueryRequest req;
  for (const std::string& k : keys) req.add_chunks()->set_key(k);
  req.set_question("Which street has the copper lamp?");
  req.set_method(m);
  req.set_max_new_tokens(1);
  req.set_return_report(true);
  return req;
}

inline absl::StatusOr<v1::Report> RunQuery(client::Client& c, const v1::QueryRequest& req) {
  return c.Query(req, [](const v1::TokenEvent&) {});
}

inline std::string ServerBin() { return INFOFLOW_SERVER_BIN; }

}  // namespace infoflow

#endif  // INFOFLOW_TESTS_RELIABILITY_RELIABILITY_UTIL_H_
