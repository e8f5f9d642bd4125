#include "server/group/group_worker.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/dist/sp_pipeline.h"
#include "engine/model/stopwatch.h"
#include "server/group/shard_chunks.h"

namespace infoflow::server {
namespace {

using Clock = std::chrono::steady_clock;

// Commands are polled: a query's first step on this rank waits at most this.
constexpr std::chrono::milliseconds kCommandPoll{2};
// While serving, how often the worker checks that rank 0 has not moved on
// to a new generation without it.
constexpr std::chrono::milliseconds kGenerationPoll{100};
constexpr std::chrono::seconds kWaitingLogPeriod{10};

}  // namespace

GroupWorker::GroupWorker(const GroupConfig& config, const Model* model, const Tokenizer* tokenizer,
                         store::ChunkStore* store, std::function<void(bool)> on_serving)
    : config_(config),
      model_(model),
      tokenizer_(tokenizer),
      store_(store),
      on_serving_(std::move(on_serving)) {
  SetServing(false);
  thread_ = std::thread([this] { Run(); });
  heartbeat_ = std::thread([this] { Heartbeats(); });
}

GroupWorker::~GroupWorker() { Stop(); }

void GroupWorker::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (heartbeat_.joinable()) heartbeat_.join();
}

bool GroupWorker::Sleep(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait_for(l, d, [&] { return stop_; });
  return !stop_;
}

void GroupWorker::SetServing(bool s) {
  serving_ = s;
  if (on_serving_) on_serving_(s);
}

void GroupWorker::Heartbeats() {
  const auto period = std::clamp<std::chrono::milliseconds>(
      config_.timeout / 10, std::chrono::milliseconds(50), std::chrono::milliseconds(1000));
  while (Sleep(period)) {
    std::shared_ptr<GroupStore> c;
    {
      std::lock_guard<std::mutex> l(mu_);
      c = control_;
    }
    if (c) (void)c->Add(group_keys::Heartbeat(config_.rank), 1);
  }
}

void GroupWorker::Run() {
  // The control connection's operations fail after this long: a stopped or
  // dead rank 0 is noticed within it, and Stop() is never held up longer.
  const auto op_timeout =
      std::min<std::chrono::milliseconds>(config_.timeout, std::chrono::milliseconds(5000));
  Clock::time_point last_log = Clock::now() - kWaitingLogPeriod;
  std::fprintf(stderr, "event=group_start rank=%d world_size=%d dist_init=%s:%d\n", config_.rank,
               config_.world_size, config_.host.c_str(), config_.port);
  while (true) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stop_) return;
    }
    absl::StatusOr<std::unique_ptr<GroupStore>> opened =
        GroupStore::Open(config_.host, config_.port, /*serve=*/false, op_timeout);
    if (!opened.ok()) {
      if (Clock::now() - last_log > kWaitingLogPeriod) {
        std::fprintf(stderr, "event=group_waiting rank=%d for=rank0 reason=\"%s\"\n", config_.rank,
                     std::string(opened.status().message()).c_str());
        last_log = Clock::now();
      }
      if (!Sleep(std::chrono::milliseconds(500))) return;
      continue;
    }
    std::shared_ptr<GroupStore> control(*std::move(opened));
    {
      std::lock_guard<std::mutex> l(mu_);
      control_ = control;
    }
    const absl::Status s = Serve(control.get());
    {
      std::lock_guard<std::mutex> l(mu_);
      control_.reset();
    }
    SetServing(false);
    if (!Sleep(std::chrono::milliseconds(200))) return;
    std::fprintf(stderr, "event=group_lost_rank0 rank=%d reason=\"%s\" (reconnecting)\n",
                 config_.rank, std::string(s.message()).c_str());
    last_log = Clock::now();
  }
}

absl::Status GroupWorker::Serve(GroupStore* control) {
  int64_t done_gen = 0;  // generations at or below this are over for us
  while (true) {
    absl::StatusOr<std::optional<std::string>> g = control->Get(group_keys::Generation());
    if (!g.ok()) return g.status();
    int64_t gen = 0;
    if (!g->has_value() || !absl::SimpleAtoi(**g, &gen) || gen <= done_gen) {
      if (!Sleep(std::chrono::milliseconds(50))) return absl::OkStatus();
      continue;
    }
    if (absl::Status s = control->Set(group_keys::Ready(gen, config_.rank), "1"); !s.ok()) return s;
    bool go = false;
    while (true) {
      absl::StatusOr<bool> has = control->Contains(group_keys::Go(gen));
      if (!has.ok()) return has.status();
      if (*has) {
        go = true;
        break;
      }
      absl::StatusOr<std::optional<std::string>> now = control->Get(group_keys::Generation());
      if (!now.ok()) return now.status();
      if (!now->has_value() || **now != std::to_string(gen)) break;  // rank 0 moved on
      if (!Sleep(std::chrono::milliseconds(20))) return absl::OkStatus();
    }
    if (!go) continue;

    const GroupOptions o = GroupOptionsFor(config_, gen);
    absl::StatusOr<std::unique_ptr<SequenceParallelGroup>> joined = SequenceParallelGroup::Join(o);
    done_gen = gen;
    if (!joined.ok()) {
      std::fprintf(stderr, "event=group_join_failed rank=%d generation=%lld reason=\"%s\"\n",
                   config_.rank, static_cast<long long>(gen),
                   std::string(joined.status().message()).c_str());
      continue;
    }
    std::unique_ptr<SequenceParallelGroup> group = *std::move(joined);
    std::fprintf(stderr, "event=group_joined rank=%d generation=%lld\n", config_.rank,
                 static_cast<long long>(gen));
    SetServing(true);
    absl::Status lost;
    int64_t seq = 0;
    Clock::time_point gen_checked = Clock::now();
    while (true) {
      absl::StatusOr<std::optional<std::string>> cmd = control->Get(group_keys::Command(gen, seq));
      if (!cmd.ok()) {
        lost = cmd.status();
        break;
      }
      if (cmd->has_value()) {
        // A rank that was stopped may find a command its group has given
        // up on: only run it while rank 0 is still on this generation.
        absl::StatusOr<std::optional<std::string>> now = control->Get(group_keys::Generation());
        if (!now.ok()) {
          lost = now.status();
          break;
        }
        if (!now->has_value() || **now != std::to_string(gen)) break;
        absl::StatusOr<GroupCommand> decoded = DecodeGroupCommand(**cmd);
        if (!decoded.ok() || decoded->seq != seq) {
          // Out of step with rank 0: this generation cannot go on with us.
          std::fprintf(
              stderr, "event=group_bad_command rank=%d seq=%lld reason=\"%s\"\n", config_.rank,
              static_cast<long long>(seq),
              decoded.ok() ? "sequence number" : std::string(decoded.status().message()).c_str());
          break;
        }
        ++seq;
        const absl::Status s = RunCommand(group.get(), *decoded);
        // A failed exchange (broken) or an engine error (aborted) leaves
        // the ranks out of step: this generation is over.
        if (!s.ok() && (group->broken() || absl::IsAborted(s))) break;
        continue;
      }
      if (Clock::now() - gen_checked > kGenerationPoll) {
        absl::StatusOr<std::optional<std::string>> now = control->Get(group_keys::Generation());
        if (!now.ok()) {
          lost = now.status();
          break;
        }
        if (!now->has_value() || **now != std::to_string(gen)) break;  // rank 0 regrouped
        gen_checked = Clock::now();
      }
      if (!Sleep(kCommandPoll)) break;
    }
    SetServing(false);
    // Peers may be gone: no teardown (it could block on them).
    (void)group.release();
    std::fprintf(stderr, "event=group_left rank=%d generation=%lld\n", config_.rank,
                 static_cast<long long>(gen));
    if (!lost.ok()) return lost;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stop_) return absl::OkStatus();
    }
  }
}

absl::Status GroupWorker::RunCommand(SequenceParallelGroup* group, const GroupCommand& cmd) {
  const Clock::time_point t0 = Clock::now();
  absl::Status status;
  SharedShard shard;
  try {
    const ShardLayout layout = SplitChunks(
        cmd.chunk_lengths, static_cast<int64_t>(cmd.prefix_ids.size()), config_.world_size);
    absl::StatusOr<SharedShard> got =
        ShareChunks(group, *model_, store_, layout, cmd.chunk_keys, cmd.chunk_prefix_mode, nullptr);
    if (!got.ok()) {
      status = got.status();
    } else {
      shard = *std::move(got);
      const ShardedQueryInput in = ShardedInputFor(cmd, shard.local);
      DecodeOptions decode;
      decode.max_new_tokens = cmd.max_new_tokens;
      absl::StatusOr<ShardedQueryResult> r =
          RunShardedQuery(*model_, group, in, cmd.options, decode, tokenizer_, nullptr);
      status = r.status();
    }
  } catch (const std::exception& e) {
    // An engine error leaves this rank out of step: drop the generation.
    status = absl::InternalError(absl::StrCat("rank ", config_.rank, ": engine error: ", e.what()));
    std::fprintf(stderr, "event=group_engine_error rank=%d reason=\"%s\"\n", config_.rank,
                 e.what());
    return absl::AbortedError(status.message());
  }
  if (status.ok()) ++queries_;
  std::fprintf(stderr,
               "event=group_query rank=%d seq=%lld method=%s chunks_local=%zu "
               "from_store=%d "
               "from_rank0=%d ms=%.1f status=%s%s%s\n",
               config_.rank, static_cast<long long>(cmd.seq), MethodName(cmd.options.method),
               shard.local.size(), shard.from_store, shard.from_rank0, MsSince(t0),
               absl::StatusCodeToString(status.code()).c_str(), status.ok() ? "" : " reason=",
               status.ok() ? "" : ("\"" + std::string(status.message()) + "\"").c_str());
  return status;
}

}  // namespace infoflow::server
