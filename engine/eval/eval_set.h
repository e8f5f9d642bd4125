// Seeded synthetic eval sets for comparing blending methods, plus the answer
// scoring (exact match, token F1) the `infoflow-eval` tool reports.
//
// Every task puts the facts needed to answer in *different* chunks, or needs
// the question to find one fact among many chunks, so the answer depends on
// what the chunk KVs carry across chunk boundaries:
//   multihop  chunk a: "<A>'s manager is <B>."  chunk b > a: "<B> works in <City>."
//             Q: "Where does <A>'s manager work?"          answer: City
//   needle    one chunk (depth varies): "The secret code of <A> is <n>."
//             Q: "What is the secret code of <A>?"          answer: n
//   coref     chunk a: "<A> is a <job> ..."  chunk b > a: "She/He lives in
//             <City>." (pronoun, at the start of chunk a+1) or "The <job>
//             lives in <City>." (alias, any later chunk)
//             Q: "Where does <A> live?"                     answer: City
//   xref      2..n-1 chunk boundaries each carry a pronoun pair: chunk c
//             ends "<P> is a <job> who grew up near the <landmark>.", chunk
//             c+1 opens "Her/His secret code is <n>." (distinct people,
//             genders mixed)
//             Q: "What is the secret code of <P>?"          answer: n
//   split     like xref, but each fact is a numbered-attribute sentence cut
//             after the name, as fixed-size chunking cuts sentences: chunk c
//             ends "The <key> of <P>", chunk c+1 opens " is <n>.". One key is
//             "secret code"; the others are decoys ("room number", ...)
//             Q: "What is the secret code of <P>?"          answer: n
//             Unlike coref, nothing at question time ties a code to its
//             person in xref and split (no name, no distractor to rule
//             out): only a KV of chunk c+1 that has seen chunk c does, so
//             NONE is at chance and these tasks measure the NONE -> FULL gap.
//   twohop    whole passages, no cut sentences (not in "all"): chunk a:
//             "<X> works at <S> Labs."  chunk c != a: "The secret code of
//             <S> Labs is <n>."  plus a decoy chain of the same shape for
//             another person and company (a one-hop copy is right 1 in 2)
//             Q: "What is the secret code of the company where <X> works?"
//             answer: n
// The rest of every chunk is seeded filler prose about other made-up people
// and places; filler never uses the fact phrasings ("manager", "works in",
// "secret code", "lives in"), the answer cities or the job titles.
//
// Torch-free; text only, so it works with any tokenizer.
#ifndef INFOFLOW_ENGINE_EVAL_EVAL_SET_H_
#define INFOFLOW_ENGINE_EVAL_EVAL_SET_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace infoflow {

struct EvalExample {
  std::vector<std::string> chunks;
  std::string question;
  std::vector<std::string> answers;
  std::string task;  // EvalTaskNames() (free text when loaded)
};

struct EvalSetOptions {
  int n_examples = 8;
  int n_chunks = 6;       // meant for 4..16; clamped to >= 2
  int chunk_words = 60;   // approximate words per chunk (facts included)
  uint64_t seed = 0;
  // Tasks cycled over examples in this order; empty = EvalTaskNames().
  std::vector<std::string> tasks = {"multihop", "needle", "coref"};
};

// The task names "all" expands to, in that order (also what infoflow-train
// evaluates on).
const std::vector<std::string>& EvalTaskNames();
// Tasks that exist but are not in "all" (added later; "all" sets stay
// byte-stable): "twohop".
const std::vector<std::string>& ExtraEvalTaskNames();

// InvalidArgument for unknown task names or non-positive sizes.
absl::Status ValidateEvalSetOptions(const EvalSetOptions& options);

// Deterministic in `options` (same options => identical examples). Example i
// uses task tasks[i % tasks.size()]. Unknown task names are skipped (call
// ValidateEvalSetOptions first to reject them).
std::vector<EvalExample> GenerateEvalSet(const EvalSetOptions& options);

// A training document for infoflow-train: several facts of every task in one
// set of chunks (1..max_needles needles, 0..max_multihops manager chains,
// 0..max_corefs pronoun/alias references; all people distinct) and one
// question per fact, in random order. Same phrasings, pools and filler as
// the eval tasks, so a model trained on these answers GenerateEvalSet's
// questions; denser supervision (several answers per context) is the point.
struct TrainingDocOptions {
  int n_chunks = 6;
  int chunk_words = 60;
  int max_needles = 4;
  int max_multihops = 2;
  int max_corefs = 2;
  uint64_t seed = 0;
};
struct TrainingDocument {
  std::vector<std::string> chunks;
  std::vector<std::string> questions;
  std::vector<std::string> answers;  // answers[i] answers questions[i]
  std::vector<std::string> tasks;    // tasks[i]: "needle", "multihop", "coref"
};
// Deterministic in `options`.
TrainingDocument GenerateTrainingDocument(const TrainingDocOptions& options);

// A training document for the xref (split = false) or split task: the
// chunks of one layout and, for xref, one question per pair (all of them, in
// random order) so every forward pass supervises every binding; for split
// the one secret-code question. Deterministic in the arguments.
TrainingDocument GenerateXrefTrainingDocument(int n_chunks, int chunk_words, uint64_t seed,
                                              bool split = false);

// One JSONL line (no trailing newline):
// {"chunks": [...], "question": "...", "answers": [...], "task": "..."}
std::string EvalExampleToJson(const EvalExample& example);

// Writes one EvalExampleToJson line per example.
absl::Status WriteEvalSet(const std::string& path, const std::vector<EvalExample>& examples);

// Reads a JSONL eval set. Blank lines are skipped. Each line must be an
// object with "chunks" (non-empty array of strings), "question" (string) and
// "answers" (array of strings, or one string); "task" (string) is optional.
// NotFound if the file cannot be opened; InvalidArgument "PATH:LINE: why"
// for a bad line, or if the file holds no examples.
absl::StatusOr<std::vector<EvalExample>> LoadEvalSet(const std::string& path);

// --- Where the answer sits in the context -----------------------------------
class Tokenizer;

// Token indices [begin, end) into the concatenated tokens of chunks
// (each encoded alone, in order; 0 = the first chunk's first token).
struct TokenSpan {
  int64_t begin = 0, end = 0;
  bool empty() const { return end <= begin; }
};

// The tokens of the first verbatim, word-bounded occurrence of an answer in
// `chunks` (chunk by chunk, each answer in turn), with the space before it
// that the pre-tokenizer joins to the word: what a method must compute right
// for the answer to be copied. Empty when no answer occurs. Boundaries come
// from encoding the chunk text up to the answer and up to its end, so they
// match the full encoding when the answer starts and ends at pre-token
// boundaries (true for word and number answers).
TokenSpan FindAnswerTokens(const Tokenizer& tokenizer, const std::vector<std::string>& chunks,
                           const std::vector<std::string>& answers);

// --- Answer scoring --------------------------------------------------------
// NormalizeAnswer: lowercase ASCII, delete punctuation, drop the articles
// "a", "an", "the" as words, collapse whitespace (SQuAD style).
std::string NormalizeAnswer(std::string_view text);

// The part of generated text that is scored: up to the first newline, with
// leading whitespace/newlines skipped first (models often start with " ").
std::string_view AnswerSpan(std::string_view generated);

// 1 if normalized AnswerSpan(generated) equals a normalized answer or starts
// with it followed by a word boundary ("paris is nice" matches "Paris"), else
// 0. Empty normalized answers never match.
double ExactMatch(std::string_view generated, const std::vector<std::string>& answers);

// Max over answers of the bag-of-words F1 between normalized
// AnswerSpan(generated) and the normalized answer.
double TokenF1(std::string_view generated, const std::vector<std::string>& answers);

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_EVAL_EVAL_SET_H_
