#include "server/group/group_leader.h"

#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/dist/sp_pipeline.h"
#include "engine/model/stopwatch.h"
#include "server/group/group_command.h"
#include "server/group/shard_chunks.h"

namespace infoflow::server {
namespace {

using Clock = std::chrono::steady_clock;

// How often the monitor looks at the ready marks and heartbeats.
constexpr std::chrono::milliseconds kMonitorPeriod{50};
// How often a group that is still forming says what it waits for.
constexpr std::chrono::seconds kWaitingLogPeriod{10};

}  // namespace

GroupLeader::GroupLeader(const GroupConfig& config, const Model* model, const Tokenizer* tokenizer,
                         store::ChunkStore* store, std::unique_ptr<GroupStore> control)
    : config_(config),
      model_(model),
      tokenizer_(tokenizer),
      store_(store),
      control_(std::move(control)),
      beat_(config.world_size, -1),
      beat_at_(config.world_size, Clock::now()) {
  for (int r = 1; r < config_.world_size; ++r) missing_.push_back(r);
}

absl::StatusOr<std::unique_ptr<GroupLeader>> GroupLeader::Start(const GroupConfig& config,
                                                                const Model* model,
                                                                const Tokenizer* tokenizer,
                                                                store::ChunkStore* store) {
  if (config.world_size < 2 || config.rank != 0) {
    return absl::InvalidArgumentError("GroupLeader: rank 0 of a group of 2 or more");
  }
  absl::StatusOr<std::unique_ptr<GroupStore>> control =
      GroupStore::Open(config.host, config.port, /*serve=*/true, config.timeout);
  if (!control.ok()) return control.status();
  GroupConfig bound = config;
  bound.port = (*control)->port();
  std::unique_ptr<GroupLeader> leader(
      new GroupLeader(bound, model, tokenizer, store, *std::move(control)));
  {
    std::lock_guard<std::mutex> l(leader->mu_);
    leader->generation_ = 1;
  }
  leader->monitor_ = std::thread([p = leader.get()] { p->Monitor(); });
  std::fprintf(stderr,
               "event=group_start rank=0 world_size=%d dist_init=%s:%d timeout_ms=%lld "
               "(waiting for ranks 1..%d)\n",
               config.world_size, config.host.c_str(), bound.port,
               static_cast<long long>(config.timeout.count()), config.world_size - 1);
  return leader;
}

GroupLeader::~GroupLeader() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    on_serving_ = nullptr;
  }
  cv_.notify_all();
  if (monitor_.joinable()) monitor_.join();
  // A group whose peers may be gone: Gloo's teardown could block on them,
  // and the process is ending; let it go without teardown.
  (void)group_.release();
}

void GroupLeader::SetServingCallback(std::function<void(bool)> cb) {
  std::lock_guard<std::mutex> l(mu_);
  on_serving_ = std::move(cb);
  NotifyLocked();
}

void GroupLeader::NotifyLocked() {
  if (on_serving_) on_serving_(ready_);
}

bool GroupLeader::ready() const {
  std::lock_guard<std::mutex> l(mu_);
  return ready_;
}

int GroupLeader::port() const { return config_.port; }

int64_t GroupLeader::generation() const {
  std::lock_guard<std::mutex> l(mu_);
  return generation_;
}

std::string GroupLeader::WaitingForLocked() const {
  if (missing_.empty()) return absl::StrCat("forming generation ", generation_);
  return absl::StrCat("waiting for rank ", absl::StrJoin(missing_, ", "), " (generation ",
                      generation_, ")");
}

void GroupLeader::BreakLocked(const std::string& why) {
  std::fprintf(stderr, "event=group_broken generation=%lld reason=\"%s\"\n",
               static_cast<long long>(generation_), why.c_str());
  // Peers may be dead: no teardown (it could block on them); the next
  // generation builds a new group on the same store.
  (void)group_.release();
  ready_ = false;
  ++generation_;
  missing_.clear();
  for (int r = 1; r < config_.world_size; ++r) missing_.push_back(r);
  NotifyLocked();
  cv_.notify_all();
}

void GroupLeader::Form(int64_t gen) {
  if (absl::Status s = control_->Set(group_keys::Generation(), std::to_string(gen)); !s.ok()) {
    std::fprintf(stderr, "event=group_store_error reason=\"%s\"\n",
                 std::string(s.message()).c_str());
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, std::chrono::seconds(1), [&] { return stop_; });
    return;
  }
  Clock::time_point last_log = Clock::now();
  while (true) {
    std::vector<int> missing;
    for (int r = 1; r < config_.world_size; ++r) {
      absl::StatusOr<bool> has = control_->Contains(group_keys::Ready(gen, r));
      if (!has.ok() || !*has) missing.push_back(r);
    }
    std::unique_lock<std::mutex> l(mu_);
    if (stop_ || generation_ != gen) return;
    missing_ = missing;
    if (missing.empty()) break;
    if (Clock::now() - last_log > kWaitingLogPeriod) {
      std::fprintf(stderr, "event=group_waiting generation=%lld missing_ranks=%s\n",
                   static_cast<long long>(gen), absl::StrJoin(missing, ",").c_str());
      last_log = Clock::now();
    }
    cv_.wait_for(l, kMonitorPeriod, [&] { return stop_; });
  }
  (void)control_->Set(group_keys::Go(gen), "1");
  const GroupOptions o = GroupOptionsFor(config_, gen);
  const Clock::time_point t0 = Clock::now();
  absl::StatusOr<std::unique_ptr<SequenceParallelGroup>> g = SequenceParallelGroup::Join(o);
  std::vector<int64_t> beats(config_.world_size, -1);
  for (int r = 1; r < config_.world_size && g.ok(); ++r) {
    absl::StatusOr<int64_t> b = control_->Add(group_keys::Heartbeat(r), 0);
    beats[r] = b.ok() ? *b : -1;
  }
  std::lock_guard<std::mutex> l(mu_);
  if (stop_ || generation_ != gen) {
    if (g.ok()) (void)g->release();
    return;
  }
  if (!g.ok()) {
    std::fprintf(stderr, "event=group_join_failed generation=%lld reason=\"%s\"\n",
                 static_cast<long long>(gen), std::string(g.status().message()).c_str());
    ++generation_;  // everyone starts over on a fresh prefix
    return;
  }
  group_ = *std::move(g);
  ready_ = true;
  seq_ = 0;  // the other ranks count this generation's commands from 0
  missing_.clear();
  beat_ = beats;
  std::fill(beat_at_.begin(), beat_at_.end(), Clock::now());
  std::fprintf(stderr, "event=group_ready generation=%lld world_size=%d join_ms=%.0f\n",
               static_cast<long long>(gen), config_.world_size, MsSince(t0));
  NotifyLocked();
}

void GroupLeader::Monitor() {
  while (true) {
    std::unique_lock<std::mutex> l(mu_);
    if (stop_) return;
    if (!ready_) {
      const int64_t gen = generation_;
      l.unlock();
      Form(gen);
      continue;
    }
    // Idle: a rank whose heartbeat stopped is lost (mid-query, the query's
    // own exchanges find out instead, within the same timeout).
    if (!in_flight_) {
      const Clock::time_point now = Clock::now();
      for (int r = 1; r < config_.world_size && ready_; ++r) {
        absl::StatusOr<int64_t> b = control_->Add(group_keys::Heartbeat(r), 0);
        if (b.ok() && *b != beat_[r]) {
          beat_[r] = *b;
          beat_at_[r] = now;
        } else if (now - beat_at_[r] > config_.timeout) {
          BreakLocked(absl::StrCat(
              "rank ", r, ": no heartbeat for ",
              std::chrono::duration_cast<std::chrono::milliseconds>(now - beat_at_[r]).count(),
              " ms (group timeout ", config_.timeout.count(), " ms)"));
        }
      }
    }
    cv_.wait_for(l, kMonitorPeriod, [&] { return stop_; });
  }
}

absl::StatusOr<QueryOutcome> GroupLeader::RunQuery(const QueryRunner& runner, const QuerySpec& spec,
                                                   const TokenSink& sink) {
  // A plain prompt has no context to split over the ranks: this rank serves
  // it alone, as one process would.
  if (spec.chunks.empty()) return runner.Run(spec, sink);
  const Clock::time_point start = Clock::now();
  if (!ShardedMethodSupported(spec.method)) {
    return absl::InvalidArgumentError(
        absl::StrCat("method: ", MethodName(spec.method),
                     " does not run on a sequence-parallel group (--world-size ",
                     config_.world_size, "); use FULL, NONE, INFOFLOW or INFOFLOW_BLEND"));
  }
  if (spec.reorder) {
    return absl::InvalidArgumentError(
        "reorder: not supported on a sequence-parallel group (--world-size > "
        "1)");
  }
  SequenceParallelGroup* group = nullptr;
  int64_t gen = 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!ready_) {
      return absl::UnavailableError(absl::StrCat(
          "sequence-parallel group incomplete: ", WaitingForLocked(), "; retry later"));
    }
    in_flight_ = true;
    group = group_.get();
    gen = generation_;
  }
  bool published = false;    // the other ranks have been given the query
  bool out_of_step = false;  // an engine error after that: the ranks' tags differ now
  auto run = [&]() -> absl::StatusOr<QueryOutcome> {
    QueryOutcome out;
    absl::StatusOr<QueryInput> input = runner.ResolveInput(spec, nullptr, start, &out);
    if (!input.ok()) return input.status();  // nothing published: the group stays in step
    const MethodOptions options = runner.MethodOptionsFor(spec);
    const DecodeOptions decode = runner.DecodeOptionsFor(spec, *input);
    GroupCommand cmd;
    cmd.options = options;
    cmd.max_new_tokens = decode.max_new_tokens;
    cmd.chunk_prefix_mode = input->chunk_prefix_mode;
    cmd.first_chunk_lossy = !input->chunks.empty() && input->chunks[0]->lossy;
    cmd.prefix_ids = input->prefix_ids;
    cmd.question_ids = input->question_ids;
    cmd.prompt_ids = input->prompt_ids;
    for (const auto& c : input->chunks) cmd.chunk_lengths.push_back(c->size());
    cmd.chunk_keys = out.chunk_keys;
    {
      std::lock_guard<std::mutex> l(mu_);
      cmd.seq = seq_++;
    }
    const std::string key = group_keys::Command(gen, cmd.seq);
    if (absl::Status s = control_->Set(key, EncodeGroupCommand(cmd)); !s.ok()) return s;
    published = true;
    // Gone once the query ends, however it ends: a rank that was stopped
    // and continues later must not start a query the others have left.
    struct DeleteAtEnd {
      GroupStore* store;
      const std::string& key;
      ~DeleteAtEnd() { (void)store->Delete(key); }
    } delete_at_end{control_.get(), key};
    const ShardLayout layout = SplitChunks(
        cmd.chunk_lengths, static_cast<int64_t>(cmd.prefix_ids.size()), config_.world_size);
    absl::StatusOr<SharedShard> shard = ShareChunks(group, *model_, store_, layout, cmd.chunk_keys,
                                                    cmd.chunk_prefix_mode, &input->chunks);
    if (!shard.ok()) return shard.status();
    ShardedQueryInput sq = ShardedInputFor(cmd, shard->local);
    sq.prefix_kv = input->prefix_kv;
    input->chunks.clear();  // the other ranks' shares are not held from here on
    out.fetch_ms = MsSince(start);
    bool first = true;
    absl::StatusOr<ShardedQueryResult> run = RunShardedQuery(
        *model_, group, sq, options, decode, tokenizer_, [&](int32_t id, std::string_view text) {
          if (first) {
            out.ttft_ms = MsSince(start);
            first = false;
          }
          return sink(id, text);
        });
    if (!run.ok()) return run.status();
    SetPlanOutcome(run->plan, &out);
    out.prompt_ms = run->plan.timings.prompt_ms;
    out.first_token_ms = run->plan.timings.first_token_ms;
    out.decode_ms = run->plan.timings.decode_ms;
    if (first) out.ttft_ms = MsSince(start);  // nothing generated
    SetDecodeOutcome(run->decode, &out);
    std::fprintf(stderr,
                 "event=group_query generation=%lld seq=%lld "
                 "chunks_from_rank0_bytes=%lld "
                 "sent_bytes=%lld kv_bytes=%lld\n",
                 static_cast<long long>(gen), static_cast<long long>(cmd.seq),
                 static_cast<long long>(shard->record_bytes_sent),
                 static_cast<long long>(run->bytes_sent), static_cast<long long>(run->kv_bytes));
    return out;
  };
  absl::StatusOr<QueryOutcome> result;
  try {
    result = run();
  } catch (const std::exception& e) {
    out_of_step = published;
    result = absl::InternalError(absl::StrCat("engine error: ", e.what()));
  }
  std::lock_guard<std::mutex> l(mu_);
  in_flight_ = false;
  if (result.ok()) {
    ++queries_;
  } else {
    ++failures_;
    if ((group->broken() || out_of_step) && generation_ == gen && ready_) {
      BreakLocked(std::string(result.status().message()));
    }
  }
  return result;
}

}  // namespace infoflow::server
