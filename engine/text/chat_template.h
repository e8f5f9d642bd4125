// ChatTemplate: renders a Hugging Face chat template (the Jinja2 source in
// tokenizer_config.json's "chat_template") without Python or a Jinja library.
//
// The language is the subset of Jinja2 that real chat templates use, with the
// environment transformers renders them in (trim_blocks, lstrip_blocks, one
// trailing newline of the source dropped, loop controls on):
//  - {{ expr }}, {% stmt %}, {# comment #}, whitespace control "-" on either
//    side of any tag; {% generation %} / {% endgeneration %} are ignored.
//  - if / elif / else; for NAME[, NAME] in EXPR [if EXPR] ... [else] (loop.index,
//    index0, revindex, revindex0, first, last, length, previtem, nextitem);
//    break, continue; set NAME = EXPR, set NAME.ATTR = EXPR (namespace()),
//    set A, B = EXPR, set NAME %}...{% endset; macro NAME(params, p=default)
//    ... endmacro and calls to it.
//  - Expressions: string, integer, float, true/false/none (either case)
//    literals, lists, tuples (as lists), dicts; a.b, a[b], slices a[i:j:k];
//    calls; + - * / // % ** ~; == != < <= > >=; and, or, not; in, not in;
//    "is [not] TEST"; X if C else Y; filters "| f(args)".
//  - Filters: abs capitalize count d default e escape first float indent int
//    items join last length list lower map reject rejectattr replace reverse
//    safe select selectattr sort string sum title tojson trim unique upper.
//  - Tests: boolean callable defined divisibleby eq equalto even false float
//    ge gt in integer iterable le lower lt mapping ne none number odd sameas
//    sequence string true undefined upper.
//  - String methods: strip lstrip rstrip startswith endswith split rsplit lower
//    upper title capitalize replace find count join splitlines isdigit
//    isspace format (positional "{}" only); dict methods get items keys
//    values; list method index.
//  - Globals: namespace(), raise_exception(msg), strftime_now(fmt) (local
//    time), range(), dict(k=v), plus every variable passed to Render.
// Printing follows Python's str(): None, True, False, ['a', 1], {'k': 'v'};
// tojson follows transformers' json.dumps (ensure_ascii false by default,
// indent, separators, sort_keys). Undefined values print as "".
//
// Limits (ChatTemplateLimits): source size, parse nesting, macro call depth,
// evaluation steps (statements, loop iterations, expression nodes), the
// bytes of text built and the size of the output, so that neither a template
// nor the variables a request supplies can make rendering slow or large.
// Every error is an InvalidArgument whose message names the line and column
// of the template ("chat template 3:14: ..."); raise_exception's message is
// passed through after "raised: ".
//
// A ChatTemplate is immutable after Parse; Render is thread-safe.
#ifndef INFOFLOW_ENGINE_TEXT_CHAT_TEMPLATE_H_
#define INFOFLOW_ENGINE_TEXT_CHAT_TEMPLATE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace infoflow {

struct ChatTemplateLimits {
  size_t max_source_bytes = 512 * 1024;
  int max_nesting = 64;           // blocks inside blocks, expression depth
  int max_call_depth = 16;        // macro calls inside macro calls
  int64_t max_steps = 4'000'000;  // statements + loop iterations + expressions
  // Above the HTTP front end's 16 MiB body limit, so a request the body
  // limit admits is refused by the token limits, not here.
  size_t max_output_bytes = 32 << 20;
  // All strings built while rendering, together (bounds memory and time
  // when a template concatenates in a loop; "a" + b + "c" counts b twice).
  size_t max_built_bytes = 256 << 20;
};

class ChatTemplate {
 public:
  // Parses `source`. InvalidArgument naming line:column for syntax errors,
  // unknown statements and a source over the limits.
  static absl::StatusOr<ChatTemplate> Parse(std::string_view source,
                                            const ChatTemplateLimits& limits = {});

  // Renders with `variables` (a JSON object: messages, add_generation_prompt,
  // bos_token, tools, ... as transformers passes them). InvalidArgument
  // naming line:column for runtime errors (a type error, raise_exception, a
  // limit reached); `variables` not an object is InvalidArgument too.
  absl::StatusOr<std::string> Render(const nlohmann::json& variables) const;

  ChatTemplate();  // the empty template: renders ""
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;
  ChatTemplate(const ChatTemplate&);
  ChatTemplate& operator=(const ChatTemplate&);
  ~ChatTemplate();

  struct Program;  // the parsed template (chat_template.cc)

 private:
  explicit ChatTemplate(std::shared_ptr<const Program> program);
  std::shared_ptr<const Program> program_;
};

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_TEXT_CHAT_TEMPLATE_H_
