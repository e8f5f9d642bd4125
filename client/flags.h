// A minimal --flag parser for the CLI subcommands: --name value, --name=value
// and boolean --name. Unknown flags are errors so typos never pass silently.
#ifndef INFOFLOW_CLIENT_FLAGS_H_
#define INFOFLOW_CLIENT_FLAGS_H_

#include <map>
#include <set>
#include <string>
#include <vector>

namespace infoflow::cli {

class Flags {
 public:
  // `value_flags` take a value, `bool_flags` do not. Returns false and sets
  // error() on an unknown flag or a missing value.
  bool Parse(int argc, char** argv, const std::set<std::string>& value_flags,
             const std::set<std::string>& bool_flags);
  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  std::string Get(const std::string& name, const std::string& fallback = "") const;
  // Last value of a repeatable flag, or all of them.
  std::vector<std::string> GetAll(const std::string& name) const;
  const std::vector<std::string>& positional() const { return positional_; }
  const std::string& error() const { return error_; }

 private:
  std::multimap<std::string, std::string> values_;
  std::vector<std::string> positional_;
  std::string error_;
};

}  // namespace infoflow::cli

#endif  // INFOFLOW_CLIENT_FLAGS_H_
