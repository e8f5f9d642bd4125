// infoflow-train: see engine/train/trainer.h and `infoflow-train --help`.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include "engine/train/trainer.h"

int main(int argc, char** argv) {
  infoflow::TrainOptions options;
  bool help = false;
  if (absl::Status s = infoflow::ParseTrainFlags(argc, argv, &options, &help); !s.ok()) {
    std::fprintf(stderr, "infoflow-train: %s\n\n%s", s.ToString().c_str(), infoflow::kTrainUsage);
    return 2;
  }
  if (help) {
    std::fputs(infoflow::kTrainUsage, stdout);
    return 0;
  }
  absl::StatusOr<std::unique_ptr<infoflow::Trainer>> trainer = infoflow::Trainer::Create(options);
  if (!trainer.ok()) {
    std::fprintf(stderr, "infoflow-train: %s\n", trainer.status().ToString().c_str());
    return 1;
  }
  // INFOFLOW_TRAIN_DUMP=N: print the first N training documents of step 0
  // (answer targets in [[...]], positions of the first and last token) and exit.
  if (const char* dump = std::getenv("INFOFLOW_TRAIN_DUMP"); dump != nullptr) {
    for (int i = 0; i < std::atoi(dump); ++i) {
      infoflow::Document d = (*trainer)->TrainDocument(0, i);
      std::string text;
      bool in = false;
      for (size_t t = 1; t < d.tokens.size(); ++t) {
        const bool a = d.answer[t - 1] != 0;
        if (a != in) text += a ? "[[" : "]]";
        in = a;
        text += (*trainer)->tokenizer().Decode({static_cast<int32_t>(d.tokens[t])});
      }
      if (in) text += "]]";
      std::printf("--- doc %d (%s, %d chunks, %zu tokens, positions %lld..%lld)\n%s\n", i,
                  d.task.c_str(), d.chunks, d.tokens.size(),
                  static_cast<long long>(d.positions.front()),
                  static_cast<long long>(d.positions.back()), text.c_str());
    }
    return 0;
  }
  if (absl::Status s = (*trainer)->Train(std::cout); !s.ok()) {
    std::fprintf(stderr, "infoflow-train: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
