#include "engine/dist/group_store.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <utility>

#include "absl/strings/str_cat.h"

namespace infoflow {

struct GroupStore::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

namespace {

std::string FirstLine(const std::exception& e) {
  std::string what = e.what();
  const size_t nl = what.find('\n');  // c10::Error appends a backtrace
  return nl == std::string::npos ? what : what.substr(0, nl);
}

std::vector<uint8_t> Bytes(const std::string& s) { return {s.begin(), s.end()}; }

}  // namespace

GroupStore::GroupStore(std::unique_ptr<Impl> impl, std::string host, int port)
    : impl_(std::move(impl)), host_(std::move(host)), port_(port) {}

GroupStore::~GroupStore() = default;

absl::StatusOr<std::unique_ptr<GroupStore>> GroupStore::Open(const std::string& host, int port,
                                                             bool serve,
                                                             std::chrono::milliseconds timeout) {
  if (port < 0 || port > 65535 || (!serve && port == 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dist-init port ", port, " invalid (0, an ephemeral port, only on rank 0)"));
  }
  auto impl = std::make_unique<Impl>();
  try {
    c10d::TCPStoreOptions o;
    o.port = static_cast<uint16_t>(port);
    o.isServer = serve;
    o.waitWorkers = false;  // ranks come and go; the group's own rendezvous waits
    o.timeout = timeout;
    impl->store = c10::make_intrusive<c10d::TCPStore>(host, o);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("group store ", host, ":", port, ": ",
                                               serve ? "cannot serve" : "cannot connect", ": ",
                                               FirstLine(e)));
  }
  const int bound = impl->store->getPort();
  return std::unique_ptr<GroupStore>(new GroupStore(std::move(impl), host, bound));
}

absl::Status GroupStore::Failed(const char* what, const std::string& key,
                                const std::exception& e) const {
  return absl::UnavailableError(
      absl::StrCat("group store ", host_, ":", port_, ": ", what, " '", key, "': ", FirstLine(e)));
}

absl::Status GroupStore::Set(const std::string& key, const std::string& value) {
  try {
    impl_->store->set(key, Bytes(value));
  } catch (const std::exception& e) {
    return Failed("set", key, e);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::string>> GroupStore::Get(const std::string& key) {
  try {
    if (!impl_->store->check({key})) return std::optional<std::string>();
    const std::vector<uint8_t> v = impl_->store->get(key);
    return std::optional<std::string>(std::string(v.begin(), v.end()));
  } catch (const std::exception& e) {
    return Failed("get", key, e);
  }
}

absl::StatusOr<int64_t> GroupStore::Add(const std::string& key, int64_t delta) {
  try {
    return impl_->store->add(key, delta);
  } catch (const std::exception& e) {
    return Failed("add", key, e);
  }
}

absl::StatusOr<bool> GroupStore::Contains(const std::string& key) {
  try {
    return impl_->store->check({key});
  } catch (const std::exception& e) {
    return Failed("check", key, e);
  }
}

absl::Status GroupStore::Delete(const std::string& key) {
  try {
    impl_->store->deleteKey(key);
  } catch (const std::exception& e) {
    return Failed("delete", key, e);
  }
  return absl::OkStatus();
}

}  // namespace infoflow
