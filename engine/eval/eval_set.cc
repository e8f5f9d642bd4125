#include "engine/eval/eval_set.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/text/tokenizer.h"
#include "nlohmann/json.hpp"

namespace infoflow {
namespace {

using Rng = std::mt19937_64;

// ---- Word pools. Fact pools and filler pools are disjoint on purpose. ----
const std::vector<std::string> kFemaleFirst = {
    "Alice", "Beatrice", "Clara", "Dana", "Elena", "Fiona", "Greta", "Helena",
    "Iris",  "Julia",    "Karen", "Lena", "Maya",  "Nora",  "Olga",  "Petra"};
const std::vector<std::string> kMaleFirst = {
    "Arthur", "Bruno", "Carl", "Daniel", "Edgar", "Felix", "Gustav", "Hugo",
    "Ivan",   "Jonas", "Karl", "Leon",   "Marco", "Nils",  "Oscar",  "Peter"};
const std::vector<std::string> kSurnames = {
    "Halvorsen", "Quintero", "Brandt", "Okafor", "Lindqvist", "Moreau", "Tanaka", "Kowalski",
    "Esposito",  "Novak",    "Fischer", "Duarte", "Varga",    "Sorensen", "Mendes", "Ibarra"};
const std::vector<std::string> kCities = {
    "Lisbon", "Oslo", "Nairobi", "Toronto", "Kyoto",  "Santiago", "Dublin", "Krakow", "Melbourne",
    "Seville", "Hanoi", "Tbilisi", "Quito",  "Bergen", "Lyon",     "Porto",  "Zagreb", "Tallinn"};
const std::vector<std::string> kJobs = {
    "pharmacist", "architect",   "beekeeper", "cartographer", "locksmith",
    "violinist",  "geologist",   "glassblower", "translator", "veterinarian"};

const std::vector<std::string> kFillerNames = {
    "Torvik", "Amsel",  "Quillon", "Baryn",     "Festra", "Odalric", "Nimue", "Caspar",
    "Ysolde", "Branoc", "Merrit",  "Talwyn",    "Orsolya", "Idris",  "Rasmo", "Wendeline"};
const std::vector<std::string> kLandmarks = {
    "old mill",    "harbor market", "clock tower",   "stone bridge", "botanical garden",
    "river ferry", "lighthouse",    "town library",  "north quarry", "railway depot"};
const std::vector<std::string> kActivities = {
    "sketching boats",     "repairing a bicycle", "reading old newspapers", "feeding pigeons",
    "painting fences",     "sorting seashells",   "practicing the flute",   "planting tulips"};
const std::vector<std::string> kObjects = {"lantern", "umbrella", "teapot", "kite",
                                           "notebook", "compass", "saddle", "rug"};
const std::vector<std::string> kAdjectives = {"blue",  "heavy", "tiny",  "ancient",
                                              "crooked", "shiny", "faded", "striped"};
const std::vector<std::string> kPeriods = {"winter", "spring", "summer", "autumn",
                                           "week",   "month",  "year"};
const std::vector<std::string> kTopics = {
    "the price of apples", "the best way to brew tea", "whether owls can swim",
    "the color of the sea", "an unfinished crossword", "the rules of chess"};
const std::vector<std::string> kStates = {
    "lost within a day",   "surprisingly cheap", "too large to carry",
    "admired by everyone", "broken on arrival",  "a gift from a cousin"};

uint64_t SplitMix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

size_t Uniform(Rng& rng, size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); }
int UniformInt(Rng& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
const std::string& Pick(Rng& rng, const std::vector<std::string>& pool) {
  return pool[Uniform(rng, pool.size())];
}

// `k` distinct indices into a pool of size n.
std::vector<size_t> Distinct(Rng& rng, size_t n, size_t k) {
  std::vector<size_t> idx(n);
  for (size_t i = 0; i < n; ++i) idx[i] = i;
  for (size_t i = 0; i < k; ++i) std::swap(idx[i], idx[i + Uniform(rng, n - i)]);
  idx.resize(k);
  return idx;
}

std::string FillerSentence(Rng& rng) {
  const std::string& a = Pick(rng, kFillerNames);
  switch (Uniform(rng, 7)) {
    case 0:
      return absl::StrCat(a, " spent the afternoon ", Pick(rng, kActivities), " near the ",
                          Pick(rng, kLandmarks), ".");
    case 1:
      return absl::StrCat("The ", Pick(rng, kAdjectives), " ", Pick(rng, kObjects), " that ", a,
                          " bought last ", Pick(rng, kPeriods), " was ", Pick(rng, kStates), ".");
    case 2:
      return absl::StrCat("According to ", a, ", the ", Pick(rng, kLandmarks),
                          " is best visited in ", Pick(rng, kPeriods), ".");
    case 3: {
      std::string b = Pick(rng, kFillerNames);
      if (b == a) b = "a neighbor";
      return absl::StrCat(a, " and ", b, " once argued for an hour about ", Pick(rng, kTopics),
                          ".");
    }
    case 4:
      return absl::StrCat("Nobody remembers why the ", Pick(rng, kLandmarks),
                          " closed early that ", Pick(rng, kPeriods), ".");
    case 5: {
      const std::string& period = Pick(rng, kPeriods);
      const std::string& adj = Pick(rng, kAdjectives);
      const char* article = std::string("aeiou").find(adj[0]) != std::string::npos ? " an " : " a ";
      return absl::StrCat("Every ", period, ", ", a, " keeps", article, adj, " ",
                          Pick(rng, kObjects), " by the door.");
    }
    default:
      return absl::StrCat("Visitors to the ", Pick(rng, kLandmarks), " often find ", a, " ",
                          Pick(rng, kActivities), ".");
  }
}

int CountWords(const std::string& s) {
  int n = 0;
  bool in_word = false;
  for (char c : s) {
    bool space = std::isspace(static_cast<unsigned char>(c)) != 0;
    if (!space && !in_word) ++n;
    in_word = !space;
  }
  return n;
}

enum class Place { kAnywhere, kFirst, kLast };
struct Fact {
  int chunk;
  Place place;
  std::string sentence;
};

// Builds n_chunks chunks of ~chunk_words words: filler with `facts` placed.
std::vector<std::string> BuildChunks(Rng& rng, int n_chunks, int chunk_words,
                                     const std::vector<Fact>& facts) {
  std::vector<std::string> chunks;
  for (int c = 0; c < n_chunks; ++c) {
    std::vector<const Fact*> mine;
    int words = 0;
    for (const Fact& f : facts) {
      if (f.chunk == c) {
        mine.push_back(&f);
        words += CountWords(f.sentence);
      }
    }
    std::vector<std::string> sentences;
    do {
      sentences.push_back(FillerSentence(rng));
      words += CountWords(sentences.back());
    } while (words < chunk_words);
    std::string first, last;
    for (const Fact* f : mine) {
      if (f->place == Place::kFirst) {
        first = f->sentence;
      } else if (f->place == Place::kLast) {
        last = f->sentence;
      } else {
        sentences.insert(sentences.begin() + Uniform(rng, sentences.size() + 1), f->sentence);
      }
    }
    if (!first.empty()) sentences.insert(sentences.begin(), first);
    if (!last.empty()) sentences.push_back(last);
    chunks.push_back(absl::StrJoin(sentences, " "));
  }
  return chunks;
}

struct Person {
  std::string name;
  bool female;
};

// `k` people with distinct first names and distinct surnames.
std::vector<Person> People(Rng& rng, size_t k) {
  std::vector<size_t> first = Distinct(rng, kFemaleFirst.size() + kMaleFirst.size(), k);
  std::vector<size_t> last = Distinct(rng, kSurnames.size(), k);
  std::vector<Person> out;
  for (size_t i = 0; i < k; ++i) {
    bool female = first[i] < kFemaleFirst.size();
    const std::string& f =
        female ? kFemaleFirst[first[i]] : kMaleFirst[first[i] - kFemaleFirst.size()];
    out.push_back({absl::StrCat(f, " ", kSurnames[last[i]]), female});
  }
  return out;
}

// The fact and question phrasings, shared by the eval tasks and the
// training documents (a model trained on one must be asked the other).
std::string NeedleFact(const std::string& name, const std::string& code) {
  return absl::StrCat("The secret code of ", name, " is ", code, ".");
}
std::string NeedleQuestion(const std::string& name) {
  return absl::StrCat("What is the secret code of ", name, "?");
}
std::string ManagerFact(const std::string& a, const std::string& b) {
  return absl::StrCat(a, "'s manager is ", b, ".");
}
std::string WorksInFact(const std::string& name, const std::string& city) {
  return absl::StrCat(name, " works in ", city, ".");
}
std::string ManagerQuestion(const std::string& a) {
  return absl::StrCat("Where does ", a, "'s manager work?");
}
std::string PronounIntroFact(const std::string& name, const std::string& job,
                             const std::string& landmark) {
  return absl::StrCat(name, " is a ", job, " who grew up near the ", landmark, ".");
}
std::string PronounLivesFact(bool female, const std::string& city) {
  return absl::StrCat(female ? "She" : "He", " lives in ", city, " and rarely travels.");
}
std::string AliasIntroFact(const std::string& name, const std::string& job) {
  return absl::StrCat(name, " is the only ", job, " in the family.");
}
std::string AliasLivesFact(const std::string& job, const std::string& city) {
  return absl::StrCat("The ", job, " lives in ", city, ".");
}
std::string LivesInFact(const std::string& name, const std::string& city) {
  return absl::StrCat(name, " lives in ", city, ".");
}
std::string LivesQuestion(const std::string& name) {
  return absl::StrCat("Where does ", name, " live?");
}
std::string PronounCodeFact(bool female, const std::string& code) {
  return absl::StrCat(female ? "Her" : "His", " secret code is ", code, ".");
}

// Other numbered attributes: the decoys of the split task.
const std::vector<std::string> kDecoyKeys = {"room number", "phone number", "ticket number",
                                             "badge number"};

// xref and split: k >= 2 (when n >= 3) numbered facts at distinct chunk
// boundaries, each about a different person (genders mixed); the question
// asks for one of them.
//   xref: chunk c ends with PronounIntroFact(<P_c>), chunk c+1 opens with
//   "Her/His secret code is <n_c>."; any pair is asked.
//   split: "The <key> of <P_c> is <n_c>." cut after the name, as fixed-size
//   chunking cuts sentences: chunk c ends "The <key> of <P_c>", chunk c+1
//   opens " is <n_c>." (the space stays with the second half, so FULL's
//   tokens are the uncut sentence's). One fact has key "secret code" and is
//   asked; the others are decoys (room number, ...). The asked fact differs
//   from the decoys only by words in chunk c.
// Either way nothing in chunk c+1 ties its number to a person or a key:
// only the previous chunk's last words do.
struct XrefLayout {
  std::vector<std::string> chunks;
  std::vector<std::pair<std::string, std::string>> name_code;  // in chunk order
  size_t asked = 0;  // split: the index of the secret code
};
XrefLayout MakeXrefLayout(Rng& rng, int n, int words, bool split) {
  const int boundaries = std::min<int>(n - 1, kSurnames.size());
  const int k = UniformInt(rng, std::min(2, boundaries), boundaries);
  std::vector<size_t> at = Distinct(rng, n - 1, k);
  std::sort(at.begin(), at.end());
  std::vector<Person> p = People(rng, k);
  std::vector<Fact> facts;
  XrefLayout out;
  out.asked = Uniform(rng, k);
  for (int i = 0; i < k; ++i) {
    const int c = static_cast<int>(at[i]);
    std::string code = std::to_string(UniformInt(rng, 10000, 99999));
    if (split) {
      const std::string key =
          static_cast<size_t>(i) == out.asked ? "secret code" : Pick(rng, kDecoyKeys);
      facts.push_back({c, Place::kLast, absl::StrCat("The ", key, " of ", p[i].name)});
      facts.push_back({c + 1, Place::kFirst, absl::StrCat(" is ", code, ".")});
    } else {
      facts.push_back(
          {c, Place::kLast, PronounIntroFact(p[i].name, Pick(rng, kJobs), Pick(rng, kLandmarks))});
      facts.push_back({c + 1, Place::kFirst, PronounCodeFact(p[i].female, code)});
    }
    out.name_code.emplace_back(p[i].name, code);
  }
  out.chunks = BuildChunks(rng, n, words, facts);
  return out;
}

EvalExample MakeXref(Rng& rng, int n, int words, bool split) {
  XrefLayout layout = MakeXrefLayout(rng, n, words, split);
  const size_t asked = split ? layout.asked : Uniform(rng, layout.name_code.size());
  const auto& [name, code] = layout.name_code[asked];
  EvalExample ex;
  ex.task = split ? "split" : "xref";
  ex.question = NeedleQuestion(name);
  ex.answers = {code};
  ex.chunks = std::move(layout.chunks);
  return ex;
}

EvalExample MakeMultihop(Rng& rng, int n, int words) {
  std::vector<Person> p = People(rng, 3);
  std::vector<size_t> city = Distinct(rng, kCities.size(), 2);
  int a = UniformInt(rng, 0, n - 2);
  int b = UniformInt(rng, a + 1, n - 1);
  std::vector<Fact> facts = {
      {a, Place::kAnywhere, ManagerFact(p[0].name, p[1].name)},
      {b, Place::kAnywhere, WorksInFact(p[1].name, kCities[city[0]])},
      // A distractor: someone else's workplace, anywhere.
      {UniformInt(rng, 0, n - 1), Place::kAnywhere,
       WorksInFact(p[2].name, kCities[city[1]])}};
  EvalExample ex;
  ex.task = "multihop";
  ex.chunks = BuildChunks(rng, n, words, facts);
  ex.question = ManagerQuestion(p[0].name);
  ex.answers = {kCities[city[0]]};
  return ex;
}

EvalExample MakeNeedle(Rng& rng, int n, int words, int depth_chunk) {
  Person p = People(rng, 1)[0];
  std::string code = std::to_string(UniformInt(rng, 10000, 99999));
  std::vector<Fact> facts = {
      {depth_chunk, Place::kAnywhere, NeedleFact(p.name, code)}};
  EvalExample ex;
  ex.task = "needle";
  ex.chunks = BuildChunks(rng, n, words, facts);
  ex.question = NeedleQuestion(p.name);
  ex.answers = {code};
  return ex;
}

EvalExample MakeCoref(Rng& rng, int n, int words) {
  std::vector<Person> p = People(rng, 2);
  std::vector<size_t> city = Distinct(rng, kCities.size(), 2);
  const std::string& job = Pick(rng, kJobs);
  const std::string& landmark = Pick(rng, kLandmarks);
  int a = UniformInt(rng, 0, n - 2);
  std::vector<Fact> facts;
  if (rng() & 1) {
    // Pronoun: the introduction ends chunk a, the pronoun opens chunk a+1.
    facts.push_back({a, Place::kLast,
                     PronounIntroFact(p[0].name, job, landmark)});
    facts.push_back({a + 1, Place::kFirst,
                     PronounLivesFact(p[0].female, kCities[city[0]])});
  } else {
    // Alias: "the <job>" in any later chunk.
    int b = UniformInt(rng, a + 1, n - 1);
    facts.push_back({a, Place::kAnywhere,
                     AliasIntroFact(p[0].name, job)});
    facts.push_back({b, Place::kAnywhere,
                     AliasLivesFact(job, kCities[city[0]])});
  }
  facts.push_back({UniformInt(rng, 0, n - 1), Place::kAnywhere,
                   LivesInFact(p[1].name, kCities[city[1]])});
  EvalExample ex;
  ex.task = "coref";
  ex.chunks = BuildChunks(rng, n, words, facts);
  ex.question = LivesQuestion(p[0].name);
  ex.answers = {kCities[city[0]]};
  return ex;
}

// twohop: whole passages (chunks end at sentence ends, no fact is cut); the
// answer needs a fact from two different chunks, and one decoy chain of the
// same shape makes a one-hop copy right only by chance (1/2):
//   chunk a: "<X> works at <S1> Labs."   chunk c != a: "The secret code of
//   <S1> Labs is <n1>."  chunk b: "<Y> works at <S2> Labs."  chunk d != b:
//   "The secret code of <S2> Labs is <n2>."
//   Q: "What is the secret code of the company where <X> works?"  answer: n1
EvalExample MakeTwohop(Rng& rng, int n, int words) {
  // Four distinct surnames: two people, two companies.
  std::vector<Person> p = People(rng, 4);
  const std::string company[2] = {absl::StrCat(p[2].name.substr(p[2].name.find(' ') + 1), " Labs"),
                                  absl::StrCat(p[3].name.substr(p[3].name.find(' ') + 1), " Labs")};
  std::string code[2];
  do {
    code[0] = std::to_string(UniformInt(rng, 10000, 99999));
    code[1] = std::to_string(UniformInt(rng, 10000, 99999));
  } while (code[0] == code[1]);
  std::vector<Fact> facts;
  for (int i = 0; i < 2; ++i) {
    const int works = UniformInt(rng, 0, n - 1);
    int coded = UniformInt(rng, 0, n - 2);
    if (coded >= works) ++coded;  // a different chunk
    facts.push_back({works, Place::kAnywhere, absl::StrCat(p[i].name, " works at ", company[i], ".")});
    facts.push_back({coded, Place::kAnywhere, NeedleFact(company[i], code[i])});
  }
  EvalExample ex;
  ex.task = "twohop";
  ex.chunks = BuildChunks(rng, n, words, facts);
  ex.question = absl::StrCat("What is the secret code of the company where ", p[0].name, " works?");
  ex.answers = {code[0]};
  return ex;
}

std::vector<std::string> Words(const std::string& normalized) {
  return absl::StrSplit(normalized, ' ', absl::SkipEmpty());
}

}  // namespace

const std::vector<std::string>& EvalTaskNames() {
  static const std::vector<std::string> kNames = {"multihop", "needle", "coref", "xref", "split"};
  return kNames;
}

const std::vector<std::string>& ExtraEvalTaskNames() {
  static const std::vector<std::string> kNames = {"twohop"};
  return kNames;
}

namespace {
bool IsTaskName(const std::string& t) {
  for (const auto* names : {&EvalTaskNames(), &ExtraEvalTaskNames()}) {
    if (std::find(names->begin(), names->end(), t) != names->end()) return true;
  }
  return false;
}
}  // namespace

absl::Status ValidateEvalSetOptions(const EvalSetOptions& options) {
  if (options.n_examples <= 0) return absl::InvalidArgumentError("n_examples must be > 0");
  if (options.n_chunks <= 0) return absl::InvalidArgumentError("n_chunks must be > 0");
  if (options.chunk_words <= 0) return absl::InvalidArgumentError("chunk_words must be > 0");
  for (const std::string& t : options.tasks) {
    if (!IsTaskName(t)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown task '", t, "' (want ",
                                                     absl::StrJoin(EvalTaskNames(), "|"), "|",
                                                     absl::StrJoin(ExtraEvalTaskNames(), "|"), ")"));
    }
  }
  return absl::OkStatus();
}

std::vector<EvalExample> GenerateEvalSet(const EvalSetOptions& options) {
  std::vector<std::string> tasks;
  for (const std::string& t : options.tasks.empty() ? EvalTaskNames() : options.tasks) {
    if (IsTaskName(t)) tasks.push_back(t);
  }
  std::vector<EvalExample> out;
  if (tasks.empty()) return out;
  const int n = std::max(2, options.n_chunks);
  const int words = std::max(1, options.chunk_words);
  // Needle depth walks through every chunk from a seeded start, so depths
  // vary across examples by construction.
  const int depth_start = static_cast<int>(SplitMix(options.seed ^ 0x6e656564ull) % n);
  int needles = 0;
  for (int i = 0; i < options.n_examples; ++i) {
    Rng rng(SplitMix(options.seed ^ SplitMix(static_cast<uint64_t>(i) + 1)));
    const std::string& task = tasks[i % tasks.size()];
    if (task == "multihop") {
      out.push_back(MakeMultihop(rng, n, words));
    } else if (task == "needle") {
      out.push_back(MakeNeedle(rng, n, words, (depth_start + needles++) % n));
    } else if (task == "xref" || task == "split") {
      out.push_back(MakeXref(rng, n, words, task == "split"));
    } else if (task == "twohop") {
      out.push_back(MakeTwohop(rng, n, words));
    } else {
      out.push_back(MakeCoref(rng, n, words));
    }
  }
  return out;
}

TrainingDocument GenerateTrainingDocument(const TrainingDocOptions& o) {
  Rng rng(SplitMix(o.seed ^ 0x747261696e646f63ull));
  const int n = std::max(2, o.n_chunks);
  const int words = std::max(1, o.chunk_words);
  const int needles = UniformInt(rng, 1, std::max(1, o.max_needles));
  const int hops = UniformInt(rng, 0, std::max(0, o.max_multihops));
  const int corefs = UniformInt(rng, 0, std::max(0, o.max_corefs));
  // Two people per chain or reference, one per needle; at most 16 exist.
  const size_t want = std::min<size_t>(needles + 2 * hops + 2 * corefs, kSurnames.size());
  std::vector<Person> people = People(rng, want);
  size_t next = 0;
  auto person = [&]() -> const Person* { return next < people.size() ? &people[next++] : nullptr; };
  std::vector<size_t> jobs = Distinct(rng, kJobs.size(), std::min<size_t>(corefs, kJobs.size()));
  std::vector<Fact> facts;
  TrainingDocument doc;
  auto add_qa = [&](std::string q, std::string a, const char* task) {
    doc.questions.push_back(std::move(q));
    doc.answers.push_back(std::move(a));
    doc.tasks.push_back(task);
  };
  for (int i = 0; i < needles; ++i) {
    const Person* p = person();
    if (p == nullptr) break;
    std::string code = std::to_string(UniformInt(rng, 10000, 99999));
    facts.push_back({UniformInt(rng, 0, n - 1), Place::kAnywhere,
                     NeedleFact(p->name, code)});
    add_qa(NeedleQuestion(p->name), code, "needle");
  }
  for (int i = 0; i < hops; ++i) {
    const Person* a_p = person();
    const Person* b_p = person();
    if (b_p == nullptr) break;
    const std::string& city = Pick(rng, kCities);
    int a = UniformInt(rng, 0, n - 2);
    int b = UniformInt(rng, a + 1, n - 1);
    facts.push_back({a, Place::kAnywhere, ManagerFact(a_p->name, b_p->name)});
    facts.push_back({b, Place::kAnywhere, WorksInFact(b_p->name, city)});
    add_qa(ManagerQuestion(a_p->name), city, "multihop");
  }
  std::vector<bool> pronoun_at(n, false);  // chunk a holds a pronoun setup at its end
  for (int i = 0; i < corefs && i < static_cast<int>(jobs.size()); ++i) {
    const Person* p = person();
    const Person* other = person();
    if (other == nullptr) break;
    const std::string& job = kJobs[jobs[i]];
    const std::string& city = Pick(rng, kCities);
    int a = UniformInt(rng, 0, n - 2);
    if ((rng() & 1) && !pronoun_at[a]) {
      pronoun_at[a] = true;
      facts.push_back({a, Place::kLast,
                       PronounIntroFact(p->name, job, Pick(rng, kLandmarks))});
      facts.push_back({a + 1, Place::kFirst,
                       PronounLivesFact(p->female, city)});
    } else {
      int b = UniformInt(rng, a + 1, n - 1);
      facts.push_back(
          {a, Place::kAnywhere, AliasIntroFact(p->name, job)});
      facts.push_back({b, Place::kAnywhere, AliasLivesFact(job, city)});
    }
    facts.push_back({UniformInt(rng, 0, n - 1), Place::kAnywhere,
                     LivesInFact(other->name, Pick(rng, kCities))});
    add_qa(LivesQuestion(p->name), city, "coref");
  }
  doc.chunks = BuildChunks(rng, n, words, facts);
  // Questions in random order (not fact order).
  for (size_t i = doc.questions.size(); i > 1; --i) {
    const size_t j = Uniform(rng, i);
    std::swap(doc.questions[i - 1], doc.questions[j]);
    std::swap(doc.answers[i - 1], doc.answers[j]);
    std::swap(doc.tasks[i - 1], doc.tasks[j]);
  }
  return doc;
}

TrainingDocument GenerateXrefTrainingDocument(int n_chunks, int chunk_words, uint64_t seed,
                                              bool split) {
  Rng rng(SplitMix(seed ^ 0x78726566646f63ull));
  XrefLayout layout = MakeXrefLayout(rng, std::max(2, n_chunks), std::max(1, chunk_words), split);
  std::vector<size_t> order = Distinct(rng, layout.name_code.size(), layout.name_code.size());
  TrainingDocument doc;
  doc.chunks = std::move(layout.chunks);
  for (size_t i : order) {
    if (split && i != layout.asked) continue;  // only the secret code is asked
    doc.questions.push_back(NeedleQuestion(layout.name_code[i].first));
    doc.answers.push_back(layout.name_code[i].second);
    doc.tasks.push_back(split ? "split" : "xref");
  }
  return doc;
}

std::string EvalExampleToJson(const EvalExample& example) {
  nlohmann::ordered_json j;
  j["chunks"] = example.chunks;
  j["question"] = example.question;
  j["answers"] = example.answers;
  j["task"] = example.task;
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

absl::Status WriteEvalSet(const std::string& path, const std::vector<EvalExample>& examples) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  for (const EvalExample& ex : examples) out << EvalExampleToJson(ex) << '\n';
  out.flush();
  if (!out) return absl::DataLossError(absl::StrCat("error writing ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<EvalExample>> LoadEvalSet(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open eval set ", path));
  std::vector<EvalExample> out;
  std::string line;
  int line_no = 0;
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": ", why));
  };
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (std::all_of(line.begin(), line.end(),
                    [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; })) {
      continue;
    }
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      return bad(absl::StrCat("invalid JSON: ", e.what()));
    }
    if (!j.is_object()) return bad("expected a JSON object");
    EvalExample ex;
    auto chunks = j.find("chunks");
    if (chunks == j.end() || !chunks->is_array() || chunks->empty()) {
      return bad("\"chunks\" must be a non-empty array of strings");
    }
    for (const auto& c : *chunks) {
      if (!c.is_string()) return bad("\"chunks\" must be a non-empty array of strings");
      ex.chunks.push_back(c.get<std::string>());
    }
    auto question = j.find("question");
    if (question == j.end() || !question->is_string()) return bad("\"question\" must be a string");
    ex.question = question->get<std::string>();
    auto answers = j.find("answers");
    if (answers != j.end() && answers->is_string()) {
      ex.answers.push_back(answers->get<std::string>());
    } else if (answers != j.end() && answers->is_array()) {
      for (const auto& a : *answers) {
        if (!a.is_string()) return bad("\"answers\" must be an array of strings");
        ex.answers.push_back(a.get<std::string>());
      }
    } else {
      return bad("\"answers\" must be an array of strings");
    }
    auto task = j.find("task");
    if (task != j.end()) {
      if (!task->is_string()) return bad("\"task\" must be a string");
      ex.task = task->get<std::string>();
    }
    out.push_back(std::move(ex));
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no examples"));
  return out;
}

std::string NormalizeAnswer(std::string_view text) {
  std::string lowered;
  for (char c : text) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u < 128 && std::ispunct(u)) continue;
    lowered.push_back(u < 128 ? static_cast<char>(std::tolower(u)) : c);
  }
  std::string out;
  std::istringstream words(lowered);
  std::string w;
  while (words >> w) {
    if (w == "a" || w == "an" || w == "the") continue;
    if (!out.empty()) out.push_back(' ');
    out += w;
  }
  return out;
}

std::string_view AnswerSpan(std::string_view generated) {
  size_t start = generated.find_first_not_of(" \t\r\n");
  if (start == std::string_view::npos) return {};
  std::string_view rest = generated.substr(start);
  return rest.substr(0, rest.find('\n'));
}

double ExactMatch(std::string_view generated, const std::vector<std::string>& answers) {
  const std::string g = NormalizeAnswer(AnswerSpan(generated));
  for (const std::string& answer : answers) {
    const std::string a = NormalizeAnswer(answer);
    if (a.empty()) continue;
    if (g == a || (g.size() > a.size() && g.compare(0, a.size(), a) == 0 && g[a.size()] == ' ')) {
      return 1.0;
    }
  }
  return 0.0;
}

double TokenF1(std::string_view generated, const std::vector<std::string>& answers) {
  const std::vector<std::string> g = Words(NormalizeAnswer(AnswerSpan(generated)));
  double best = 0.0;
  for (const std::string& answer : answers) {
    const std::vector<std::string> a = Words(NormalizeAnswer(answer));
    if (a.empty() || g.empty()) continue;
    std::map<std::string, int> counts;
    for (const std::string& w : a) ++counts[w];
    int common = 0;
    for (const std::string& w : g) {
      auto it = counts.find(w);
      if (it != counts.end() && it->second > 0) {
        --it->second;
        ++common;
      }
    }
    if (common == 0) continue;
    double p = static_cast<double>(common) / g.size();
    double r = static_cast<double>(common) / a.size();
    best = std::max(best, 2 * p * r / (p + r));
  }
  return best;
}

TokenSpan FindAnswerTokens(const Tokenizer& tokenizer, const std::vector<std::string>& chunks,
                           const std::vector<std::string>& answers) {
  auto word_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; };
  int64_t offset = 0;
  for (const std::string& text : chunks) {
    for (const std::string& a : answers) {
      const std::string answer(absl::StripAsciiWhitespace(a));
      if (answer.empty()) continue;
      for (size_t pos = text.find(answer); pos != std::string::npos;
           pos = text.find(answer, pos + 1)) {
        const size_t after = pos + answer.size();
        if ((pos > 0 && word_char(text[pos - 1])) ||
            (after < text.size() && word_char(text[after]))) {
          continue;
        }
        const size_t start = pos > 0 && text[pos - 1] == ' ' ? pos - 1 : pos;
        const auto begin = static_cast<int64_t>(tokenizer.Encode(text.substr(0, start)).size());
        const auto end = static_cast<int64_t>(tokenizer.Encode(text.substr(0, after)).size());
        if (end > begin) return {offset + begin, offset + end};
      }
    }
    offset += static_cast<int64_t>(tokenizer.Encode(text).size());
  }
  return {};
}

}  // namespace infoflow
