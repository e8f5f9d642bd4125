#include "client/flags.h"

namespace infoflow::cli {

bool Flags::Parse(int argc, char** argv, const std::set<std::string>& value_flags,
                  const std::set<std::string>& bool_flags) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0 || arg == "--") {
      positional_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2), value;
    const size_t eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (bool_flags.count(name)) {
      values_.emplace(name, inline_value ? value : "true");
    } else if (value_flags.count(name)) {
      if (!inline_value) {
        if (i + 1 >= argc) {
          error_ = "flag --" + name + " needs a value";
          return false;
        }
        value = argv[++i];
      }
      values_.emplace(name, value);
    } else {
      error_ = "unknown flag --" + name;
      return false;
    }
  }
  return true;
}

std::string Flags::Get(const std::string& name, const std::string& fallback) const {
  auto range = values_.equal_range(name);
  if (range.first == range.second) return fallback;
  return std::prev(range.second)->second;
}

std::vector<std::string> Flags::GetAll(const std::string& name) const {
  std::vector<std::string> out;
  auto range = values_.equal_range(name);
  for (auto it = range.first; it != range.second; ++it) out.push_back(it->second);
  return out;
}

}  // namespace infoflow::cli
