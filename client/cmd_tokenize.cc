// `infoflow tokenize`: encode or decode batches with a tokenizer.json.
//
//   infoflow tokenize --tokenizer FILE [--json] [--add-special]
//       stdin: JSON array of strings  -> stdout: JSON array of id arrays
//   infoflow tokenize --tokenizer FILE --decode [--skip-special]
//       stdin: JSON array of id arrays -> stdout: JSON array of strings
#include <cstdio>
#include <cstring>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "client/commands.h"
#include "engine/text/tokenizer.h"
#include "nlohmann/json.hpp"

namespace infoflow::cli {
namespace {

constexpr char kUsage[] =
    "usage: infoflow tokenize --tokenizer FILE [--json] [--add-special]\n"
    "       infoflow tokenize --tokenizer FILE --decode [--skip-special]\n"
    "\n"
    "Encode: reads a JSON array of strings on stdin, prints a JSON array of\n"
    "token id arrays. --add-special adds the special tokens the file's\n"
    "post_processor template adds (e.g. BOS for Llama-2).\n"
    "Decode: reads a JSON array of id arrays, prints a JSON array of strings.\n"
    "--skip-special leaves special tokens out of the text.\n"
    "\n"
    "Exit status: 0 success, 1 runtime error (bad file or input), 2 usage.\n";

int UsageError(const std::string& msg) {
  std::fprintf(stderr, "infoflow tokenize: %s\n\n%s", msg.c_str(), kUsage);
  return 2;
}

}  // namespace

int RunTokenize(int argc, char** argv) {
  std::string path;
  bool add_special = false, decode = false, skip_special = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (arg == "--tokenizer") {
      if (i + 1 >= argc) return UsageError("--tokenizer needs a FILE");
      path = argv[++i];
    } else if (arg.rfind("--tokenizer=", 0) == 0) {
      path = arg.substr(std::strlen("--tokenizer="));
    } else if (arg == "--json") {
      // JSON is the only format; the flag is accepted for clarity.
    } else if (arg == "--add-special") {
      add_special = true;
    } else if (arg == "--decode") {
      decode = true;
    } else if (arg == "--skip-special") {
      skip_special = true;
    } else {
      return UsageError("unknown flag '" + arg + "'");
    }
  }
  if (path.empty()) return UsageError("--tokenizer FILE is required");
  if (decode && add_special) return UsageError("--add-special does not apply to --decode");
  if (!decode && skip_special) return UsageError("--skip-special only applies to --decode");

  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromFile(path);
  if (!tok.ok()) {
    std::fprintf(stderr, "infoflow tokenize: %s\n", std::string(tok.status().message()).c_str());
    return 1;
  }
  const std::string input((std::istreambuf_iterator<char>(std::cin)),
                          std::istreambuf_iterator<char>());
  const nlohmann::json in = nlohmann::json::parse(input, nullptr, /*allow_exceptions=*/false);
  if (in.is_discarded() || !in.is_array()) {
    std::fprintf(stderr, "infoflow tokenize: stdin is not a JSON array\n");
    return 1;
  }
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < in.size(); ++i) {
    const nlohmann::json& item = in[i];
    if (!decode) {
      if (!item.is_string()) {
        std::fprintf(stderr, "infoflow tokenize: element %zu is not a string\n", i);
        return 1;
      }
      out.push_back((*tok)->Encode(item.get_ref<const std::string&>(), add_special));
      continue;
    }
    if (!item.is_array()) {
      std::fprintf(stderr, "infoflow tokenize: element %zu is not an array of ids\n", i);
      return 1;
    }
    std::vector<int32_t> ids;
    for (const nlohmann::json& id : item) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() >= (*tok)->vocab_size()) {
        std::fprintf(stderr, "infoflow tokenize: element %zu has an invalid id %s\n", i,
                     id.dump().c_str());
        return 1;
      }
      ids.push_back(id.get<int32_t>());
    }
    // Decode always returns valid UTF-8, so dump() cannot throw.
    out.push_back((*tok)->Decode(ids, skip_special));
  }
  std::cout << out.dump() << "\n";
  std::cout.flush();
  return std::cout.good() ? 0 : 1;
}

}  // namespace infoflow::cli
