#ifndef INFOFLOW_TESTS_STORE_STORE_TEST_UTIL_H_
#define INFOFLOW_TESTS_STORE_STORE_TEST_UTIL_H_

#include <filesystem>
#include <random>
#include <string>

#include "gtest/gtest.h"

namespace infoflow::store::testing {

// A fresh directory under the gtest temp dir, removed on destruction.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::path(::testing::TempDir()) /
            ("store_test_" + std::to_string(rd()) + "_" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string path() const { return (path_ / "kv").string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace infoflow::store::testing

#endif  // INFOFLOW_TESTS_STORE_STORE_TEST_UTIL_H_
