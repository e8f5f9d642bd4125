// Flag parsing for the engine's command-line tools (infoflow-eval,
// infoflow-train): each flag name maps to the variable it sets.
//   --name value | --name=value   strings, ints, uint64s, doubles
//   --name                        switches (set to true)
//   --help | -h                   *help = true, parsing stops
// Errors (InvalidArgument) name the flag: unknown flag, missing value, a
// value that is not a number of the flag's type.
#ifndef INFOFLOW_ENGINE_TOOLS_FLAG_TABLE_H_
#define INFOFLOW_ENGINE_TOOLS_FLAG_TABLE_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace infoflow {

struct FlagTable {
  std::map<std::string, std::string*> strings;
  std::map<std::string, int*> ints;
  std::map<std::string, uint64_t*> uint64s;
  std::map<std::string, double*> doubles;
  std::map<std::string, bool*> switches;

  absl::Status Parse(int argc, char** argv, bool* help) const {
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--help" || arg == "-h") {
        *help = true;
        return absl::OkStatus();
      }
      if (auto b = switches.find(arg); b != switches.end()) {
        *b->second = true;
        continue;
      }
      std::string name = arg, value;
      bool has_value = false;
      if (size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
        name = arg.substr(0, eq);
        value = arg.substr(eq + 1);
        has_value = true;
      }
      if (!strings.count(name) && !ints.count(name) && !uint64s.count(name) &&
          !doubles.count(name)) {
        return absl::InvalidArgumentError(absl::StrCat("unknown flag ", arg));
      }
      if (!has_value) {
        if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(name, " needs a value"));
        value = argv[++i];
      }
      bool ok = true;
      const char* want = "";
      if (auto s = strings.find(name); s != strings.end()) {
        *s->second = value;
      } else if (auto n = ints.find(name); n != ints.end()) {
        ok = absl::SimpleAtoi(value, n->second), want = "an integer";
      } else if (auto u = uint64s.find(name); u != uint64s.end()) {
        ok = absl::SimpleAtoi(value, u->second), want = "a non-negative integer";
      } else {
        ok = absl::SimpleAtod(value, doubles.at(name)), want = "a number";
      }
      if (!ok) {
        return absl::InvalidArgumentError(absl::StrCat(name, ": not ", want, ": '", value, "'"));
      }
    }
    return absl::OkStatus();
  }
};

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_TOOLS_FLAG_TABLE_H_
