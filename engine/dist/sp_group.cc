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
#include <chrono>
#include <cstdlib>
#include <thread>
#include <utility>
#ifdef INFOFLOW_WITH_NCCL
// CUDA builds only (engine/CMakeLists.txt defines both macros when the
// libtorch found has CUDA): Debian's CPU libtorch ships the header but not
// the library.
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace infoflow {

struct SequenceParallelGroup::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
  // The store under the group's key prefix: rendezvous and blame records.
  c10::intrusive_ptr<c10d::Store> control;
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  bool nccl = false;
  // Where the backend wants tensors: the CPU for Gloo, the rank's GPU for
  // NCCL. Tensors elsewhere are staged (copied over before a send, received
  // into a staging buffer and copied back after the wait).
  at::Device transport{at::kCPU};
};

struct PendingExchange::State {
  struct Op {
    int peer;
    bool is_send;
    c10::intrusive_ptr<c10d::Work> work;
    std::vector<at::Tensor> keep;  // the buffer stays alive until the op ends
    at::Tensor copy_back_to;       // a staged receive: its caller's tensor
  };
  std::vector<Op> ops;
  absl::Status error;  // set when posting already failed
};

bool DistHasNccl() {
#ifdef INFOFLOW_WITH_NCCL
  return true;
#else
  return false;
#endif
}

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
    impl->control = rendezvous;
    if (options.backend == "nccl") {
#ifdef INFOFLOW_WITH_NCCL
      // Blocking wait: Work::wait then honours the group timeout and throws
      // for a dead or stalled peer, as Gloo does (without it NCCL waits
      // forever).
      setenv("NCCL_BLOCKING_WAIT", "1", 0);
      auto no = c10d::ProcessGroupNCCL::Options::create();
      no->timeout = options.timeout;
      impl->transport = at::Device(options.device);
      impl->nccl = true;
      impl->pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(rendezvous, options.rank,
                                                             options.world_size, no);
      return std::unique_ptr<SequenceParallelGroup>(
          new SequenceParallelGroup(options, std::move(impl), port));
#else
      return absl::UnimplementedError(
          "backend nccl: this build has no NCCL (build with -DINFOFLOW_CUDA=ON against a CUDA "
          "libtorch)");
#endif
    }
    if (options.backend != "gloo") {
      return absl::InvalidArgumentError(
          absl::StrCat("backend must be gloo or nccl, got '", options.backend, "'"));
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
  const at::Device dev = impl_->transport;
  try {
#ifdef INFOFLOW_WITH_NCCL
    // NCCL pairs point-to-point calls in order, per peer; posted one by one, a
    // rank sending to and receiving from the same peer would wait on itself.
    // One group makes every send and receive of this exchange one operation.
    if (impl_->nccl) c10d::ProcessGroupNCCL::groupStart();
#endif
    for (size_t i = 0; i < sends.size(); ++i) {
      const at::Tensor& t = sends[i].second;
      if (!t.defined() || t.numel() == 0) continue;
      peer = sends[i].first, is_send = true;
      std::vector<at::Tensor> v{t.device() == dev ? t : t.to(dev).contiguous()};
      auto w = impl_->pg->send(v, peer, base + static_cast<int>(i));
      bytes_sent_ += static_cast<int64_t>(t.numel() * t.element_size());
      ex->ops.push_back({peer, true, w, v, {}});
    }
    for (size_t i = 0; i < recvs.size(); ++i) {
      const at::Tensor& t = recvs[i].second;
      if (!t.defined() || t.numel() == 0) continue;
      peer = recvs[i].first, is_send = false;
      const bool staged = t.device() != dev;
      std::vector<at::Tensor> v{staged ? at::empty(t.sizes(), t.options().device(dev)) : t};
      auto w = impl_->pg->recv(v, peer, base + static_cast<int>(i));
      ex->ops.push_back({peer, false, w, v, staged ? t : at::Tensor()});
    }
#ifdef INFOFLOW_WITH_NCCL
    if (impl_->nccl) c10d::ProcessGroupNCCL::groupEnd();
#endif
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
        if (op.copy_back_to.defined()) op.copy_back_to.copy_(op.keep[0]);
        continue;
      }
    } catch (const std::exception& e) {
      const std::string brief = Brief(e);
      error_ = BlameChain(op.peer, brief.find("Timed out") != std::string::npos,
                          absl::StrCat(op.is_send ? "send to" : "receive from",
                                       " it failed (group timeout ", options_.timeout.count(),
                                       " ms): ", brief));
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

absl::Status SequenceParallelGroup::BlameChain(int peer, bool timed_out,
                                               const std::string& what) {
  // A record is "<peer> t" (timed out waiting on it) or "<peer> c" (lost the
  // connection to it).
  auto key = [](int r) { return "infoflow_blame/" + std::to_string(r); };
  int culprit = peer;
  std::string via;
  try {
    const std::string mine = absl::StrCat(peer, timed_out ? " t" : " c");
    impl_->control->set(key(rank()), std::vector<uint8_t>(mine.begin(), mine.end()));
    // Followed for a closed connection too: a rank whose own wait failed
    // breaks its connections (Gloo), so its peers may see a close from a
    // rank that was itself waiting (a fresh-clone run saw exactly that). A
    // rank that died records nothing and is named after the wait.
    const auto patience = std::min<std::chrono::milliseconds>(options_.timeout / 2,
                                                              std::chrono::milliseconds(2000));
    std::vector<bool> seen(static_cast<size_t>(world_size()), false);
    seen[static_cast<size_t>(rank())] = true;
    while (!seen[static_cast<size_t>(culprit)]) {
      seen[static_cast<size_t>(culprit)] = true;
      const auto until = std::chrono::steady_clock::now() + patience;
      bool recorded = false;
      while (!(recorded = impl_->control->check({key(culprit)})) &&
             std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (!recorded) break;  // it recorded nothing: stalled or gone
      const std::vector<uint8_t> v = impl_->control->get(key(culprit));
      const std::vector<std::string> parts = absl::StrSplit(std::string(v.begin(), v.end()), ' ');
      int next = -1;
      if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &next) || next < 0 ||
          next >= world_size() || next == rank()) {
        break;
      }
      absl::StrAppend(&via, via.empty() ? "" : ", ", "rank ", culprit,
                      parts[1] == "t" ? " timed out on rank " : " lost its connection to rank ",
                      next);
      culprit = next;
    }
  } catch (const std::exception&) {
    // The store is unreachable (rank 0 gone or stopped): name the direct peer.
  }
  if (culprit == peer) return absl::UnavailableError(absl::StrCat("rank ", peer, ": ", what));
  return absl::UnavailableError(absl::StrCat("rank ", culprit,
                                             ": stalled or gone, recorded no failure of its own (",
                                             via, "); here: rank ", peer, ": ", what));
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
