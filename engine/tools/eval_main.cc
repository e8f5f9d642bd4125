// infoflow-eval: runs every blending method (docs/DESIGN.md §3) over an eval set
// and reports answer quality, fidelity to FULL and TTFT per (method, r).
//
// Per example: each chunk is tokenized and prefilled ONCE (prefix [BOS],
// PrefixMode::kBos) and its KV is shared by every method — that cost is
// ingest, not TTFT. Then, for FULL/NONE/EPIC once and for
// INFOFLOW/INFOFLOW+reorder/INFOFLOW_BLEND/CACHEBLEND/CACHEBLEND_PARTIAL/RANDOM
// at every r (EPIC at every --lego-ks value):
//   - KL(FULL || method) of the next-token distribution that predicts the
//     first content token of FULL's answer: the prompt plus FULL's greedy
//     tokens before it (leading whitespace tokens such as the " " after
//     "Answer:") are prefilled on the method's context and the last logits
//     compared, softmax in double;
//   - RunQuery with greedy decoding: TTFT, recomputed tokens, generated text;
//   - EM / token F1 of the text against the answers (engine/eval/eval_set.h);
//   - top-1 agreement: fraction of the first min(16, max_new_tokens)
//     positions where the greedy ids equal FULL's (a stop id counts as a
//     token; positions past both sequences' ends are not counted);
//   - answer recall: the fraction of the tokens of the first verbatim
//     occurrence of an answer in the chunks that the method recomputed (the
//     value tokens a copy must read; undefined when no answer occurs).
// Metrics are averaged over examples; "ttft_ratio" is mean TTFT / mean FULL
// TTFT, "ttft_ratio_median" the median over examples of the example's TTFT /
// FULL's TTFT on the same example (what --pareto plots).
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "engine/eval/eval_set.h"
#include "engine/tools/flag_table.h"
#include "engine/model/model.h"
#include "engine/blend/pipeline.h"
#include "engine/chunk/chunk_codec.h"
#include "engine/chunk/chunk_prefill.h"
#include "engine/model/runtime.h"
#include "engine/text/tokenizer.h"
#include "nlohmann/json.hpp"

namespace infoflow {
namespace {

constexpr char kUsage[] = R"(infoflow-eval: compare KV blending methods on an eval set.

Usage:
  infoflow-eval --model DIR (--eval-set FILE.jsonl | --synthetic N [synthetic options])
                [--methods LIST] [--ratios LIST] [--max-new-tokens 16]
                [--scoring-layers 1,2] [--threads N] [--device auto|cpu|cuda]
                [--out-csv F] [--out-json F [--record-selected]] [--out-plot F.svg]
                [--plot-metric auto|em|f1|top1] [--prompt-template "...{question}..."]
                [--kv-codec raw|int8|int4 [--kv-group-size 64]]
                [--deviation v|k] [--lego-ks 4] [--stale-share 0.5] [--probe-factor 0]
                [--pareto --out-csv F.csv [--out-plot F.svg]]
  infoflow-eval --write-eval-set FILE.jsonl --synthetic N [synthetic options]

Synthetic options:
  --task multihop|needle|coref|xref|split|twohop|all   (default all; comma lists
                    allowed; "all" is the first five)
  --chunks C        chunks per example (4..16, default 6)
  --chunk-words W   approximate words per chunk (default 60)
  --seed S          generator seed; RANDOM uses S + example index (default 0)

Methods (default all): FULL,NONE,INFOFLOW,INFOFLOW+reorder,INFOFLOW_BLEND,
CACHEBLEND,CACHEBLEND_PARTIAL,EPIC,RANDOM (docs/DESIGN.md §3). FULL is always run
(it is the reference). FULL and NONE do not depend on r and run once, EPIC once
per --lego-ks value (default 4); the others run at every r in --ratios
(default 0.05,0.15,0.3). --deviation picks the layer-1 state CACHEBLEND,
CACHEBLEND_PARTIAL and INFOFLOW_BLEND compare (v, default, or k).
--stale-share is INFOFLOW_BLEND's share of the budget given to the tokens with
the largest layer-1 deviation (the rest goes by attention-norm relevance);
--probe-factor F > 0 measures that deviation only on the F x (that share of
the budget) most relevant tokens, a cost that scales with r (default 0: on
every eligible token, a fixed layer-0 pass; see the model card for why).

--pareto: quality at equal cost. Defaults become --methods FULL,NONE,INFOFLOW,
INFOFLOW_BLEND,CACHEBLEND,CACHEBLEND_PARTIAL,EPIC,RANDOM, --ratios
0.01,0.03,0.05,0.1,0.15,0.2,0.3,0.45,0.6 and --lego-ks 1,2,4,8,16,32 (explicit
flags win). --out-csv is required and gets one row per (method, r or lego_k):
em, f1, kl, top1, recomputed, ttft_ms and ttft_ratio_median (median over
examples of the method's TTFT / FULL's TTFT on the same example, same run).
--out-plot F.svg writes a gnuplot script F.gp and runs gnuplot on it for
F.svg and F.png: EM vs ttft_ratio_median, one curve per method.
--record-selected adds to each --out-json example the token offset of every
chunk ("chunk_offsets", input order) and, per method, the recomputed context
token indices ("selected", input order, 0 = first chunk token).
--kv-codec passes every chunk's K/V through a stored record of that codec
(engine/chunk/chunk_codec.h; raw is bit-exact, int8/int4 quantize in groups of
--kv-group-size: keys per channel, values per token) before the methods use
it; FULL does not read chunk KV and stays the reference.
--prompt-template is prefilled after the context; "{question}" is replaced by
the question and the escapes \n and \t are expanded. Default:
"\nQuestion: {question}\nAnswer:".

Metrics (averaged over examples): em (normalized generated first line equals
an answer, or starts with it at a word boundary; lowercase, punctuation and
a/an/the removed), f1 (token F1, best answer), kl (KL(FULL || method) of the
next-token distribution at FULL's first non-whitespace answer token, teacher-
forced on FULL's tokens before it), top1 (greedy id agreement with FULL over
the first 16 positions), recomputed tokens, ans_rc (fraction of the answer's
tokens in the context that were recomputed, over examples whose chunks contain
an answer verbatim), TTFT ms and TTFT / FULL TTFT.
)";

struct Flags {
  std::string model_dir;
  std::string eval_set;
  int synthetic = 0;
  std::string task = "all";
  int chunks = 6;
  int chunk_words = 60;
  uint64_t seed = 0;
  std::string methods;  // empty: the default list (--pareto has its own)
  std::string ratios;   // empty: 0.05,0.15,0.3 (--pareto: kParetoRatios)
  std::string lego_ks;  // empty: 4 (--pareto: 1,2,4,8,16,32)
  std::string deviation = "v";
  double stale_share = 0.5;
  double probe_factor = MethodOptions{}.probe_factor;
  bool pareto = false;
  int max_new_tokens = 16;
  std::string scoring_layers;
  int threads = 0;
  std::string device = "auto";
  std::string out_csv, out_json, out_plot;
  std::string plot_metric = "auto";
  std::string prompt_template = "\\nQuestion: {question}\\nAnswer:";
  std::string write_eval_set;
  bool record_selected = false;
  std::string kv_codec = "raw";
  int kv_group_size = 64;
};

absl::Status ParseFlags(int argc, char** argv, Flags* f, bool* help) {
  FlagTable flags;
  flags.strings = {
      {"--model", &f->model_dir},         {"--eval-set", &f->eval_set},
      {"--task", &f->task},               {"--methods", &f->methods},
      {"--ratios", &f->ratios},           {"--scoring-layers", &f->scoring_layers},
      {"--device", &f->device},           {"--out-csv", &f->out_csv},
      {"--out-json", &f->out_json},       {"--out-plot", &f->out_plot},
      {"--plot-metric", &f->plot_metric}, {"--prompt-template", &f->prompt_template},
      {"--write-eval-set", &f->write_eval_set}, {"--kv-codec", &f->kv_codec},
      {"--lego-ks", &f->lego_ks},         {"--deviation", &f->deviation}};
  flags.ints = {{"--synthetic", &f->synthetic},          {"--chunks", &f->chunks},
                {"--chunk-words", &f->chunk_words},      {"--max-new-tokens", &f->max_new_tokens},
                {"--threads", &f->threads},              {"--kv-group-size", &f->kv_group_size}};
  flags.switches = {{"--record-selected", &f->record_selected}, {"--pareto", &f->pareto}};
  flags.uint64s = {{"--seed", &f->seed}};
  flags.doubles = {{"--stale-share", &f->stale_share}, {"--probe-factor", &f->probe_factor}};
  return flags.Parse(argc, argv, help);
}

constexpr char kParetoRatios[] = "0.01,0.03,0.05,0.1,0.15,0.2,0.3,0.45,0.6";

struct MethodSpec {
  std::string label;
  MethodOptions options;
  bool uses_ratio = false;
};

absl::StatusOr<std::vector<MethodSpec>> ParseMethods(const std::string& list) {
  std::vector<MethodSpec> out;
  bool have_full = false;
  for (absl::string_view item : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    std::string name(absl::StripAsciiWhitespace(item));
    MethodSpec spec;
    std::string base = name;
    const std::string kReorder = "+reorder";
    if (base.size() > kReorder.size() &&
        absl::AsciiStrToLower(base.substr(base.size() - kReorder.size())) == kReorder) {
      base = base.substr(0, base.size() - kReorder.size());
      spec.options.reorder = true;
    }
    if (!ParseMethod(base, &spec.options.method)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown method '", name, "'"));
    }
    if (spec.options.reorder && spec.options.method != Method::kInfoFlow) {
      return absl::InvalidArgumentError("+reorder applies to INFOFLOW only");
    }
    spec.label = absl::StrCat(MethodName(spec.options.method), spec.options.reorder ? "+reorder" : "");
    spec.uses_ratio = MethodUsesRatio(spec.options.method);
    spec.options.lego_k = 4;
    if (spec.options.method == Method::kFull) {
      if (have_full) continue;
      have_full = true;
    }
    bool dup = false;
    for (const MethodSpec& s : out) dup |= s.label == spec.label;
    if (!dup) out.push_back(spec);
  }
  if (!have_full) {
    MethodSpec full;
    full.label = "FULL";
    full.options.method = Method::kFull;
    out.insert(out.begin(), full);
  } else {
    std::stable_partition(out.begin(), out.end(),
                          [](const MethodSpec& s) { return s.options.method == Method::kFull; });
  }
  return out;
}

absl::StatusOr<std::vector<int>> ParseInts(const std::string& list, const char* what) {
  std::vector<int> out;
  for (absl::string_view item : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    int v;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(item), &v)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": bad value '", item, "'"));
    }
    out.push_back(v);
  }
  return out;
}
absl::StatusOr<std::vector<double>> ParseRatios(const std::string& list, const char* what) {
  std::vector<double> out;
  for (absl::string_view item : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    double v;
    if (!absl::SimpleAtod(absl::StripAsciiWhitespace(item), &v) || !(v >= 0.0 && v <= 1.0)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": bad value '", item, "' (want [0,1])"));
    }
    out.push_back(v);
  }
  return out;
}

// One (method, r) cell: sums over examples.
struct Cell {
  std::string label;
  double ratio = NAN;  // NaN: r-independent
  int n = 0;
  double em = 0, f1 = 0, kl = 0, top1 = 0, recomputed = 0, context = 0, ttft_ms = 0;
  double answer_recall = 0;
  int n_answer = 0;  // examples with an answer span (answer_recall's count)
  int lego_k = -1;   // EPIC's; -1 for the other methods
  bool lego_k_in_key = false;  // several EPIC cells: their labels carry k
  std::vector<double> ttft_ratios;  // per example: TTFT / FULL's TTFT
  double Mean(double sum) const { return n ? sum / n : NAN; }
  double MedianTtftRatio() const {
    if (ttft_ratios.empty()) return NAN;
    std::vector<double> v = ttft_ratios;
    std::sort(v.begin(), v.end());
    const size_t h = v.size() / 2;
    return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
  }
  // "INFOFLOW@0.15", "EPIC@k=8", "NONE": the per-example JSON key.
  std::string Key() const;
  double AnswerRecall() const { return n_answer ? answer_recall / n_answer : NAN; }
};

double Now() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Greedy ids with the stop id appended when decoding ended on one.
std::vector<int32_t> Sequence(const DecodeResult& d, const std::vector<int32_t>& stop_ids) {
  std::vector<int32_t> ids = d.ids;
  if (d.stop_reason == StopReason::kStopId) ids.push_back(stop_ids.empty() ? -1 : stop_ids[0]);
  return ids;
}

double Top1Agreement(const std::vector<int32_t>& ref, const std::vector<int32_t>& got, int max_pos) {
  size_t n = std::min<size_t>(max_pos, std::max(ref.size(), got.size()));
  if (n == 0) return 1.0;
  size_t same = 0;
  for (size_t i = 0; i < n; ++i) same += i < ref.size() && i < got.size() && ref[i] == got[i];
  return static_cast<double>(same) / n;
}

// log-softmax (double) of the last position's logits after `options`'s
// context and then `tokens` (the prompt, maybe with forced answer tokens).
absl::StatusOr<at::Tensor> NextTokenLogProbs(const Model& model, const QueryInput& input,
                                             const MethodOptions& options,
                                             const std::vector<int32_t>& tokens) {
  absl::StatusOr<BlendedContext> ctx = BuildContext(model, input, options);
  if (!ctx.ok()) return ctx.status();
  at::Tensor logits = PrefillTokens(model, tokens, ctx->next_position, &ctx->cache).logits;
  return at::log_softmax(logits.reshape({-1}).to(at::kDouble).cpu(), -1);
}

// The prompt plus FULL's generated ids before its first content token (one
// whose text is not all whitespace): the position where the answer itself is
// predicted, so KL there measures the answer, not the " " after "Answer:".
std::vector<int32_t> PromptToFirstContentToken(const Tokenizer& tokenizer,
                                               const std::vector<int32_t>& prompt,
                                               const std::vector<int32_t>& full_ids) {
  std::vector<int32_t> out = prompt;
  for (int32_t id : full_ids) {
    std::string text = tokenizer.Decode({id}, /*skip_special=*/true);
    if (!absl::StripAsciiWhitespace(text).empty()) return out;
    out.push_back(id);
  }
  return prompt;  // no content token: fall back to the first position
}

// Where each chunk starts in the context, chunks in input order.
std::vector<int64_t> ChunkOffsets(const std::vector<std::shared_ptr<const ChunkKv>>& chunks) {
  std::vector<int64_t> offsets;
  int64_t offset = 0;
  for (const auto& c : chunks) {
    offsets.push_back(offset);
    offset += c->size();
  }
  return offsets;
}

// `plan.selected` (final-layout indices) mapped back through
// plan.chunk_order to input-order indices (0 = first token of chunks[0]).
std::vector<int64_t> SelectedInInputOrder(const RecomputePlan& plan,
                                          const std::vector<std::shared_ptr<const ChunkKv>>& chunks,
                                          const std::vector<int64_t>& chunk_offsets) {
  std::vector<int64_t> layout_to_input;
  for (int c : plan.chunk_order) {
    for (int64_t t = 0; t < chunks[c]->size(); ++t) layout_to_input.push_back(chunk_offsets[c] + t);
  }
  std::vector<int64_t> out;
  out.reserve(plan.selected.size());
  for (int64_t s : plan.selected) out.push_back(layout_to_input.at(s));
  std::sort(out.begin(), out.end());
  return out;
}

// Fraction of `span` covered by `selected` (input-order indices).
double SpanRecall(const std::vector<int64_t>& selected, TokenSpan span) {
  int64_t hit = 0;
  for (int64_t i : selected) hit += i >= span.begin && i < span.end;
  return static_cast<double>(hit) / static_cast<double>(span.end - span.begin);
}

std::string Escape(const std::string& s) {
  return absl::StrReplaceAll(s, {{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"}, {"\"", "&quot;"}});
}

std::string RatioText(double r) { return std::isnan(r) ? "-" : absl::StrFormat("%.2f", r); }

std::string Cell::Key() const {
  if (!std::isnan(ratio)) return absl::StrCat(label, "@", RatioText(ratio));
  if (lego_k_in_key) return absl::StrCat(label, "@k=", lego_k);
  return label;
}

// The r (or EPIC's k=N) column of the table.
std::string ParamText(const Cell& c) {
  if (c.lego_k_in_key) return absl::StrCat("k=", c.lego_k);
  return RatioText(c.ratio);
}

// Quality vs r: one polyline per r-dependent method, a dashed level line for
// each r-independent one.
std::string MakeSvg(const std::vector<Cell>& cells, const std::string& metric,
                    const std::vector<double>& ratios) {
  const double W = 760, H = 420, L = 60, R = 560, T = 30, B = 370;
  double xmax = 0.1;
  for (double r : ratios) xmax = std::max(xmax, r);
  xmax = std::ceil(xmax * 10 - 1e-9) / 10;
  auto X = [&](double r) { return L + (R - L) * r / xmax; };
  auto Y = [&](double q) { return B - (B - T) * std::clamp(q, 0.0, 1.0); };
  auto value = [&](const Cell& c) {
    if (metric == "em") return c.Mean(c.em);
    if (metric == "f1") return c.Mean(c.f1);
    return c.Mean(c.top1);
  };
  const char* colors[] = {"#000000", "#999999", "#d62728", "#ff7f0e", "#1f77b4",
                          "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf"};
  std::ostringstream s;
  s << absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" "
      "fill=\"white\"/>\n",
      W, H);
  s << absl::StrFormat("<text x=\"%g\" y=\"18\" text-anchor=\"middle\">%s vs recompute ratio r</text>\n",
                       (L + R) / 2, Escape(metric));
  // Grid, ticks and axes.
  for (int i = 0; i <= 4; ++i) {
    double q = i / 4.0;
    s << absl::StrFormat("<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"#e0e0e0\"/>\n", L,
                         Y(q), R, Y(q));
    s << absl::StrFormat("<text x=\"%g\" y=\"%g\" text-anchor=\"end\">%.2f</text>\n", L - 6, Y(q) + 4, q);
  }
  for (int i = 0; i <= 5; ++i) {
    double r = xmax * i / 5;
    s << absl::StrFormat("<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"#000\"/>\n", X(r), B,
                         X(r), B + 5);
    s << absl::StrFormat("<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">%.2f</text>\n", X(r), B + 18, r);
  }
  s << absl::StrFormat("<polyline points=\"%g,%g %g,%g %g,%g\" fill=\"none\" stroke=\"#000\"/>\n",
                       L, T, L, B, R, B);
  s << absl::StrFormat("<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">r</text>\n", (L + R) / 2, B + 36);
  s << absl::StrFormat(
      "<text x=\"16\" y=\"%g\" text-anchor=\"middle\" transform=\"rotate(-90 16 %g)\">%s</text>\n",
      (T + B) / 2, (T + B) / 2, Escape(metric));
  // Series, in first-appearance order.
  std::vector<std::string> labels;
  for (const Cell& c : cells) {
    if (std::find(labels.begin(), labels.end(), c.label) == labels.end()) labels.push_back(c.label);
  }
  for (size_t k = 0; k < labels.size(); ++k) {
    const char* color = colors[k % 10];
    std::vector<const Cell*> pts;
    for (const Cell& c : cells) {
      if (c.label == labels[k] && c.n > 0) pts.push_back(&c);
    }
    if (pts.empty()) continue;
    const bool level = std::isnan(pts[0]->ratio);
    if (level) {
      s << absl::StrFormat(
          "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"%s\" stroke-width=\"2\" "
          "stroke-dasharray=\"6,4\"/>\n",
          L, Y(value(*pts[0])), R, Y(value(*pts[0])), color);
    } else {
      std::string points;
      for (const Cell* c : pts) absl::StrAppend(&points, X(c->ratio), ",", Y(value(*c)), " ");
      s << absl::StrFormat(
          "<polyline points=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\"/>\n", points, color);
      for (const Cell* c : pts) {
        s << absl::StrFormat("<circle cx=\"%g\" cy=\"%g\" r=\"3\" fill=\"%s\"/>\n", X(c->ratio),
                             Y(value(*c)), color);
      }
    }
    double ly = T + 10 + 20 * k;
    s << absl::StrFormat(
        "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"%s\" stroke-width=\"2\"%s/>\n", R + 20,
        ly, R + 50, ly, color, level ? " stroke-dasharray=\"6,4\"" : "");
    s << absl::StrFormat("<text x=\"%g\" y=\"%g\">%s%s</text>\n", R + 56, ly + 4, Escape(labels[k]),
                         level ? " (any r)" : "");
  }
  s << "</svg>\n";
  return s.str();
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.flush();
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

// Quality at equal cost: EM against the median TTFT / FULL, one curve per
// method (points in TTFT order), FULL and NONE as single points. Writes the
// gnuplot script `svg_path` with ".gp" for ".svg" and runs gnuplot on it for
// the SVG and a PNG next to it.
absl::Status WriteParetoPlot(const std::vector<Cell>& cells, const std::string& svg_path,
                             const std::string& title) {
  std::string base = svg_path;
  if (base.size() > 4 && base.substr(base.size() - 4) == ".svg") base.resize(base.size() - 4);
  std::vector<std::string> labels;
  for (const Cell& c : cells) {
    if (std::find(labels.begin(), labels.end(), c.label) == labels.end()) labels.push_back(c.label);
  }
  auto quoted = [](const std::string& s) { return absl::StrCat("\"", absl::StrReplaceAll(s, {{"\"", "'"}}), "\""); };
  std::string data, plot;
  for (size_t i = 0; i < labels.size(); ++i) {
    std::vector<const Cell*> pts;
    for (const Cell& c : cells) {
      if (c.label == labels[i] && c.n > 0) pts.push_back(&c);
    }
    std::sort(pts.begin(), pts.end(), [](const Cell* a, const Cell* b) {
      return a->MedianTtftRatio() < b->MedianTtftRatio();
    });
    absl::StrAppend(&data, "$D", i, " << EOD\n");
    for (const Cell* c : pts) {
      absl::StrAppend(&data, absl::StrFormat("%.5f %.5f\n", c->MedianTtftRatio(), c->Mean(c->em)));
    }
    absl::StrAppend(&data, "EOD\n");
    static const char* kColors[] = {"#000000", "#999999", "#1f77b4", "#d62728", "#2ca02c",
                                    "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};
    absl::StrAppend(&plot, i ? ", \\\n  " : "plot ", "$D", i,
                    " using 1:2 with linespoints lw 2 pt ", 5 + (i % 8), " ps 0.9 lc rgb \"",
                    kColors[i % 10], "\" title ", quoted(labels[i]));
  }
  std::string script = absl::StrCat(
      data, "set title ", quoted(title), "\nset xlabel \"TTFT / FULL (median over examples)\"\n",
      "set ylabel \"exact match\"\nset xrange [0:1.05]\nset yrange [0:1.02]\nset grid\n",
      "set key outside right top\n",
      "set terminal svg size 760,420 noenhanced font \"sans,11\" background rgb \"white\"\n"
      "set output ",
      quoted(base + ".svg"), "\n", plot, "\n",
      "set terminal pngcairo size 760,420 noenhanced font \"sans,9\"\nset output ", quoted(base + ".png"), "\n",
      "replot\n");
  if (absl::Status s = WriteFile(base + ".gp", script); !s.ok()) return s;
  const std::string cmd = absl::StrCat("gnuplot ", quoted(base + ".gp"));
  if (int rc = std::system(cmd.c_str()); rc != 0) {
    return absl::InternalError(absl::StrCat("`", cmd, "` failed (", rc, "); is gnuplot installed?"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<EvalExample>> GetExamples(const Flags& f) {
  if (!f.eval_set.empty()) {
    if (f.synthetic > 0) return absl::InvalidArgumentError("give --eval-set or --synthetic, not both");
    return LoadEvalSet(f.eval_set);
  }
  if (f.synthetic <= 0) return absl::InvalidArgumentError("need --eval-set FILE or --synthetic N");
  EvalSetOptions o;
  o.n_examples = f.synthetic;
  o.n_chunks = f.chunks;
  o.chunk_words = f.chunk_words;
  o.seed = f.seed;
  o.tasks.clear();
  if (f.task != "all") {
    for (absl::string_view t : absl::StrSplit(f.task, ',', absl::SkipWhitespace())) {
      o.tasks.emplace_back(absl::StripAsciiWhitespace(t));
    }
  }
  if (f.chunks < 2) return absl::InvalidArgumentError("--chunks must be >= 2 (4..16 intended)");
  if (absl::Status s = ValidateEvalSetOptions(o); !s.ok()) return s;
  return GenerateEvalSet(o);
}

absl::Status Run(const Flags& f) {
  absl::StatusOr<std::vector<EvalExample>> examples = GetExamples(f);
  if (!examples.ok()) return examples.status();
  if (!f.write_eval_set.empty()) {
    if (absl::Status s = WriteEvalSet(f.write_eval_set, *examples); !s.ok()) return s;
    std::fprintf(stderr, "wrote %zu examples to %s\n", examples->size(), f.write_eval_set.c_str());
    return absl::OkStatus();
  }
  if (f.model_dir.empty()) return absl::InvalidArgumentError("--model DIR is required");
  const std::string method_list =
      !f.methods.empty() ? f.methods
      : f.pareto ? "FULL,NONE,INFOFLOW,INFOFLOW_BLEND,CACHEBLEND,CACHEBLEND_PARTIAL,EPIC,RANDOM"
                 : "FULL,NONE,INFOFLOW,INFOFLOW+reorder,INFOFLOW_BLEND,CACHEBLEND,"
                   "CACHEBLEND_PARTIAL,EPIC,RANDOM";
  absl::StatusOr<std::vector<MethodSpec>> specs = ParseMethods(method_list);
  if (!specs.ok()) return specs.status();
  absl::StatusOr<std::vector<double>> ratios = ParseRatios(
      !f.ratios.empty() ? f.ratios : f.pareto ? kParetoRatios : "0.05,0.15,0.3", "--ratios");
  if (!ratios.ok()) return ratios.status();
  absl::StatusOr<std::vector<int>> lego_ks =
      ParseInts(!f.lego_ks.empty() ? f.lego_ks : f.pareto ? "1,2,4,8,16,32" : "4", "--lego-ks");
  if (!lego_ks.ok()) return lego_ks.status();
  if (lego_ks->empty()) return absl::InvalidArgumentError("--lego-ks is empty");
  for (int k : *lego_ks) {
    if (k < 0) return absl::InvalidArgumentError("--lego-ks: values must be >= 0");
  }
  Deviation deviation;
  if (!ParseDeviation(f.deviation, &deviation)) {
    return absl::InvalidArgumentError(absl::StrCat("--deviation must be v or k, got ", f.deviation));
  }
  if (!(f.stale_share >= 0 && f.stale_share <= 1)) {
    return absl::InvalidArgumentError("--stale-share must be in [0, 1]");
  }
  if (!(f.probe_factor >= 0 && f.probe_factor <= 1e6)) {
    return absl::InvalidArgumentError("--probe-factor must be in [0, 1e6]");
  }
  if (f.pareto && f.out_csv.empty()) return absl::InvalidArgumentError("--pareto needs --out-csv");
  absl::StatusOr<std::vector<int>> layers = ParseInts(f.scoring_layers, "--scoring-layers");
  if (!layers.ok()) return layers.status();
  if (f.max_new_tokens <= 0) return absl::InvalidArgumentError("--max-new-tokens must be > 0");
  std::string tmpl = absl::StrReplaceAll(f.prompt_template, {{"\\n", "\n"}, {"\\t", "\t"}});
  if (tmpl.find("{question}") == std::string::npos) {
    return absl::InvalidArgumentError("--prompt-template must contain {question}");
  }
  bool any_ratio = false;
  for (const MethodSpec& s : *specs) any_ratio |= s.uses_ratio;
  if (any_ratio && ratios->empty()) return absl::InvalidArgumentError("--ratios is empty");

  InitTorchRuntime(f.threads);
  LoadOptions load;
  load.device = f.device;
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(f.model_dir, load);
  if (!model.ok()) return model.status();
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromFile(f.model_dir + "/tokenizer.json");
  if (!tok.ok()) return tok.status();
  const Model& m = **model;
  const Tokenizer& tokenizer = **tok;
  absl::StatusOr<KvCodec> parsed_codec = ParseKvCodec(f.kv_codec, f.kv_group_size);
  if (!parsed_codec.ok()) return parsed_codec.status();
  const KvCodec codec = *parsed_codec;

  QueryInput base;
  std::optional<int64_t> bos = m.config().bos_token_id;
  if (!bos && !tokenizer.prefix_special_ids().empty()) bos = tokenizer.prefix_special_ids()[0];
  if (bos) {
    base.prefix_ids = {static_cast<int32_t>(*bos)};
    base.chunk_prefix_mode = PrefixMode::kBos;
  } else {
    base.chunk_prefix_mode = PrefixMode::kNone;
  }
  DecodeOptions decode;
  decode.max_new_tokens = f.max_new_tokens;
  for (int64_t id : StopTokenIds(m.config())) decode.stop_ids.push_back(static_cast<int32_t>(id));
  const int agree_positions = std::min(16, f.max_new_tokens);

  // Cells in output order: each method at its ratios (EPIC at its lego_ks).
  std::vector<Cell> cells;
  std::vector<const MethodSpec*> runs;  // parallel to cells
  for (const MethodSpec& s : *specs) {
    const bool epic = s.options.method == Method::kEpic;
    std::vector<double> rs = s.uses_ratio ? *ratios : std::vector<double>{NAN};
    std::vector<int> ks = epic ? *lego_ks : std::vector<int>{-1};
    for (double r : rs) {
      for (int lk : ks) {
        Cell c;
        c.label = s.label;
        c.ratio = r;
        c.lego_k = lk;
        c.lego_k_in_key = epic && lego_ks->size() > 1;
        cells.push_back(c);
        runs.push_back(&s);
      }
    }
  }

  nlohmann::ordered_json per_example = nlohmann::ordered_json::array();
  const size_t n_examples = examples->size();
  bool warned_positions = false;
  for (size_t e = 0; e < n_examples; ++e) {
    const EvalExample& ex = (*examples)[e];
    QueryInput input = base;
    double t0 = Now();
    for (const std::string& text : ex.chunks) {
      std::vector<int32_t> ids = tokenizer.Encode(text);
      if (ids.empty()) continue;
      absl::StatusOr<ChunkKv> kv = PrefillChunk(m, ids, input.chunk_prefix_mode);
      if (!kv.ok()) return kv.status();
      if (codec.kind == KvCodec::Kind::kRaw) {
        input.chunks.push_back(std::make_shared<ChunkKv>(*std::move(kv)));
        continue;
      }
      // Through a stored record and back, as the server's fetch path does.
      absl::StatusOr<std::shared_ptr<const ChunkKv>> back =
          ThroughRecord(m, *kv, input.chunk_prefix_mode, codec);
      if (!back.ok()) return back.status();
      input.chunks.push_back(*std::move(back));
    }
    const double ingest_ms = Now() - t0;
    if (input.chunks.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("example ", e, ": all chunks are empty"));
    }
    input.question_ids = tokenizer.Encode(ex.question);
    input.prompt_ids = tokenizer.Encode(absl::StrReplaceAll(tmpl, {{"{question}", ex.question}}));
    if (input.question_ids.empty() || input.prompt_ids.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("example ", e, ": empty question"));
    }
    int64_t positions = static_cast<int64_t>(input.prompt_ids.size()) + f.max_new_tokens;
    for (const auto& c : input.chunks) positions += c->size();
    if (positions > m.config().max_position_embeddings && !warned_positions) {
      // Decode stops at the model's last position: answers come out short
      // or empty, and would be scored as wrong without this note.
      std::fprintf(stderr,
                   "warning: example %zu needs %lld positions (context + prompt + "
                   "--max-new-tokens) > max_position_embeddings %lld; generation stops there\n",
                   e, static_cast<long long>(positions),
                   static_cast<long long>(m.config().max_position_embeddings));
      warned_positions = true;
    }

    // Chunks that encode to nothing hold no tokens, so indexing over all of
    // ex.chunks matches input.chunks.
    const TokenSpan answer_span = FindAnswerTokens(tokenizer, ex.chunks, ex.answers);
    const std::vector<int64_t> chunk_offsets = ChunkOffsets(input.chunks);
    const bool has_answer_span = !answer_span.empty();
    at::Tensor full_lp;
    std::vector<int32_t> full_seq, kl_tokens;
    double full_ttft = 0;
    int64_t context_tokens = 0;
    nlohmann::ordered_json gens = nlohmann::ordered_json::object();
    nlohmann::ordered_json recalls = nlohmann::ordered_json::object();
    nlohmann::ordered_json selected = nlohmann::ordered_json::object();
    for (size_t k = 0; k < runs.size(); ++k) {
      const MethodSpec& spec = *runs[k];
      Cell& c = cells[k];
      MethodOptions options = spec.options;
      if (spec.uses_ratio) options.ratio = c.ratio;
      if (c.lego_k >= 0) options.lego_k = c.lego_k;
      options.deviation = deviation;
      options.stale_share = f.stale_share;
      options.probe_factor = f.probe_factor;
      options.scoring_layers = *layers;
      options.seed = f.seed + e;
      absl::StatusOr<QueryResult> q = RunQuery(m, &tokenizer, input, options, decode, nullptr);
      if (!q.ok()) return q.status();
      std::vector<int32_t> seq = Sequence(q->decode, decode.stop_ids);
      if (options.method == Method::kFull) {  // always runs first
        kl_tokens = PromptToFirstContentToken(tokenizer, input.prompt_ids, q->decode.ids);
      }
      absl::StatusOr<at::Tensor> lp = NextTokenLogProbs(m, input, options, kl_tokens);
      if (!lp.ok()) return lp.status();
      if (options.method == Method::kFull) {
        full_lp = *lp;
        full_seq = seq;
        full_ttft = q->ttft_ms;
        context_tokens = q->plan.context_tokens;
      }
      const double kl = (full_lp.exp() * (full_lp - *lp)).sum().item<double>();
      c.n += 1;
      c.ttft_ratios.push_back(full_ttft > 0 ? q->ttft_ms / full_ttft : NAN);
      c.em += ExactMatch(q->decode.text, ex.answers);
      c.f1 += TokenF1(q->decode.text, ex.answers);
      c.kl += std::max(0.0, kl);
      c.top1 += Top1Agreement(full_seq, seq, agree_positions);
      c.recomputed += static_cast<double>(q->plan.selected.size());
      c.context += static_cast<double>(q->plan.context_tokens);
      c.ttft_ms += q->ttft_ms;
      const std::string key = c.Key();
      gens[key] = q->decode.text;
      const std::vector<int64_t> in_input =
          SelectedInInputOrder(q->plan, input.chunks, chunk_offsets);
      if (f.record_selected) selected[key] = in_input;
      if (has_answer_span) {
        const double recall = SpanRecall(in_input, answer_span);
        c.answer_recall += recall;
        c.n_answer += 1;
        recalls[key] = recall;
      }
    }
    std::string full_text = gens.contains("FULL") ? gens["FULL"].get<std::string>() : "";
    std::fprintf(stderr, "[%zu/%zu] %-8s ctx=%lld tok ingest=%.1fms full_ttft=%.1fms full=\"%s\"\n",
                 e + 1, n_examples, ex.task.c_str(), static_cast<long long>(context_tokens),
                 ingest_ms, full_ttft,
                 absl::StrReplaceAll(std::string(AnswerSpan(full_text)), {{"\"", "'"}}).c_str());
    nlohmann::ordered_json pe;
    pe["task"] = ex.task;
    pe["question"] = ex.question;
    pe["answers"] = ex.answers;
    pe["context_tokens"] = context_tokens;
    pe["ingest_ms"] = ingest_ms;
    pe["generated"] = gens;
    if (has_answer_span) {
      pe["answer_tokens"] = {answer_span.begin, answer_span.end};
      pe["answer_recall"] = recalls;
    }
    if (f.record_selected) {
      pe["chunk_offsets"] = chunk_offsets;
      pe["selected"] = selected;
    }
    per_example.push_back(pe);
  }

  double full_mean_ttft = NAN;
  for (const Cell& c : cells) {
    if (c.label == "FULL") full_mean_ttft = c.Mean(c.ttft_ms);
  }
  // Table.
  std::printf("%-18s %5s %4s %6s %6s %9s %6s %10s %6s %8s %9s %7s %7s\n", "method", "r", "n",
              "EM", "F1", "KL", "top1", "recomputed", "ans_rc", "ctx_tok", "TTFT_ms", "xFULL",
              "medxF");
  for (const Cell& c : cells) {
    std::printf("%-18s %5s %4d %6.3f %6.3f %9.5f %6.3f %10.1f %6.3f %8.1f %9.2f %7.3f %7.3f\n",
                c.label.c_str(), ParamText(c).c_str(), c.n, c.Mean(c.em), c.Mean(c.f1),
                c.Mean(c.kl), c.Mean(c.top1), c.Mean(c.recomputed), c.AnswerRecall(),
                c.Mean(c.context), c.Mean(c.ttft_ms), c.Mean(c.ttft_ms) / full_mean_ttft,
                c.MedianTtftRatio());
  }
  std::fflush(stdout);

  if (!f.out_csv.empty()) {
    std::string csv =
        "method,ratio,n,em,f1,kl,top1,recomputed,context_tokens,ttft_ms,ttft_ratio,answer_recall,"
        "lego_k,ttft_ratio_median\n";
    for (const Cell& c : cells) {
      absl::StrAppend(
          &csv, c.label, ",", std::isnan(c.ratio) ? "" : absl::StrFormat("%g", c.ratio),
          absl::StrFormat(",%d,%.6f,%.6f,%.8f,%.6f,%.3f,%.3f,%.4f,%.6f,", c.n, c.Mean(c.em),
                          c.Mean(c.f1), c.Mean(c.kl), c.Mean(c.top1), c.Mean(c.recomputed),
                          c.Mean(c.context), c.Mean(c.ttft_ms), c.Mean(c.ttft_ms) / full_mean_ttft),
          c.n_answer ? absl::StrFormat("%.6f", c.AnswerRecall()) : "", ",",
          c.lego_k >= 0 ? absl::StrCat(c.lego_k) : "", absl::StrFormat(",%.6f\n", c.MedianTtftRatio()));
    }
    if (absl::Status s = WriteFile(f.out_csv, csv); !s.ok()) return s;
  }
  if (!f.out_json.empty()) {
    nlohmann::ordered_json j;
    j["model"] = f.model_dir;
    j["examples"] = n_examples;
    j["source"] = f.eval_set.empty() ? absl::StrCat("synthetic:", f.task, ":seed=", f.seed,
                                                    ":chunks=", f.chunks, ":words=", f.chunk_words)
                                     : f.eval_set;
    j["max_new_tokens"] = f.max_new_tokens;
    j["scoring_layers"] = *layers;
    j["prompt_template"] = tmpl;
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    for (const Cell& c : cells) {
      nlohmann::ordered_json row;
      row["method"] = c.label;
      row["ratio"] = std::isnan(c.ratio) ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(c.ratio);
      row["n"] = c.n;
      row["em"] = c.Mean(c.em);
      row["f1"] = c.Mean(c.f1);
      row["kl"] = c.Mean(c.kl);
      row["top1"] = c.Mean(c.top1);
      row["recomputed"] = c.Mean(c.recomputed);
      row["context_tokens"] = c.Mean(c.context);
      row["ttft_ms"] = c.Mean(c.ttft_ms);
      row["ttft_ratio"] = c.Mean(c.ttft_ms) / full_mean_ttft;
      row["ttft_ratio_median"] = c.MedianTtftRatio();
      if (c.lego_k >= 0) row["lego_k"] = c.lego_k;
      row["answer_recall"] =
          c.n_answer ? nlohmann::ordered_json(c.AnswerRecall()) : nlohmann::ordered_json(nullptr);
      rows.push_back(row);
    }
    j["results"] = rows;
    j["per_example"] = per_example;
    std::string text = j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    if (absl::Status s = WriteFile(f.out_json, text + "\n"); !s.ok()) return s;
  }
  if (!f.out_plot.empty() && f.pareto) {
    const std::string title =
        f.eval_set.empty() ? absl::StrCat(f.task, " seed ", f.seed, ", ", f.chunks, " chunks x ",
                                          f.chunk_words, " words, ", n_examples, " examples")
                           : f.eval_set;
    return WriteParetoPlot(cells, f.out_plot, title);
  }
  if (!f.out_plot.empty()) {
    std::string metric = f.plot_metric;
    if (metric == "auto") {
      double full_em = 0;
      for (const Cell& c : cells) {
        if (c.label == "FULL") full_em = c.Mean(c.em);
      }
      metric = full_em > 0 ? "em" : "top1";
    }
    if (metric != "em" && metric != "f1" && metric != "top1") {
      return absl::InvalidArgumentError("--plot-metric must be auto, em, f1 or top1");
    }
    if (absl::Status s = WriteFile(f.out_plot, MakeSvg(cells, metric, *ratios)); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace infoflow

int main(int argc, char** argv) {
  infoflow::Flags flags;
  bool help = false;
  absl::Status s = infoflow::ParseFlags(argc, argv, &flags, &help);
  if (help) {
    std::fputs(infoflow::kUsage, stdout);
    return 0;
  }
  if (s.ok()) s = infoflow::Run(flags);
  if (!s.ok()) {
    std::fprintf(stderr, "infoflow-eval: %s\n", s.ToString().c_str());
    if (s.code() == absl::StatusCode::kInvalidArgument && argc <= 1) std::fputs(infoflow::kUsage, stderr);
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
