// infoflow-train: see engine/train/trainer.h and `infoflow-train --help`.
#include <cstdio>
#include <iostream>

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
  if (absl::Status s = (*trainer)->Train(std::cout); !s.ok()) {
    std::fprintf(stderr, "infoflow-train: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
