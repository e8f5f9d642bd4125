// engine/text/chat_template.h: the Jinja2 subset, feature by feature, its
// whitespace control, its errors (with positions) and limits, and real chat
// templates (tests/data/chat_templates/, PROVENANCE there) rendered byte for
// byte as @huggingface/jinja renders them (expected.json, written by
// tests/engine/chat_template_reference.mjs; the `network` ctest
// chat_template_vs_hf_jinja re-runs that reference and compares again).
#include "engine/text/chat_template.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "engine/text/model_chat_template.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace infoflow {
namespace {

using nlohmann::json;

// The rendering of `source` with `vars` (JSON text), or "ERROR: message".
std::string R(const std::string& source, const std::string& vars = "{}",
              const ChatTemplateLimits& limits = {}) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(source, limits);
  if (!t.ok()) return "ERROR: " + std::string(t.status().message());
  absl::StatusOr<std::string> out = t->Render(json::parse(vars));
  if (!out.ok()) return "ERROR: " + std::string(out.status().message());
  return *out;
}

TEST(ChatTemplate, TextAndOutput) {
  EXPECT_EQ(R("plain text"), "plain text");
  EXPECT_EQ(R("a{{ 'b' }}c"), "abc");
  EXPECT_EQ(R("{{ x }}", R"({"x": "hi"})"), "hi");
  EXPECT_EQ(R("[{{ missing }}]"), "[]");
  EXPECT_EQ(R("{{ none }} {{ true }} {{ False }} {{ 3 }} {{ -2 }} {{ 1.5 }} {{ 2.0 }}"),
            "None True False 3 -2 1.5 2.0");
  EXPECT_EQ(R("{{ [1, 'a', none, [true]] }}"), "[1, 'a', None, [True]]");
  EXPECT_EQ(R("{{ {'k': 'v', 'n': 1} }}"), "{'k': 'v', 'n': 1}");
  EXPECT_EQ(R("{{ \"it's\" }} {{ ['it\\'s'] }}"), "it's [\"it's\"]");
  EXPECT_EQ(R("{{ 'a\\nb\\t\\u00e9\\x41' }}"),
            "a\nb\t\xc3\xa9"
            "A");
  EXPECT_EQ(R("{{ 'a' 'b' }}"), "ab");
  EXPECT_EQ(R("{{ 1e3 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1_000 }}"),
            "1000.0 0.30000000000000004 1e+16 1000");
  EXPECT_EQ(R("{# a comment #}x{# another {{ not this }} #}"), "x");
  EXPECT_EQ(R("one trailing newline is dropped\n"), "one trailing newline is dropped");
  EXPECT_EQ(R("two\n\n"), "two\n");
}

TEST(ChatTemplate, WhitespaceControl) {
  EXPECT_EQ(R("a  {{- 'b' -}}  \n c"), "abc");
  EXPECT_EQ(R("a\n  {%- if true -%}\n  b  \n{%- endif -%}\n c"), "abc");
  // trim_blocks: the newline after a block tag goes; not after {{ }}.
  EXPECT_EQ(R("{% if true %}\nx\n{% endif %}\ny"), "x\ny");
  EXPECT_EQ(R("{{ 'v' }}\nz"), "v\nz");
  // lstrip_blocks: spaces before a block tag at a line's start go.
  EXPECT_EQ(R("a\n    {% if true %}\n    b\n    {% endif %}\nc"), "a\n    b\nc");
  EXPECT_EQ(R("a  {% if true %}b{% endif %}"), "a  b");  // not at a line start
  EXPECT_EQ(R("a\n  {%+ if true %}b{% endif %}"), "a\n  b");
  EXPECT_EQ(R("x\n  {# c #}\ny"), "x\ny");
  EXPECT_EQ(R("x {#- c -#} y"), "xy");
}

TEST(ChatTemplate, IfElifElse) {
  const std::string t = "{% if n == 1 %}one{% elif n == 2 %}two{% else %}many{% endif %}";
  EXPECT_EQ(R(t, R"({"n": 1})"), "one");
  EXPECT_EQ(R(t, R"({"n": 2})"), "two");
  EXPECT_EQ(R(t, R"({"n": 7})"), "many");
  EXPECT_EQ(R("{% if x %}y{% endif %}"), "");
  EXPECT_EQ(R("{% if [] or '' or 0 or none %}t{% else %}f{% endif %}"), "f");
  EXPECT_EQ(R("{% if [0] and 'a' and 1 %}t{% endif %}"), "t");
}

TEST(ChatTemplate, ForLoops) {
  EXPECT_EQ(R("{% for x in xs %}{{ loop.index0 }}{{ loop.index }}{{ x }}{% if not loop.last %},{% "
              "endif %}"
              "{% endfor %}",
              R"({"xs": ["a", "b", "c"]})"),
            "01a,12b,23c");
  EXPECT_EQ(R("{% for x in xs %}{{ loop.first }}{{ loop.length }}{{ loop.revindex }}"
              "{{ loop.revindex0 }}|{% endfor %}",
              R"({"xs": [1, 2]})"),
            "True221|False210|");
  EXPECT_EQ(R("{% for x in xs %}{{ x }}{% else %}empty{% endfor %}", R"({"xs": []})"), "empty");
  EXPECT_EQ(R("{% for x in nothing %}{{ x }}{% else %}none{% endfor %}"), "none");
  EXPECT_EQ(
      R("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", R"({"d": {"a": 1, "b": 2}})"),
      "a=1;b=2;");
  EXPECT_EQ(R("{% for k in d %}{{ k }}{% endfor %}", R"({"d": {"a": 1, "b": 2}})"), "ab");
  EXPECT_EQ(R("{% for c in 'héj' %}[{{ c }}]{% endfor %}"), "[h][\xc3\xa9][j]");
  // Loop filter: loop.* counts only what is kept.
  EXPECT_EQ(R("{% for m in ms if m.role != 'system' %}{{ loop.index }}{{ m.role }}{% endfor %}",
              R"({"ms": [{"role": "system"}, {"role": "user"}, {"role": "assistant"}]})"),
            "1user2assistant");
  EXPECT_EQ(R("{% for x in [1,2,3,4] %}{% if x == 2 %}{% continue %}{% endif %}"
              "{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "13");
  EXPECT_EQ(R("{% for x in [1,2] %}{% for y in ['a','b'] %}{{ x }}{{ y }}{{ loop.index }}"
              "{% endfor %}{{ loop.index }}{% endfor %}"),
            "1a11b212a12b22");
  EXPECT_EQ(R("{% for x in [1,2,3] %}{{ loop.previtem }}-{{ loop.nextitem }} {% endfor %}"),
            "-2 1-3 2- ");
  // A set inside the loop does not leak out of it.
  EXPECT_EQ(R("{% set v = 'out' %}{% for x in [1] %}{% set v = 'in' %}{{ v }}{% endfor %}{{ v }}"),
            "inout");
}

TEST(ChatTemplate, SetAndNamespace) {
  EXPECT_EQ(R("{% set a = 'x' ~ 1 %}{{ a }}"), "x1");
  EXPECT_EQ(R("{% set a, b = [1, 2] %}{{ b }}{{ a }}"), "21");
  EXPECT_EQ(R("{% set a, b = 1, 2 %}{{ a + b }}"), "3");
  EXPECT_EQ(R("{% set ns = namespace(found=false, n=0) %}{% for x in [1, 2, 3] %}"
              "{% if x > 1 %}{% set ns.found = true %}{% set ns.n = ns.n + x %}{% endif %}"
              "{% endfor %}{{ ns.found }} {{ ns.n }}"),
            "True 5");
  EXPECT_EQ(R("{% set block %}a{{ 1 + 1 }}b{% endset %}[{{ block }}]"), "[a2b]");
  EXPECT_EQ(R("{% if true %}{% set s = 'kept' %}{% endif %}{{ s }}"), "kept");
}

TEST(ChatTemplate, Macros) {
  EXPECT_EQ(R("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
              "{{ greet('A') }} {{ greet('B', '?') }} {{ greet(punct='.', name='C') }}"),
            "Hi A! Hi B? Hi C.");
  EXPECT_EQ(R("{%- macro t(c) -%}{%- if c is string -%}{{ c }}{%- else -%}"
              "{%- for i in c -%}{{ i.text }}{%- endfor -%}{%- endif -%}{%- endmacro -%}"
              "{{ t('s') }}|{{ t([{'text': 'a'}, {'text': 'b'}]) }}|{{ t('x').upper() }}"),
            "s|ab|X");
  // A macro sees the top level, not the caller's loop variables.
  EXPECT_EQ(R("{% set g = 'G' %}{% macro m() %}{{ g }}{{ x }}{% endmacro %}"
              "{% for x in [1] %}{{ m() }}{% endfor %}"),
            "G");
  EXPECT_EQ(R("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}"),
            "ERROR: chat template 1:41: macro 'm' takes 1 arguments, got 2");
}

TEST(ChatTemplate, Expressions) {
  EXPECT_EQ(R("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }}"),
            "3 -4 1 2 3.5 1024");
  EXPECT_EQ(R("{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 'ab' * 3 }} {{ [1] * 2 }} {{ [1] + [2] }}"),
            "7 9 ababab [1, 1] [1, 2]");
  EXPECT_EQ(R("{{ 'a' ~ 1 ~ none ~ undefined_thing }}"), "a1None");
  EXPECT_EQ(R("{{ 1 < 2 }} {{ 'b' > 'a' }} {{ 2 >= 2.0 }} {{ 1 == 1.0 }} {{ 'a' != 'a' }}"),
            "True True True True False");
  EXPECT_EQ(R("{{ 'ell' in 'hello' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [3] }}"),
            "True True True False");
  EXPECT_EQ(R("{{ 'y' if x else 'n' }} {{ 'y' if not x else 'n' }} [{{ 'only' if x }}]"), "n y []");
  EXPECT_EQ(R("{{ not x is defined }} {{ x is not defined and true }}"), "True True");
  EXPECT_EQ(R("{{ none or 'default' }} {{ 'first' and 'second' }}"), "default second");
  EXPECT_EQ(R("{{ -(x|length) }}", R"({"x": [1, 2]})"), "-2");
  // As in Jinja2, a unary minus binds before a filter.
  EXPECT_EQ(R("{{ -x|length }}", R"({"x": [1, 2]})"),
            "ERROR: chat template 1:4: cannot negate a list");
}

TEST(ChatTemplate, AccessAndSlicing) {
  const std::string v = R"({"m": {"role": "user", "content": "hi"}, "xs": [10, 20, 30, 40]})";
  EXPECT_EQ(
      R("{{ m.role }} {{ m['content'] }} [{{ m.missing }}] {{ xs[0] }} {{ xs[-1] }} [{{ xs[9] }}]",
        v),
      "user hi [] 10 40 []");
  EXPECT_EQ(
      R("{{ xs[1:3] }} {{ xs[::-1] }} {{ xs[:-1] }} {{ xs[::2] }} {{ xs[-2:] }} {{ xs[5:] }}", v),
      "[20, 30] [40, 30, 20, 10] [10, 20, 30] [10, 30] [30, 40] []");
  EXPECT_EQ(R("{{ 'héllo'[1] }} {{ 'héllo'[1:3] }} {{ 'abc'[::-1] }}"), "\xc3\xa9 \xc3\xa9l cba");
  EXPECT_EQ(R("{{ xs.0 }}", v), "10");
  EXPECT_EQ(R("{{ none.x }}|"), "|");
}

TEST(ChatTemplate, Tests) {
  const std::string v = R"({"s": "x", "n": 1, "f": 1.5, "l": [], "d": {}, "z": null, "b": true})";
  EXPECT_EQ(
      R("{{ s is string }}{{ n is string }}{{ n is number }}{{ f is float }}{{ n is integer }}"
        "{{ l is iterable }}{{ d is mapping }}{{ l is mapping }}{{ z is none }}{{ q is defined }}"
        "{{ q is undefined }}{{ b is boolean }}{{ b is true }}{{ b is false }}",
        v),
      "TrueFalseTrueTrueTrueTrueTrueFalseTrueFalseTrueTrueTrueFalse");
  EXPECT_EQ(R("{{ 4 is even }}{{ 3 is odd }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(2) }}"
              "{{ 1 is eq 1 }}{{ 'a' is in ['a'] }}{{ z is not none }}",
              v),
            "TrueTrueTrueFalseTrueTrueFalse");
}

TEST(ChatTemplate, Filters) {
  EXPECT_EQ(
      R("[{{ '  a b \n' | trim }}] {{ 'ab'|upper }} {{ 'AB'|lower }} {{ 'hello world'|capitalize }}"
        " {{ 'hello world'|title }}"),
      "[a b] AB ab Hello world Hello World");
  EXPECT_EQ(R("{{ [1,2,3]|length }} {{ 'héj'|length }} {{ {'a':1}|length }} {{ [1,2]|count }}"),
            "3 3 1 2");
  EXPECT_EQ(
      R("{{ x|default('d') }} {{ ''|default('d') }} {{ ''|default('d', true) }} {{ 0|d(5) }}"),
      "d  d 0");
  EXPECT_EQ(R("{{ ['a','b']|join(', ') }} {{ [1,2]|join }} {{ [{'n':'x'},{'n':'y'}]|join('-', "
              "attribute='n') }}"),
            "a, b 12 x-y");
  EXPECT_EQ(R("{{ 'aXbX'|replace('X', '-') }} {{ 12|string ~ 'x' }} {{ [1,2,3]|first }}"
              " {{ [1,2,3]|last }} {{ 'abc'|first }} {{ [3,1,2]|sort }} {{ [1,2]|reverse }}"),
            "a-b- 12x 1 3 a [1, 2, 3] [2, 1]");
  EXPECT_EQ(R("{% for k, v in {'a': 1}|items %}{{ k }}{{ v }}{% endfor %}"), "a1");
  const std::string ms =
      R"({"ms": [{"role": "system", "c": "s"}, {"role": "user", "c": "u"}, {"role": "user", "c": "v"}]})";
  EXPECT_EQ(R("{{ ms|selectattr('role', 'equalto', 'user')|map(attribute='c')|join }}"
              " {{ ms|rejectattr('role', 'eq', 'user')|map(attribute='c')|list }}"
              " {{ ms|selectattr('missing')|list|length }}",
              ms),
            "uv ['s'] 0");
  EXPECT_EQ(R("{{ [1,2,3,4]|select('even')|list }} {{ ['a','b']|map('upper')|join }} {{ "
              "[1,1,2]|unique|list }}"
              " {{ [1,2]|sum }} {{ -3|abs }} {{ '42'|int + 1 }} {{ '2.5'|float }} {{ 'x'|int }}"),
            "[2, 4] AB [1, 2] 3 3 43 2.5 0");
  EXPECT_EQ(R("{{ '<a&b>'|e }} {{ 'x\ny'|indent(2) }} {{ 'x\ny'|indent(2, true) }}"),
            "&lt;a&amp;b&gt; x\n  y   x\n  y");
}

TEST(ChatTemplate, ToJson) {
  const std::string v = R"({"t": {"name": "f", "args": [1, 2.5, true, null, "é\"\n"]}})";
  EXPECT_EQ(R("{{ t|tojson }}", v), R"({"args": [1, 2.5, true, null, "é\"\n"], "name": "f"})");
  EXPECT_EQ(R("{{ t|tojson(ensure_ascii=true) }}", v),
            R"({"args": [1, 2.5, true, null, "\u00e9\"\n"], "name": "f"})");
  EXPECT_EQ(R("{{ {'a': [1, {}], 'b': []}|tojson(indent=2) }}"),
            "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": []\n}");
  EXPECT_EQ(R("{{ {'b': 1, 'a': 2}|tojson(sort_keys=true, separators=(',', ':')) }}"),
            R"({"a":2,"b":1})");
  EXPECT_EQ(R("{{ 'tab\there'|tojson }} {{ '\x01'|tojson }}"), R"("tab\there" "\u0001")");
}

TEST(ChatTemplate, MethodsAndGlobals) {
  EXPECT_EQ(R("[{{ '  x  '.strip() }}] [{{ '\nx\n'.lstrip('\n') }}] [{{ 'xx--'.rstrip('-') }}]"),
            "[x] [x\n] [xx]");
  EXPECT_EQ(R("{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith('bc') }} {{ 'abc'.startswith(('x', "
              "'a')) }}"),
            "True True True");
  EXPECT_EQ(R("{{ 'a</think>b'.split('</think>')[-1] }} {{ ' a  b '.split() }} {{ "
              "'a,b,c'.split(',', 1) }}"),
            "b ['a', 'b'] ['a', 'b,c']");
  EXPECT_EQ(
      R("{{ 'Ab'.lower() }}{{ 'Ab'.upper() }} {{ 'aaa'.replace('a', 'b', 2) }} {{ 'abcb'.find('b') "
        "}}"
        " {{ 'abcb'.count('b') }} {{ '-'.join(['x', 'y']) }} {{ '{} and {}'.format(1, 'x') }}"),
      "abAB bba 1 2 x-y 1 and x");
  EXPECT_EQ(R("{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 7) }} {{ d.keys()|list }} {{ "
              "d.values()|list }}",
              R"({"d": {"a": 1}})"),
            "1 None 7 ['a'] [1]");
  EXPECT_EQ(R("{{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ dict(a=1) }}"),
            "[0, 1, 2] [1, 3, 5] {'a': 1}");
  EXPECT_EQ(R("{{ raise_exception('roles must alternate') }}"),
            "ERROR: chat template 1:4: raised: roles must alternate");
  const std::string year = R("{{ strftime_now('%Y') }}");
  EXPECT_EQ(year.size(), 4u);
  EXPECT_EQ(R("{% generation %}kept{% endgeneration %}"), "kept");
}

TEST(ChatTemplate, ErrorsNamePositions) {
  EXPECT_EQ(R("ab\n  {{ 1 + }}"), "ERROR: chat template 2:10: unexpected end of tag");
  EXPECT_EQ(R("{% if x %}never closed"),
            "ERROR: chat template 1:4: block not closed: missing 'endif'");
  EXPECT_EQ(R("x\n{% endfor %}"),
            "ERROR: chat template 2:4: unknown or unexpected statement 'endfor'");
  EXPECT_EQ(R("{% if a %}{% endfor %}"),
            "ERROR: chat template 1:14: unexpected 'endfor' (expected elif or else or endif)");
  EXPECT_EQ(R("{{ 'open"), "ERROR: chat template 1:4: unterminated string literal");
  EXPECT_EQ(R("{{ x"), "ERROR: chat template 1:1: unterminated '{{' (no '}}')");
  EXPECT_EQ(R("{# x"), "ERROR: chat template 1:1: unterminated comment");
  EXPECT_EQ(R("{{ x | nosuchfilter }}"), "ERROR: chat template 1:6: unknown filter 'nosuchfilter'");
  EXPECT_EQ(R("{{ x is nosuchtest }}"), "ERROR: chat template 1:6: unknown test 'nosuchtest'");
  EXPECT_EQ(R("\n\n   {{ 1 + 'a' }}"),
            "ERROR: chat template 3:9: unsupported operand types for +: int and string");
  EXPECT_EQ(R("{{ a.b }}"), "ERROR: chat template 1:5: 'a' is undefined");
  EXPECT_EQ(R("{{ 1 // 0 }}"), "ERROR: chat template 1:6: division by zero");
  EXPECT_EQ(R("{% break %}"), "ERROR: chat template 1:4: 'break' outside a for loop");
  EXPECT_EQ(R("{% include 'x' %}"),
            "ERROR: chat template 1:4: unknown or unexpected statement 'include'");
  EXPECT_EQ(R("{% set ns.a = 1 %}"),
            "ERROR: chat template 1:4: cannot set an attribute of 'ns': it is not a namespace()");
  EXPECT_EQ(R("{{ 'a'.nomethod() }}"),
            "ERROR: chat template 1:7: a string has no method 'nomethod'");
  EXPECT_EQ(R("{{ 9223372036854775807 + 1 }}"), "ERROR: chat template 1:24: integer overflow");
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse("x");
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->Render(json::array()).ok());
}

TEST(ChatTemplate, Limits) {
  ChatTemplateLimits small;
  small.max_source_bytes = 10;
  EXPECT_EQ(R("0123456789ab", "{}", small),
            "ERROR: chat template: 12 bytes, more than the limit of 10");
  // Deep nesting is refused by the parser, not by the stack.
  std::string deep;
  for (int i = 0; i < 200; ++i) deep += "(";
  deep = "{{ " + deep + "1";
  for (int i = 0; i < 200; ++i) deep += ")";
  deep += " }}";
  EXPECT_NE(R(deep).find("nested deeper than 64 levels"), std::string::npos);
  std::string blocks;
  for (int i = 0; i < 100; ++i) blocks += "{% if true %}";
  EXPECT_NE(R(blocks).find("nested deeper than 64 levels"), std::string::npos);
  // Long chains (a+a+..., x|f|f|..., a.b.c...) are trees as deep as they are
  // long: refused at parse time too.
  std::string chain = "{{ 1";
  for (int i = 0; i < 100000; ++i) chain += "+1";
  EXPECT_NE(R(chain + " }}").find("expression nested deeper than 128 levels"), std::string::npos);
  std::string filters = "{{ 'x'";
  for (int i = 0; i < 1000; ++i) filters += "|trim";
  EXPECT_NE(R(filters + " }}").find("expression nested deeper"), std::string::npos);
  std::string sum = "{{ 0";
  for (int i = 0; i < 100; ++i) sum += "+1";
  EXPECT_EQ(R(sum + " }}"), "100");
  // A namespace cannot be put inside one (no reference cycles).
  EXPECT_EQ(R("{% set ns = namespace(a=1) %}{% set ns.self = [ns] %}"),
            "ERROR: chat template 1:33: a namespace() attribute cannot hold a namespace");
  // Loops run out of steps.
  EXPECT_NE(R("{% for a in range(10000) %}{% for b in range(10000) %}{% endfor %}{% endfor %}")
                .find("evaluation steps"),
            std::string::npos);
  // Output and built text are capped.
  ChatTemplateLimits out;
  out.max_output_bytes = 1000;
  EXPECT_NE(
      R("{% for a in range(100) %}0123456789abcdef{% endfor %}", "{}", out).find("output longer"),
      std::string::npos);
  EXPECT_NE(R("{{ 'x' * 100000000000 }}").find("bytes of text"), std::string::npos);
  EXPECT_NE(R("{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s + ns.s %}"
              "{% endfor %}")
                .find("bytes of text"),
            std::string::npos);
  // Recursion through macros, and values nested by a loop.
  EXPECT_NE(R("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").find("macro calls nested"),
            std::string::npos);
  EXPECT_NE(R("{% set ns = namespace(v=[]) %}{% for i in range(200) %}{% set ns.v = [ns.v] %}"
              "{% endfor %}{{ ns.v|tojson }}")
                .find("nested deeper than 64"),
            std::string::npos);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every case of cases.json, rendered by us, against the reference's
// rendering: expected.json, or the file named by
// INFOFLOW_CHAT_TEMPLATE_REFERENCE (the network test's fresh run).
TEST(ChatTemplate, RealTemplatesMatchHuggingFaceJinja) {
  const std::string dir = std::string(INFOFLOW_SOURCE_DIR) + "/tests/data/chat_templates/";
  const char* env = std::getenv("INFOFLOW_CHAT_TEMPLATE_REFERENCE");
  const std::string ref_path = env != nullptr ? env : dir + "expected.json";
  const json cases = json::parse(ReadFile(dir + "cases.json"));
  const json ref = json::parse(ReadFile(ref_path));
  int compared = 0;
  for (const json& c : cases["cases"]) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    ASSERT_TRUE(ref.contains(name)) << ref_path;
    absl::StatusOr<ChatTemplate> t =
        ChatTemplate::Parse(ReadFile(dir + c["template"].get<std::string>()));
    ASSERT_TRUE(t.ok()) << t.status();
    absl::StatusOr<std::string> out = t->Render(c["vars"]);
    if (ref[name].contains("error")) {
      ASSERT_FALSE(out.ok()) << *out;
      EXPECT_NE(out.status().message().find(ref[name]["error"].get<std::string>()),
                std::string::npos)
          << out.status();
    } else {
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_EQ(*out, ref[name]["output"].get<std::string>());
    }
    ++compared;
  }
  EXPECT_EQ(compared, 84);
}

// tokenizer_config.json's forms: a string, the list of named templates,
// AddedToken objects for the special tokens; chat_template.jinja wins.
TEST(ModelChatTemplate, ReadsTokenizerConfigForms) {
  auto t = ModelChatTemplateFromFiles(
      R"({"chat_template": "{{ bos_token }}x", "bos_token": "<s>", "eos_token": "</s>",
          "add_bos_token": true})",
      std::nullopt);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE(t->has_value());
  EXPECT_EQ((*t)->source, "{{ bos_token }}x");
  EXPECT_EQ((*t)->origin, "tokenizer_config.json");
  EXPECT_EQ((*t)->bos_token, "<s>");
  EXPECT_EQ((*t)->eos_token, "</s>");
  EXPECT_TRUE((*t)->add_bos_token);

  t = ModelChatTemplateFromFiles(
      R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}],
          "bos_token": {"__type": "AddedToken", "content": "<|b|>"}, "eos_token": null})",
      std::nullopt);
  ASSERT_TRUE(t.ok() && t->has_value()) << t.status();
  EXPECT_EQ((*t)->source, "D");
  EXPECT_EQ((*t)->bos_token, "<|b|>");
  EXPECT_EQ((*t)->eos_token, "");
  EXPECT_FALSE((*t)->add_bos_token);

  t = ModelChatTemplateFromFiles(R"({"chat_template": "from config"})", "from jinja file");
  ASSERT_TRUE(t.ok() && t->has_value());
  EXPECT_EQ((*t)->source, "from jinja file");
  EXPECT_EQ((*t)->origin, "chat_template.jinja");

  t = ModelChatTemplateFromFiles(R"({"bos_token": "<s>"})", std::nullopt);
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->has_value());
  t = ModelChatTemplateFromFiles("", std::nullopt);
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->has_value());
}

TEST(ModelChatTemplate, RefusesMalformedConfigsNamingTheFile) {
  auto msg = [](std::string_view cfg, std::optional<std::string_view> jinja = std::nullopt) {
    auto t = ModelChatTemplateFromFiles(cfg, jinja);
    return t.ok() ? std::string("ok") : std::string(t.status().message());
  };
  EXPECT_EQ(msg("{not json"), "tokenizer_config.json: not a JSON object");
  EXPECT_EQ(msg(R"({"chat_template": 3})"),
            "tokenizer_config.json: chat_template must be a string or a list of {name, template}");
  EXPECT_NE(msg(R"({"chat_template": [{"name": "x", "template": "y"}]})").find("\"default\""),
            std::string::npos);
  EXPECT_EQ(msg(R"({"add_bos_token": "yes", "chat_template": "x"})"),
            "tokenizer_config.json: add_bos_token must be a boolean");
  EXPECT_EQ(msg(R"({"chat_template": "{% if x %}"})"),
            "tokenizer_config.json: chat template 1:4: block not closed: missing 'endif'");
  EXPECT_EQ(msg("", "{{ 1 + }}"), "chat_template.jinja: chat template 1:8: unexpected end of tag");
}

TEST(ModelChatTemplate, LoadsFromAModelDirectory) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("chat_template_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"chat_template": "A{{ messages[0].content }}"})";
  auto t = LoadModelChatTemplate(dir.string());
  ASSERT_TRUE(t.ok() && t->has_value()) << t.status();
  EXPECT_EQ((*t)->source, "A{{ messages[0].content }}");
  std::filesystem::remove_all(dir);
  t = LoadModelChatTemplate(dir.string());  // no files: no template, no error
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->has_value());
}

ModelChatTemplate FromSource(const std::string& source, const std::string& bos = "",
                             bool add_bos = false) {
  ModelChatTemplate t;
  t.source = source;
  t.origin = "test";
  t.compiled = *ChatTemplate::Parse(source);
  t.bos_token = bos;
  t.add_bos_token = add_bos;
  return t;
}

TEST(ModelChatTemplate, FramesTheLastMessage) {
  const std::string llama3 =
      ReadFile(std::string(INFOFLOW_SOURCE_DIR) + "/tests/data/chat_templates/llama3.jinja");
  const ModelChatTemplate t = FromSource(llama3, "<|begin_of_text|>", false);
  auto f = FrameLastTurn(t, {{"system", "S"}, {"user", "  padded content \n"}});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->head,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\n");
  EXPECT_EQ(f->content, "padded content");  // as the template printed it: trimmed
  EXPECT_EQ(f->tail, "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  // The template writes the BOS: add_bos_token does not double it.
  f = FrameLastTurn(FromSource(llama3, "<|begin_of_text|>", true), {{"user", "x"}});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->head.find("<|begin_of_text|><|begin_of_text|>"), std::string::npos);
  EXPECT_EQ(f->head.rfind("<|begin_of_text|>", 0), 0u);

  // Content printed twice, transformed, or a template failing: errors.
  EXPECT_FALSE(FrameLastTurn(FromSource("{{ messages[-1].content ~ messages[-1].content }}"),
                             {{"user", "x"}})
                   .ok());
  EXPECT_FALSE(FrameLastTurn(FromSource("{{ messages[-1].content|upper }}"), {{"user", "x"}}).ok());
  auto bad = FrameLastTurn(FromSource("{{ raise_exception('only one') }}"), {{"user", "x"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "chat template 1:4: raised: only one");
  // Whatever the template does around the content, head + content + tail is
  // exactly its rendering: text it adds because of the content counts as
  // content.
  f = FrameLastTurn(
      FromSource("{% if 'x' in messages[-1].content %}A{% endif %}{{ messages[-1].content }}!"),
      {{"user", "x"}});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->head, "");
  EXPECT_EQ(f->content, "Ax");
  EXPECT_EQ(f->tail, "!");
}

}  // namespace
}  // namespace infoflow
