#include "engine/dist/sp_group.h"

// The Gloo backend's header is guarded by the macro the libtorch build
// defines for itself; Debian's libtorch is built with Gloo.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1
#endif
#include <algorithm>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <utility>

#include "absl/strings/str_cat.h"

namespace infoflow {

struct SequenceParallelGroup::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
};

struct PendingExchange::State {
  struct Op {
    int peer;
    bool is_send;
    c10::intrusive_ptr<c10d::Work> work;
    std::vector<at::Tensor> keep;  // the buffer stays alive until the op ends
  };
  std::vector<Op> ops;
  absl::Status error;  // set when posting already failed
};

PendingExchange::PendingExchange() : state_(std::make_unique<State>()) {}
PendingExchange::~PendingExchange() = default;

namespace {

std::string Brief(const std::exception& e) {
  std::string what = e.what();
  // c10::Error appends a C++ backtrace; the first line says what happened.
  const size_t nl = what.find('\n');
  return nl == std::string::npos ? what : what.substr(0, nl);
}

}  // namespace

SequenceParallelGroup::SequenceParallelGroup(GroupOptions options, std::unique_ptr<Impl> impl,
                                             int port)
    : options_(std::move(options)), impl_(std::move(impl)), port_(port) {}

SequenceParallelGroup::~SequenceParallelGroup() {
  // A broken group may still have receives posted to a dead peer; Gloo's
  // teardown can then block on them. The process is about to exit or
  // rebuild the group: leak the handles instead of risking a hang.
  if (broken() && impl_) {
    (void)impl_->pg.release();
    (void)impl_->store.release();
    (void)impl_.release();
  }
}

absl::StatusOr<std::unique_ptr<SequenceParallelGroup>> SequenceParallelGroup::Join(
    const GroupOptions& options) {
  if (options.world_size < 1 || options.world_size > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size must be in [1, 1024], got ", options.world_size));
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank must be in [0, ", options.world_size, "), got ", options.rank));
  }
  if (options.port < 0 || options.port > 65535 ||
      ((options.rank != 0 || options.use_existing_store) && options.port == 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dist-init port ", options.port, " invalid (0 only on rank 0)"));
  }
  auto impl = std::make_unique<Impl>();
  int port = options.port;
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(options.port);
    so.isServer = options.rank == 0 && !options.use_existing_store;
    so.numWorkers = options.world_size;
    so.waitWorkers = false;  // the process group's rendezvous waits instead
    so.timeout = options.timeout;
    impl->store = c10::make_intrusive<c10d::TCPStore>(options.host, so);
    port = impl->store->getPort();
    if (options.rank == 0 && options.on_store_ready) options.on_store_ready(port);
    c10::intrusive_ptr<c10d::Store> rendezvous = impl->store;
    if (!options.key_prefix.empty()) {
      rendezvous = c10::make_intrusive<c10d::PrefixStore>(options.key_prefix, impl->store);
    }
    auto go = c10d::ProcessGroupGloo::Options::create(options.timeout);
    // The device is this rank's own address: the store's host only when
    // every rank is on this machine (loopback).
    const std::string& h = options.host;
    const bool loopback = h == "localhost" || h == "::1" || h.rfind("127.", 0) == 0;
    if (!options.interface.empty()) {
      go->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(options.interface));
    } else if (loopback) {
      go->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(h));
    } else {
      go->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    go->threads = 1;  // collectives are ours (send/recv); no worker pool needed
    impl->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(rendezvous, options.rank,
                                                           options.world_size, go);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("rank ", options.rank, ": joining the group at ",
                                               options.host, ":", port, " failed: ", Brief(e)));
  }
  return std::unique_ptr<SequenceParallelGroup>(
      new SequenceParallelGroup(options, std::move(impl), port));
}

std::unique_ptr<PendingExchange> SequenceParallelGroup::Start(
    const std::vector<std::pair<int, at::Tensor>>& sends,
    const std::vector<std::pair<int, at::Tensor>>& recvs) {
  auto ex_holder = std::make_unique<PendingExchange>();
  PendingExchange::State* ex = ex_holder->state_.get();
  // Message i of a Start gets tag base + i on both sides.
  const int base = static_cast<int>(tag_ & 0x3fffffffu);
  tag_ += static_cast<uint32_t>(std::max<size_t>(64, std::max(sends.size(), recvs.size())));
  if (broken()) {
    ex->error = error_;
    return ex_holder;
  }
  int peer = -1;
  bool is_send = true;
  try {
    for (size_t i = 0; i < sends.size(); ++i) {
      const at::Tensor& t = sends[i].second;
      if (!t.defined() || t.numel() == 0) continue;
      peer = sends[i].first, is_send = true;
      std::vector<at::Tensor> v{t};
      auto w = impl_->pg->send(v, peer, base + static_cast<int>(i));
      bytes_sent_ += static_cast<int64_t>(t.numel() * t.element_size());
      ex->ops.push_back({peer, true, w, v});
    }
    for (size_t i = 0; i < recvs.size(); ++i) {
      const at::Tensor& t = recvs[i].second;
      if (!t.defined() || t.numel() == 0) continue;
      peer = recvs[i].first, is_send = false;
      std::vector<at::Tensor> v{t};
      auto w = impl_->pg->recv(v, peer, base + static_cast<int>(i));
      ex->ops.push_back({peer, false, w, v});
    }
  } catch (const std::exception& e) {
    ex->error = absl::UnavailableError(absl::StrCat(
        "rank ", peer, ": ", is_send ? "send to" : "receive from", " it failed: ", Brief(e)));
    error_ = ex->error;
  }
  return ex_holder;
}

absl::Status SequenceParallelGroup::Wait(std::unique_ptr<PendingExchange> holder) {
  PendingExchange::State* ex = holder->state_.get();
  if (!ex->error.ok()) return ex->error;
  for (PendingExchange::State::Op& op : ex->ops) {
    try {
      if (!broken()) {
        op.work->wait(options_.timeout);
        continue;
      }
    } catch (const std::exception& e) {
      error_ = absl::UnavailableError(
          absl::StrCat("rank ", op.peer, ": ", op.is_send ? "send to" : "receive from",
                       " it failed (group timeout ", options_.timeout.count(), " ms): ", Brief(e)));
    }
    // Broken: the buffers of unfinished ops must outlive the backend's use.
    for (PendingExchange::State::Op& rest : ex->ops) {
      new std::vector<at::Tensor>(std::move(rest.keep));  // deliberately leaked
      (void)rest.work.release();
    }
    return error_;
  }
  return absl::OkStatus();
}

std::unique_ptr<PendingExchange> SequenceParallelGroup::StartRingExchange(
    const std::vector<at::Tensor>& send, const std::vector<at::Tensor>& recv) {
  std::vector<std::pair<int, at::Tensor>> s, r;
  for (const at::Tensor& t : send) s.push_back({next(), t});
  for (const at::Tensor& t : recv) r.push_back({prev(), t});
  return Start(s, r);
}

absl::Status SequenceParallelGroup::Exchange(const std::vector<std::pair<int, at::Tensor>>& sends,
                                             const std::vector<std::pair<int, at::Tensor>>& recvs) {
  for (const auto& [peer, t] : sends) {
    if (t.defined() && (peer < 0 || peer >= world_size() || peer == rank())) {
      return absl::InvalidArgumentError(absl::StrCat("Exchange: bad peer ", peer));
    }
  }
  for (const auto& [peer, t] : recvs) {
    if (t.defined() && (peer < 0 || peer >= world_size() || peer == rank())) {
      return absl::InvalidArgumentError(absl::StrCat("Exchange: bad peer ", peer));
    }
  }
  return Wait(Start(sends, recvs));
}

absl::Status SequenceParallelGroup::Broadcast(at::Tensor* t, int root) {
  // Message to rank p is number p on both sides.
  const int n = world_size();
  std::vector<std::pair<int, at::Tensor>> s(n), r(n);
  if (rank() == root) {
    for (int p = 0; p < n; ++p) {
      if (p != root) s[p] = {p, *t};
    }
  } else {
    r[rank()] = {root, *t};
  }
  return Wait(Start(s, r));
}

absl::StatusOr<std::vector<at::Tensor>> SequenceParallelGroup::AllGather(
    const at::Tensor& local, const std::vector<int64_t>& rows) {
  const int n = world_size();
  std::vector<at::Tensor> out(n);
  std::vector<std::pair<int, at::Tensor>> s, r;
  // The message from rank a to rank b is number a * n + b on both sides.
  s.resize(static_cast<size_t>(n) * n);
  r.resize(static_cast<size_t>(n) * n);
  std::vector<int64_t> shape = local.sizes().vec();
  for (int p = 0; p < n; ++p) {
    if (p == rank()) {
      out[p] = local;
      continue;
    }
    shape[0] = rows[p];
    out[p] = at::empty(shape, local.options());
    s[static_cast<size_t>(rank()) * n + p] = {p, local};
    r[static_cast<size_t>(p) * n + rank()] = {p, out[p]};
  }
  if (absl::Status st = Wait(Start(s, r)); !st.ok()) return st;
  return out;
}

absl::StatusOr<std::vector<at::Tensor>> SequenceParallelGroup::Gather(
    const at::Tensor& local, const std::vector<int64_t>& rows, int root) {
  const int n = world_size();
  std::vector<at::Tensor> out(n);
  std::vector<std::pair<int, at::Tensor>> s(n), r(n);
  std::vector<int64_t> shape = local.sizes().vec();
  if (rank() == root) {
    for (int p = 0; p < n; ++p) {
      if (p == root) {
        out[p] = local;
        continue;
      }
      shape[0] = rows[p];
      out[p] = at::empty(shape, local.options());
      r[p] = {p, out[p]};
    }
  } else {
    s[rank()] = {root, local};
  }
  if (absl::Status st = Wait(Start(s, r)); !st.ok()) return st;
  return out;
}

}  // namespace infoflow
