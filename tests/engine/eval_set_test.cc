// The synthetic eval-set generator and answer scoring (engine/eval/eval_set.h).
#include "engine/eval/eval_set.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <set>
#include <string>

#include "engine/text/tokenizer.h"
#include "tests/engine/test_util.h"

namespace infoflow {
namespace {

EvalSetOptions Opts(int n, uint64_t seed, std::vector<std::string> tasks) {
  EvalSetOptions o;
  o.n_examples = n;
  o.n_chunks = 6;
  o.chunk_words = 60;
  o.seed = seed;
  o.tasks = std::move(tasks);
  return o;
}

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/eval_set_test_" + name + ".jsonl";
}

// Index of the only chunk containing `needle`, -1 if none, -2 if several.
int ChunkWith(const EvalExample& ex, const std::string& needle) {
  int found = -1;
  for (size_t i = 0; i < ex.chunks.size(); ++i) {
    if (ex.chunks[i].find(needle) != std::string::npos) {
      if (found != -1) return -2;
      found = static_cast<int>(i);
    }
  }
  return found;
}

TEST(EvalSetTest, DeterministicBySeed) {
  auto a = GenerateEvalSet(Opts(9, 7, {"multihop", "needle", "coref"}));
  auto b = GenerateEvalSet(Opts(9, 7, {"multihop", "needle", "coref"}));
  auto c = GenerateEvalSet(Opts(9, 8, {"multihop", "needle", "coref"}));
  ASSERT_EQ(a.size(), 9u);
  ASSERT_EQ(b.size(), 9u);
  bool any_diff = false;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(EvalExampleToJson(a[i]), EvalExampleToJson(b[i]));
    any_diff |= EvalExampleToJson(a[i]) != EvalExampleToJson(c[i]);
  }
  EXPECT_TRUE(any_diff) << "different seeds gave identical sets";
}

TEST(EvalSetTest, ShapeAnswersInTextAndLength) {
  auto set = GenerateEvalSet(Opts(12, 3, {}));
  ASSERT_EQ(set.size(), 12u);
  for (size_t i = 0; i < set.size(); ++i) {
    const EvalExample& ex = set[i];
    EXPECT_EQ(ex.task, EvalTaskNames()[i % EvalTaskNames().size()]);
    ASSERT_EQ(ex.chunks.size(), 6u);
    ASSERT_FALSE(ex.answers.empty());
    EXPECT_GE(ChunkWith(ex, ex.answers[0]), 0) << ex.answers[0] << " in " << EvalExampleToJson(ex);
    for (const std::string& c : ex.chunks) {
      size_t words = std::count(c.begin(), c.end(), ' ') + 1;
      EXPECT_GE(words, 60u);
      EXPECT_LE(words, 100u);
    }
  }
}

TEST(EvalSetTest, MultihopFactsInDifferentChunks) {
  auto set = GenerateEvalSet(Opts(10, 11, {"multihop"}));
  for (const EvalExample& ex : set) {
    // "Where does <A>'s manager work?"
    const std::string prefix = "Where does ";
    ASSERT_EQ(ex.question.rfind(prefix, 0), 0u);
    std::string name1 = ex.question.substr(prefix.size(), ex.question.find("'s manager") - prefix.size());
    int a = ChunkWith(ex, name1 + "'s manager is ");
    ASSERT_GE(a, 0);
    size_t at = ex.chunks[a].find(name1 + "'s manager is ") + name1.size() + 14;
    std::string name2 = ex.chunks[a].substr(at, ex.chunks[a].find('.', at) - at);
    int b = ChunkWith(ex, name2 + " works in " + ex.answers[0] + ".");
    ASSERT_GE(b, 0) << name2;
    EXPECT_LT(a, b);
  }
}

TEST(EvalSetTest, NeedleDepthVaries) {
  auto set = GenerateEvalSet(Opts(8, 5, {"needle"}));
  std::set<int> depths;
  for (const EvalExample& ex : set) {
    int d = ChunkWith(ex, "The secret code of ");
    ASSERT_GE(d, 0);
    EXPECT_GE(ChunkWith(ex, " is " + ex.answers[0] + "."), 0);
    depths.insert(d);
  }
  EXPECT_GE(depths.size(), 4u);
}

TEST(EvalSetTest, CorefRefersBackAcrossChunks) {
  auto set = GenerateEvalSet(Opts(10, 2, {"coref"}));
  for (const EvalExample& ex : set) {
    std::string name = ex.question.substr(11, ex.question.size() - 11 - 6);  // "Where does X live?"
    int intro = ChunkWith(ex, name + " is ");
    int lives = ChunkWith(ex, "lives in " + ex.answers[0]);
    ASSERT_GE(intro, 0) << name;
    ASSERT_GE(lives, 0);
    EXPECT_LT(intro, lives);
    EXPECT_EQ(ex.chunks[lives].find(name), std::string::npos) << "named in the fact chunk";
  }
}

// xref / split: the asked code opens the chunk after the one that ends with
// the person, never names anyone, and at least one other pair gives a
// different code, so only the boundary ties the answer to the question.
TEST(EvalSetTest, XrefAndSplitBindOnlyAcrossTheChunkBoundary) {
  for (const std::string task : {"xref", "split"}) {
    SCOPED_TRACE(task);
    const bool split = task == "split";
    auto opens_with_code = [&](const std::string& chunk) {
      return split ? chunk.rfind(" is ", 0) == 0
                   : chunk.rfind("Her secret code is ", 0) == 0 ||
                         chunk.rfind("His secret code is ", 0) == 0;
    };
    auto set = GenerateEvalSet(Opts(12, 4, {task}));
    std::set<int> pairs_seen;
    for (const EvalExample& ex : set) {
      ASSERT_EQ(ex.task, task);
      const std::string prefix = "What is the secret code of ";
      ASSERT_EQ(ex.question.rfind(prefix, 0), 0u) << ex.question;
      const std::string name =
          ex.question.substr(prefix.size(), ex.question.size() - prefix.size() - 1);
      int code_chunk = ChunkWith(ex, " is " + ex.answers[0] + ".");
      ASSERT_GE(code_chunk, 1) << EvalExampleToJson(ex);
      const std::string& c = ex.chunks[code_chunk];
      EXPECT_TRUE(opens_with_code(c)) << c;
      EXPECT_EQ(c.find(name), std::string::npos);
      const std::string& prev = ex.chunks[code_chunk - 1];
      if (split) {
        const std::string tail = "The secret code of " + name;
        EXPECT_EQ(ChunkWith(ex, "The secret code of "), code_chunk - 1) << "one secret code";
        ASSERT_GE(prev.size(), tail.size());
        EXPECT_EQ(prev.substr(prev.size() - tail.size()), tail) << prev;
      } else {
        const size_t intro = prev.rfind(name + " is a ");
        ASSERT_NE(intro, std::string::npos) << name << " not in " << prev;
        EXPECT_EQ(prev.find('.', intro), prev.size() - 1) << "intro is not the last sentence";
      }
      int pairs = 0;
      for (const std::string& chunk : ex.chunks) pairs += opens_with_code(chunk);
      EXPECT_GE(pairs, 2);
      pairs_seen.insert(pairs);
    }
    EXPECT_GE(pairs_seen.size(), 2u) << "the number of pairs should vary";

    TrainingDocument doc = GenerateXrefTrainingDocument(8, 40, 5, split);
    ASSERT_EQ(doc.questions.size() == 1, split) << doc.questions.size();
    ASSERT_EQ(doc.questions.size(), doc.answers.size());
    for (size_t i = 0; i < doc.questions.size(); ++i) {
      EXPECT_EQ(doc.tasks[i], task);
      bool found = false;
      for (const std::string& chunk : doc.chunks) {
        found |= chunk.find(" is " + doc.answers[i] + ".") != std::string::npos;
      }
      EXPECT_TRUE(found) << doc.answers[i];
    }
    EXPECT_EQ(GenerateXrefTrainingDocument(8, 40, 5, split).chunks, doc.chunks);
  }
}

TEST(EvalSetTest, JsonlRoundTrip) {
  auto set = GenerateEvalSet(Opts(6, 1, {}));
  const std::string path = TempPath("roundtrip");
  ASSERT_TRUE(WriteEvalSet(path, set).ok());
  auto loaded = LoadEvalSet(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->size(), set.size());
  for (size_t i = 0; i < set.size(); ++i) {
    EXPECT_EQ((*loaded)[i].chunks, set[i].chunks);
    EXPECT_EQ((*loaded)[i].question, set[i].question);
    EXPECT_EQ((*loaded)[i].answers, set[i].answers);
    EXPECT_EQ((*loaded)[i].task, set[i].task);
  }
  std::string line = EvalExampleToJson(set[0]);
  EXPECT_EQ(line.rfind("{\"chunks\":", 0), 0u) << line;
  std::remove(path.c_str());
}

TEST(EvalSetTest, BadLinesNameTheLine) {
  const std::string path = TempPath("bad");
  {
    std::ofstream out(path);
    out << "{\"chunks\": [\"a\"], \"question\": \"q\", \"answers\": [\"x\"]}\n\n"
        << "{\"chunks\": [\"a\"], \"question\": \"q\", \"answers\": \"x\", \"task\": \"t\"}\n"
        << "{\"chunks\": [\"a\"], \"question\": 3, \"answers\": [\"x\"]}\n";
  }
  auto r = LoadEvalSet(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(":4: "), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("question"), std::string::npos) << r.status();
  {
    std::ofstream out(path);
    out << "{\"chunks\": [\"a\"], \"question\": \"q\", \"answers\": [\"x\"]}\n{not json\n";
  }
  r = LoadEvalSet(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(":2: invalid JSON"), std::string::npos) << r.status();
  EXPECT_EQ(LoadEvalSet(path + ".missing").status().code(), absl::StatusCode::kNotFound);
  std::remove(path.c_str());
}

TEST(EvalSetTest, ValidateRejectsUnknownTask) {
  EXPECT_FALSE(ValidateEvalSetOptions(Opts(1, 0, {"bogus"})).ok());
  EXPECT_TRUE(ValidateEvalSetOptions(Opts(1, 0, {"needle"})).ok());
  EXPECT_TRUE(ValidateEvalSetOptions(Opts(1, 0, {"twohop"})).ok());
}

// twohop: whole-sentence passages; the asked person's company and that
// company's code sit in two different chunks, and a decoy chain of the same
// shape exists, so no single chunk answers the question.
TEST(EvalSetTest, TwohopNeedsTwoChunksAndHasADecoyChain) {
  auto set = GenerateEvalSet(Opts(12, 21, {"twohop"}));
  ASSERT_EQ(set.size(), 12u);
  for (const EvalExample& ex : set) {
    EXPECT_EQ(ex.task, "twohop");
    const std::string prefix = "What is the secret code of the company where ";
    ASSERT_EQ(ex.question.rfind(prefix, 0), 0u) << ex.question;
    const std::string person = ex.question.substr(prefix.size(), ex.question.size() - prefix.size() - 7);
    int a = ChunkWith(ex, person + " works at ");
    ASSERT_GE(a, 0) << person;
    size_t at = ex.chunks[a].find(person + " works at ") + person.size() + 10;
    const std::string company = ex.chunks[a].substr(at, ex.chunks[a].find('.', at) - at);
    ASSERT_NE(company.find(" Labs"), std::string::npos) << company;
    int c = ChunkWith(ex, "The secret code of " + company + " is " + ex.answers[0] + ".");
    ASSERT_GE(c, 0) << company;
    EXPECT_NE(a, c) << "the two hops must be in different chunks";
    EXPECT_EQ(ex.chunks[a].find(ex.answers[0]), std::string::npos) << "hop 1 must not hold the code";
    // Exactly two "works at" and two secret codes: the asked chain and a decoy.
    int works = 0, codes = 0;
    for (const std::string& ch : ex.chunks) {
      for (size_t p = ch.find(" works at "); p != std::string::npos; p = ch.find(" works at ", p + 1)) ++works;
      for (size_t p = ch.find("The secret code of "); p != std::string::npos;
           p = ch.find("The secret code of ", p + 1)) {
        ++codes;
      }
      // Whole passages: every chunk ends a sentence.
      EXPECT_EQ(ch.back(), '.');
    }
    EXPECT_EQ(works, 2);
    EXPECT_EQ(codes, 2);
  }
  // Byte-stable by seed (the card's twohop numbers depend on it): same
  // options, same bytes; and the first example of seed 0 is pinned.
  auto again = GenerateEvalSet(Opts(12, 21, {"twohop"}));
  for (size_t i = 0; i < set.size(); ++i) EXPECT_EQ(EvalExampleToJson(set[i]), EvalExampleToJson(again[i]));
  auto seed0 = GenerateEvalSet(Opts(1, 0, {"twohop"}));
  ASSERT_EQ(seed0.size(), 1u);
  EXPECT_EQ(seed0[0].question, "What is the secret code of the company where Olga Lindqvist works?");
  EXPECT_EQ(seed0[0].answers, std::vector<std::string>{"65915"});
  // "all" still means the first five tasks (existing sets keep their bytes).
  for (const EvalExample& ex : GenerateEvalSet(Opts(12, 3, {}))) EXPECT_NE(ex.task, "twohop");
}

TEST(EvalSetTest, AnswerScoring) {
  EXPECT_EQ(NormalizeAnswer("  The  Quick, brown FOX! "), "quick brown fox");
  EXPECT_EQ(AnswerSpan("\n  Lisbon.\nmore"), "Lisbon.");
  EXPECT_EQ(ExactMatch(" Lisbon.\nQuestion: x", {"Lisbon"}), 1.0);
  EXPECT_EQ(ExactMatch("lisbon is lovely", {"Lisbon"}), 1.0);
  EXPECT_EQ(ExactMatch("Lisbonia", {"Lisbon"}), 0.0);
  EXPECT_EQ(ExactMatch("in Lisbon", {"Lisbon"}), 0.0);
  EXPECT_EQ(ExactMatch("", {""}), 0.0);
  EXPECT_DOUBLE_EQ(TokenF1("in Lisbon", {"Lisbon"}), 2 * 0.5 * 1.0 / 1.5);
  EXPECT_DOUBLE_EQ(TokenF1("Oslo", {"Lisbon", "Oslo"}), 1.0);
  EXPECT_DOUBLE_EQ(TokenF1("", {"Oslo"}), 0.0);
}

TEST(EvalSetTest, WorksWithAModelTokenizer) {
  auto tok = Tokenizer::FromFile(testing::GeneratedModelDir("llama") + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto set = GenerateEvalSet(Opts(3, 4, {}));
  for (const EvalExample& ex : set) {
    for (const std::string& c : ex.chunks) {
      std::vector<int32_t> ids = (*tok)->Encode(c);
      EXPECT_GT(ids.size(), 40u);
      EXPECT_EQ((*tok)->Decode(ids), c);
    }
  }
}

// The span decodes to the answer with its leading space, for every task, on
// a real byte-level BPE tokenizer; and it is the first word-bounded match.
TEST(EvalSetTest, FindAnswerTokensLocatesTheAnswerInTheContext) {
  auto tok = Tokenizer::FromFile(testing::GeneratedModelDir("llama") + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  for (const EvalExample& ex : GenerateEvalSet(Opts(20, 6, {}))) {
    SCOPED_TRACE(EvalExampleToJson(ex));
    std::vector<int32_t> context;
    for (const std::string& c : ex.chunks) {
      std::vector<int32_t> ids = (*tok)->Encode(c);
      context.insert(context.end(), ids.begin(), ids.end());
    }
    TokenSpan span = FindAnswerTokens(**tok, ex.chunks, ex.answers);
    ASSERT_FALSE(span.empty());
    ASSERT_LE(span.end, static_cast<int64_t>(context.size()));
    std::vector<int32_t> ids(context.begin() + span.begin, context.begin() + span.end);
    EXPECT_EQ((*tok)->Decode(ids), " " + ex.answers[0]);
  }
  // "12" inside "5123" or "12a" is not the answer; the later standalone one is.
  TokenSpan span = FindAnswerTokens(**tok, {"code 5123 and 12a.", "It is 12."}, {"12"});
  std::vector<int32_t> first = (*tok)->Encode("code 5123 and 12a.");
  std::vector<int32_t> second = (*tok)->Encode("It is 12.");
  std::vector<int32_t> both = first;
  both.insert(both.end(), second.begin(), second.end());
  ASSERT_FALSE(span.empty());
  EXPECT_GE(span.begin, static_cast<int64_t>(first.size()));
  EXPECT_EQ(
      (*tok)->Decode(std::vector<int32_t>(both.begin() + span.begin, both.begin() + span.end)),
      " 12");
  EXPECT_TRUE(FindAnswerTokens(**tok, {"nothing here"}, {"Paris"}).empty());
  EXPECT_TRUE(FindAnswerTokens(**tok, {"nothing here"}, {""}).empty());
}

}  // namespace
}  // namespace infoflow
