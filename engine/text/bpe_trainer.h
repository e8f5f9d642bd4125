// A small byte-level BPE trainer that writes a Hugging Face tokenizer.json,
// used to make tokenizers for test models trained in this project.
#ifndef INFOFLOW_ENGINE_TEXT_BPE_TRAINER_H_
#define INFOFLOW_ENGINE_TEXT_BPE_TRAINER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace infoflow {

// Trains byte-level BPE (GPT-2 style) on `corpus` and returns the full text
// of a tokenizer.json that Tokenizer::FromJsonString loads.
//
// Layout of the ids:
//   0 .. S-1            `special_tokens`, in the given order (added_tokens,
//                       special = true, also listed in model.vocab);
//   S .. S+255          the 256 byte symbols, in byte order (GPT-2's
//                       byte-to-unicode spelling, e.g. byte 0x20 is "Ġ");
//   S+256 .. vocab-1    merged tokens, in the order they were learned.
// Pre-tokenizer: ByteLevel with the GPT-2 regex (add_prefix_space false);
// with `max_digits` N > 0, a Split on DigitSplitPattern(N) (numbers cut into
// pre-tokens of at most N digits, left to right, as Qwen2 (N = 1) and
// Llama 3 (N = 3) do) followed by ByteLevel without regex, and every group
// of 2..N digits ("07", "480") is counted as 2000 extra words so that it
// becomes one token (100 merges for N = 2, 1100 for N = 3); decoder:
// ByteLevel. The post_processor prepends a BOS when
// Encode(text, add_special = true) is called, if "<s>" (else
// "<|begin_of_text|>") is among `special_tokens`; otherwise it adds nothing.
//
// Occurrences of the special tokens inside the corpus are cut out before
// counting. Training repeatedly merges the most frequent adjacent pair;
// ties go to the pair with the smaller (left id, right id), so the output
// is a deterministic function of the arguments. Training stops early (with
// a smaller vocab) when no pair is left to merge.
//
// Errors: InvalidArgument if vocab_size < S + 256, a special token is
// empty or repeated, or max_digits is not in 0..3.
absl::StatusOr<std::string> TrainByteLevelBpeTokenizerJson(
    const std::vector<std::string>& corpus, int vocab_size,
    const std::vector<std::string>& special_tokens, int max_digits = 0);

// GPT-2's split regex with ` ?\p{N}+` replaced by `\p{N}{1,max_digits}`:
// runs of at most `max_digits` digits per pre-token (a space before a number
// becomes its own pre-token). `max_digits` >= 1.
std::string DigitSplitPattern(int max_digits);

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_TEXT_BPE_TRAINER_H_
