#include "engine/text/chat_template.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace infoflow {
namespace {

// ---------------------------------------------------------------------------
// Errors. Inside this file an error travels as a TemplateError exception from
// wherever it is found to Parse / Render, which turn it into a Status; no
// exception leaves this file.

struct Pos {
  int line = 1;
  int col = 1;
};

struct TemplateError {
  Pos pos;
  std::string message;
};

[[noreturn]] void Fail(Pos p, std::string message) { throw TemplateError{p, std::move(message)}; }

absl::Status ToStatus(const TemplateError& e) {
  return absl::InvalidArgumentError(
      absl::StrCat("chat template ", e.pos.line, ":", e.pos.col, ": ", e.message));
}

// ---------------------------------------------------------------------------
// Values.

enum class Kind : uint8_t {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,
  kDict,
  kNamespace,
  kMacro,
  kBuiltin,
};

struct Value;
struct Stmt;
using List = std::vector<Value>;

struct Dict {
  std::vector<std::pair<std::string, Value>> items;  // insertion order, as Python's dict
  const Value* Find(std::string_view key) const;
  void Set(const std::string& key, Value v);
};

struct Value {
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::shared_ptr<const std::string> s;  // kString; kUndefined: the name, for messages
  std::shared_ptr<const List> list;      // kList
  std::shared_ptr<Dict> dict;            // kDict (never changed after creation), kNamespace
  const Stmt* macro = nullptr;           // kMacro
  std::string_view builtin;              // kBuiltin
  int nest = 0;  // lists / dicts inside lists / dicts (bounds recursion over values)

  static Value Undefined(std::string name = "") {
    Value v;
    v.s = std::make_shared<const std::string>(std::move(name));
    return v;
  }
  static Value None() { return Of(Kind::kNone); }
  static Value Bool(bool x) {
    Value v = Of(Kind::kBool);
    v.b = x;
    return v;
  }
  static Value Int(int64_t x) {
    Value v = Of(Kind::kInt);
    v.i = x;
    return v;
  }
  static Value Float(double x) {
    Value v = Of(Kind::kFloat);
    v.f = x;
    return v;
  }
  static Value Str(std::string x) {
    Value v = Of(Kind::kString);
    v.s = std::make_shared<const std::string>(std::move(x));
    return v;
  }
  static Value Lst(List x) {
    Value v = Of(Kind::kList);
    for (const Value& item : x) v.nest = std::max(v.nest, item.nest + 1);
    v.list = std::make_shared<const List>(std::move(x));
    return v;
  }
  static Value Dct(Dict x, Kind k = Kind::kDict) {
    Value v = Of(k);
    for (const auto& kv : x.items) v.nest = std::max(v.nest, kv.second.nest + 1);
    v.dict = std::make_shared<Dict>(std::move(x));
    return v;
  }
  static Value Of(Kind k) {
    Value v;
    v.kind = k;
    return v;
  }

  const std::string& str() const { return *s; }
  bool is_number() const {
    return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool;
  }
  double number() const {
    return kind == Kind::kFloat ? f : static_cast<double>(kind == Kind::kBool ? b : i);
  }
};

const Value* Dict::Find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::Set(const std::string& key, Value v) {
  for (auto& [k, old] : items) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(key, std::move(v));
}

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "none";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "string";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "namespace";
    case Kind::kMacro:
      return "macro";
    case Kind::kBuiltin:
      return "function";
  }
  return "?";
}

bool Truthy(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return v.b;
    case Kind::kInt:
      return v.i != 0;
    case Kind::kFloat:
      return v.f != 0;
    case Kind::kString:
      return !v.s->empty();
    case Kind::kList:
      return !v.list->empty();
    case Kind::kDict:
      return !v.dict->items.empty();
    default:
      return true;
  }
}

// UTF-8 code point boundaries of `s` (Python indexes strings by code point):
// the byte offset of each code point, then s.size().
std::vector<size_t> CodePointOffsets(const std::string& s) {
  std::vector<size_t> at;
  at.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) at.push_back(i);
  }
  at.push_back(s.size());
  return at;
}

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// ---------------------------------------------------------------------------
// Lexer: the source becomes segments (text, {{ }}, {% %}), each tag's inside
// a list of tokens.

enum class Tok : uint8_t { kName, kInt, kFloat, kString, kOp, kEnd };

struct Token {
  Tok type = Tok::kEnd;
  std::string text;  // name, operator, or the string literal's value
  int64_t i = 0;
  double f = 0;
  Pos pos;
};

enum class SegType : uint8_t { kText, kExpr, kStmt, kComment };

struct Segment {
  SegType type = SegType::kText;
  std::string text;
  std::vector<Token> tokens;  // kExpr / kStmt, ending with a kEnd token
  Pos pos;
  bool strip_before = false;  // {{- {%- {#-
  bool keep_before = false;   // {%+ : no lstrip_blocks
  bool strip_after = false;   // -}} -%} -#}
};

class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src.size(); ++i) {
      if (src[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  Pos At(size_t offset) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t line = static_cast<size_t>(it - line_starts_.begin());
    return Pos{static_cast<int>(line), static_cast<int>(offset - line_starts_[line - 1] + 1)};
  }

  std::vector<Segment> Run() {
    std::vector<Segment> segs;
    size_t i = 0;
    while (i < src_.size()) {
      size_t j = i;
      while (j < src_.size()) {
        j = src_.find('{', j);
        if (j == std::string_view::npos || j + 1 >= src_.size()) {
          j = src_.size();
          break;
        }
        const char c = src_[j + 1];
        if (c == '{' || c == '%' || c == '#') break;
        ++j;
      }
      if (j > i) {
        Segment t;
        t.type = SegType::kText;
        t.text = std::string(src_.substr(i, j - i));
        t.pos = At(i);
        segs.push_back(std::move(t));
      }
      if (j >= src_.size()) break;
      i = Tag(j, &segs);
    }
    return segs;
  }

 private:
  // The tag at `at`; returns the offset after it.
  size_t Tag(size_t at, std::vector<Segment>* segs) {
    Segment s;
    s.pos = At(at);
    const char open = src_[at + 1];
    size_t i = at + 2;
    if (i < src_.size() && src_[i] == '-') {
      s.strip_before = true;
      ++i;
    } else if (i < src_.size() && src_[i] == '+') {
      s.keep_before = true;
      ++i;
    }
    if (open == '#') {
      s.type = SegType::kComment;
      const size_t end = src_.find("#}", i);
      if (end == std::string_view::npos) Fail(s.pos, "unterminated comment");
      s.strip_after = end > i && src_[end - 1] == '-';
      segs->push_back(std::move(s));
      return end + 2;
    }
    s.type = open == '{' ? SegType::kExpr : SegType::kStmt;
    const char close = open == '{' ? '}' : '%';
    int depth = 0;  // open ( [ { inside the tag: a '}' there is an operator
    while (true) {
      while (i < src_.size() && IsSpace(src_[i])) ++i;
      if (i >= src_.size()) {
        Fail(s.pos, open == '{' ? "unterminated '{{' (no '}}')" : "unterminated '{%' (no '%}')");
      }
      if (depth == 0) {
        if (src_.compare(i, 3, std::string{'-', close, '}'}) == 0) {
          s.strip_after = true;
          i += 3;
          break;
        }
        if (src_.compare(i, 2, std::string{close, '}'}) == 0) {
          i += 2;
          break;
        }
      }
      Token t = Next(&i);
      if (t.type == Tok::kOp) {
        if (t.text == "(" || t.text == "[" || t.text == "{") ++depth;
        if ((t.text == ")" || t.text == "]" || t.text == "}") && depth > 0) --depth;
      }
      s.tokens.push_back(std::move(t));
    }
    Token end;
    end.type = Tok::kEnd;
    end.pos = At(i - 2);
    s.tokens.push_back(std::move(end));
    segs->push_back(std::move(s));
    return i;
  }

  Token Next(size_t* at) {
    size_t i = *at;
    Token t;
    t.pos = At(i);
    const char c = src_[i];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < src_.size() &&
             (std::isalnum(static_cast<unsigned char>(src_[j])) || src_[j] == '_')) {
        ++j;
      }
      t.type = Tok::kName;
      t.text = std::string(src_.substr(i, j - i));
      *at = j;
      return t;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      std::string digits;
      bool is_float = false;
      auto take_digits = [&] {
        while (j < src_.size() &&
               (std::isdigit(static_cast<unsigned char>(src_[j])) || src_[j] == '_')) {
          if (src_[j] != '_') digits += src_[j];
          ++j;
        }
      };
      take_digits();
      if (j + 1 < src_.size() && src_[j] == '.' &&
          std::isdigit(static_cast<unsigned char>(src_[j + 1]))) {
        is_float = true;
        digits += src_[j++];
        take_digits();
      }
      if (j < src_.size() && (src_[j] == 'e' || src_[j] == 'E')) {
        size_t k = j + 1;
        if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
        if (k < src_.size() && std::isdigit(static_cast<unsigned char>(src_[k]))) {
          is_float = true;
          digits += 'e';
          digits.append(src_.substr(j + 1, k - j - 1));
          j = k;
          take_digits();
        }
      }
      *at = j;
      if (is_float) {
        t.type = Tok::kFloat;
        t.f = std::strtod(digits.c_str(), nullptr);
      } else {
        t.type = Tok::kInt;
        errno = 0;
        const unsigned long long v = std::strtoull(digits.c_str(), nullptr, 10);
        if (errno != 0 || v > static_cast<unsigned long long>(INT64_MAX)) {
          Fail(t.pos, "integer literal out of range");
        }
        t.i = static_cast<int64_t>(v);
      }
      return t;
    }
    if (c == '\'' || c == '"') {
      t.type = Tok::kString;
      size_t j = i + 1;
      while (true) {
        if (j >= src_.size()) Fail(t.pos, "unterminated string literal");
        const char d = src_[j];
        if (d == c) break;
        if (d != '\\' || j + 1 >= src_.size()) {
          t.text += d;
          ++j;
          continue;
        }
        const char e = src_[j + 1];
        j += 2;
        switch (e) {
          case 'n':
            t.text += '\n';
            break;
          case 't':
            t.text += '\t';
            break;
          case 'r':
            t.text += '\r';
            break;
          case '\\':
            t.text += '\\';
            break;
          case '\'':
            t.text += '\'';
            break;
          case '"':
            t.text += '"';
            break;
          case '0':
            t.text += '\0';
            break;
          case 'a':
            t.text += '\a';
            break;
          case 'b':
            t.text += '\b';
            break;
          case 'f':
            t.text += '\f';
            break;
          case 'v':
            t.text += '\v';
            break;
          case '\n':
            break;  // line continuation
          case 'x':
          case 'u':
          case 'U': {
            const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            if (j + n > src_.size()) Fail(t.pos, "truncated escape in string literal");
            uint32_t cp = 0;
            for (size_t k = 0; k < n; ++k) {
              const char h = src_[j + k];
              if (!std::isxdigit(static_cast<unsigned char>(h))) {
                Fail(t.pos, "bad escape in string literal");
              }
              cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h))
                                                       ? h - '0'
                                                       : (std::tolower(h) - 'a' + 10));
            }
            j += n;
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
              Fail(t.pos, "escape is not a Unicode scalar value");
            }
            AppendUtf8(cp, &t.text);
            break;
          }
          default:  // Python keeps unknown escapes as written
            t.text += '\\';
            t.text += e;
        }
      }
      *at = j + 1;
      return t;
    }
    static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                 "/",  "%",  "~",  "|",  ".",  ",",  ":", "(", ")",
                                 "[",  "]",  "{",  "}",  "<",  ">",  "="};
    for (const char* op : kOps) {
      const size_t n = std::char_traits<char>::length(op);
      if (src_.compare(i, n, op) == 0) {
        t.type = Tok::kOp;
        t.text = op;
        *at = i + n;
        return t;
      }
    }
    Fail(t.pos, absl::StrCat("unexpected character '", std::string(1, c), "'"));
  }

 public:
  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      *out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      *out += static_cast<char>(0xC0 | (cp >> 6));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      *out += static_cast<char>(0xE0 | (cp >> 12));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      *out += static_cast<char>(0xF0 | (cp >> 18));
      *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

 private:
  std::string_view src_;
  std::vector<size_t> line_starts_;
};

// Whitespace control, as transformers configures Jinja2: "-" strips all
// whitespace on its side; lstrip_blocks drops spaces and tabs between a
// line's start and a {% or {# tag; trim_blocks drops the first newline
// after %} or #}. Comments are removed afterwards.
std::vector<Segment> ApplyWhitespaceControl(std::vector<Segment> segs) {
  for (size_t k = 0; k < segs.size(); ++k) {
    if (segs[k].type != SegType::kText) continue;
    std::string& t = segs[k].text;
    const Segment* prev = k > 0 ? &segs[k - 1] : nullptr;
    const Segment* next = k + 1 < segs.size() ? &segs[k + 1] : nullptr;
    size_t begin = 0, end = t.size();
    if (prev != nullptr) {
      if (prev->strip_after) {
        while (begin < end && IsSpace(t[begin])) ++begin;
      } else if (prev->type == SegType::kStmt || prev->type == SegType::kComment) {
        if (begin < end && t[begin] == '\n') ++begin;
      }
    }
    if (next != nullptr) {
      if (next->strip_before) {
        while (end > begin && IsSpace(t[end - 1])) --end;
      } else if ((next->type == SegType::kStmt || next->type == SegType::kComment) &&
                 !next->keep_before) {
        size_t j = t.size();
        while (j > 0 && (t[j - 1] == ' ' || t[j - 1] == '\t')) --j;
        // Only when the tag is first on its line (or the template's start).
        if ((j == 0 && prev == nullptr) || (j > 0 && t[j - 1] == '\n')) end = std::max(begin, j);
      }
    }
    t = t.substr(begin, end - begin);
  }
  std::vector<Segment> out;
  for (Segment& s : segs) {
    if (s.type == SegType::kComment || (s.type == SegType::kText && s.text.empty())) continue;
    out.push_back(std::move(s));
  }
  return out;
}

// ---------------------------------------------------------------------------
// Syntax tree.

struct Expr {
  enum class K : uint8_t {
    kLiteral,
    kName,
    kList,
    kDict,    // args: key, value, key, value, ...
    kAttr,    // args[0] . name
    kIndex,   // args[0] [ args[1] ]
    kSlice,   // args[0] [ args[1] : args[2] : args[3] ] (null parts)
    kCall,    // args[0] ( args[1..], kwargs )
    kFilter,  // args[0] | name ( args[1..], kwargs )
    kTest,    // args[0] is [not] name ( args[1..] )
    kNeg,
    kNot,
    kBinary,  // name = operator
    kAnd,
    kOr,
    kCond,  // args: then, condition, else (may be null)
  };
  K k = K::kLiteral;
  Pos pos;
  int depth = 1;  // of the tree below, this node included (Parser::Done)
  Value literal;
  std::string name;
  bool negate = false;
  std::vector<std::unique_ptr<Expr>> args;
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> kwargs;
};

using ExprPtr = std::unique_ptr<Expr>;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum class K : uint8_t { kText, kOutput, kIf, kFor, kSet, kSetBlock, kMacro, kBreak, kContinue };
  K k = K::kText;
  Pos pos;
  std::string text;                                // kText
  ExprPtr expr;                                    // kOutput, kSet value, kFor iterable
  ExprPtr filter;                                  // kFor: "if" clause
  std::vector<std::pair<ExprPtr, Body>> branches;  // kIf
  Body body, else_body;                            // kFor, kSetBlock, kMacro; else: kIf, kFor
  std::vector<std::string> targets;  // kFor, kSet, kSetBlock names; kSet attr: {ns, attr}
  bool attr_target = false;
  std::string name;                 // kMacro
  std::vector<std::string> params;  // kMacro
  std::vector<ExprPtr> defaults;    // kMacro, parallel to params (null = none)
};

// ---------------------------------------------------------------------------
// Parser.

class Parser {
 public:
  Parser(std::vector<Segment> segs, const ChatTemplateLimits& limits)
      : segs_(std::move(segs)), limits_(limits) {}

  Body ParseTemplate() {
    std::string stop;
    Body body = ParseBody({}, &stop, Pos{});
    return body;
  }

 private:
  // Parses statements until a {% tag whose first name is in `ends`; leaves
  // that tag's name in *stop with tok_ after it (the caller checks the rest).
  Body ParseBody(const std::vector<std::string>& ends, std::string* stop, Pos opened) {
    Body body;
    DepthGuard guard(this, opened);
    while (seg_ < segs_.size()) {
      Segment& s = segs_[seg_];
      if (s.type == SegType::kText) {
        auto st = std::make_unique<Stmt>();
        st->k = Stmt::K::kText;
        st->pos = s.pos;
        st->text = std::move(s.text);
        body.push_back(std::move(st));
        ++seg_;
        continue;
      }
      toks_ = &s.tokens;
      tok_ = 0;
      if (s.type == SegType::kExpr) {
        auto st = std::make_unique<Stmt>();
        st->k = Stmt::K::kOutput;
        st->pos = s.pos;
        st->expr = ParseExpr();
        ExpectEnd();
        body.push_back(std::move(st));
        ++seg_;
        continue;
      }
      const Token& first = Peek();
      if (first.type != Tok::kName) Fail(first.pos, "expected a statement name after '{%'");
      const std::string word = first.text;
      if (std::find(ends.begin(), ends.end(), word) != ends.end()) {
        ++tok_;
        *stop = word;
        return body;
      }
      ++tok_;
      ++seg_;
      const Pos pos = first.pos;
      if (word == "if") {
        body.push_back(ParseIf(pos));
      } else if (word == "for") {
        body.push_back(ParseFor(pos));
      } else if (word == "set") {
        body.push_back(ParseSet(pos));
      } else if (word == "macro") {
        body.push_back(ParseMacro(pos));
      } else if (word == "break" || word == "continue") {
        ExpectEnd();
        auto st = std::make_unique<Stmt>();
        st->k = word == "break" ? Stmt::K::kBreak : Stmt::K::kContinue;
        st->pos = pos;
        if (loop_depth_ == 0) Fail(pos, absl::StrCat("'", word, "' outside a for loop"));
        body.push_back(std::move(st));
      } else if (word == "generation" || word == "endgeneration") {
        ExpectEnd();  // transformers' assistant-mask markers: no output
      } else {
        Fail(pos, ends.empty() ? absl::StrCat("unknown or unexpected statement '", word, "'")
                               : absl::StrCat("unexpected '", word, "' (expected ",
                                              absl::StrJoin(ends, " or "), ")"));
      }
    }
    if (!ends.empty()) {
      Fail(opened, absl::StrCat("block not closed: missing '", ends.back(), "'"));
    }
    return body;
  }

  std::unique_ptr<Stmt> ParseIf(Pos pos) {
    auto st = std::make_unique<Stmt>();
    st->k = Stmt::K::kIf;
    st->pos = pos;
    ExprPtr cond = ParseExpr();
    ExpectEnd();
    while (true) {
      std::string stop;
      Body body = ParseBody({"elif", "else", "endif"}, &stop, pos);
      st->branches.emplace_back(std::move(cond), std::move(body));
      if (stop == "elif") {
        cond = ParseExpr();
        ExpectEnd();
        ++seg_;
        continue;
      }
      if (stop == "else") {
        ExpectEnd();
        ++seg_;
        st->else_body = ParseBody({"endif"}, &stop, pos);
      }
      ExpectEnd();
      ++seg_;
      return st;
    }
  }

  std::unique_ptr<Stmt> ParseFor(Pos pos) {
    auto st = std::make_unique<Stmt>();
    st->k = Stmt::K::kFor;
    st->pos = pos;
    st->targets.push_back(ExpectName());
    while (AcceptOp(",")) st->targets.push_back(ExpectName());
    if (!AcceptName("in")) Fail(Peek().pos, "expected 'in' in for loop");
    st->expr = ParseOr();  // "if" after the iterable filters it
    if (AcceptName("if")) st->filter = ParseOr();
    if (AcceptName("recursive")) Fail(pos, "recursive for loops are not supported");
    ExpectEnd();
    ++loop_depth_;
    std::string stop;
    st->body = ParseBody({"else", "endfor"}, &stop, pos);
    --loop_depth_;
    if (stop == "else") {
      ExpectEnd();
      ++seg_;
      st->else_body = ParseBody({"endfor"}, &stop, pos);
    }
    ExpectEnd();
    ++seg_;
    return st;
  }

  std::unique_ptr<Stmt> ParseSet(Pos pos) {
    auto st = std::make_unique<Stmt>();
    st->k = Stmt::K::kSet;
    st->pos = pos;
    st->targets.push_back(ExpectName());
    if (AcceptOp(".")) {
      st->attr_target = true;
      st->targets.push_back(ExpectName());
    } else {
      while (AcceptOp(",")) st->targets.push_back(ExpectName());
    }
    if (Peek().type == Tok::kEnd && !st->attr_target && st->targets.size() == 1) {
      ExpectEnd();
      st->k = Stmt::K::kSetBlock;
      std::string stop;
      st->body = ParseBody({"endset"}, &stop, pos);
      ExpectEnd();
      ++seg_;
      return st;
    }
    if (!AcceptOp("=")) Fail(Peek().pos, "expected '=' in set");
    st->expr = ParseTupleOrExpr();
    ExpectEnd();
    return st;
  }

  std::unique_ptr<Stmt> ParseMacro(Pos pos) {
    auto st = std::make_unique<Stmt>();
    st->k = Stmt::K::kMacro;
    st->pos = pos;
    st->name = ExpectName();
    if (!AcceptOp("(")) Fail(Peek().pos, "expected '(' after the macro name");
    if (!AcceptOp(")")) {
      do {
        st->params.push_back(ExpectName());
        st->defaults.push_back(AcceptOp("=") ? ParseExpr() : nullptr);
      } while (AcceptOp(","));
      if (!AcceptOp(")")) Fail(Peek().pos, "expected ')' after the macro parameters");
    }
    ExpectEnd();
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;  // break/continue cannot cross a macro
    std::string stop;
    st->body = ParseBody({"endmacro"}, &stop, pos);
    loop_depth_ = saved_loops;
    if (Peek().type == Tok::kName && Peek().text == st->name) ++tok_;
    ExpectEnd();
    ++seg_;
    return st;
  }

  // --- expressions ---

  struct DepthGuard {
    DepthGuard(Parser* p, Pos pos) : p(p) {
      if (++p->depth_ > p->limits_.max_nesting) {
        Fail(pos, absl::StrCat("nested deeper than ", p->limits_.max_nesting, " levels"));
      }
    }
    ~DepthGuard() { --p->depth_; }
    Parser* p;
  };

  const Token& Peek(size_t ahead = 0) const {
    const size_t k = std::min(tok_ + ahead, toks_->size() - 1);
    return (*toks_)[k];
  }
  bool IsOp(const char* op, size_t ahead = 0) const {
    return Peek(ahead).type == Tok::kOp && Peek(ahead).text == op;
  }
  bool IsName(const char* n, size_t ahead = 0) const {
    return Peek(ahead).type == Tok::kName && Peek(ahead).text == n;
  }
  bool AcceptOp(const char* op) {
    if (!IsOp(op)) return false;
    ++tok_;
    return true;
  }
  bool AcceptName(const char* n) {
    if (!IsName(n)) return false;
    ++tok_;
    return true;
  }
  std::string ExpectName() {
    if (Peek().type != Tok::kName) Fail(Peek().pos, "expected a name");
    return (*toks_)[tok_++].text;
  }
  void ExpectEnd() {
    if (Peek().type != Tok::kEnd) {
      Fail(Peek().pos, absl::StrCat("unexpected '", Describe(Peek()), "'"));
    }
  }
  static std::string Describe(const Token& t) {
    return t.type == Tok::kString ? "string literal" : t.text;
  }

  // Sets e's depth from its children's; chains such as a+b+c+... or
  // x|f|g|... deepen the tree without deepening the parser's recursion, so
  // the depth is checked here (evaluating and freeing the tree recurse).
  void Done(Expr* e) {
    int d = 0;
    for (const auto& a : e->args) {
      if (a != nullptr) d = std::max(d, a->depth);
    }
    for (const auto& kv : e->kwargs) d = std::max(d, kv.second->depth);
    e->depth = d + 1;
    if (e->depth > 2 * limits_.max_nesting) {
      Fail(e->pos,
           absl::StrCat("expression nested deeper than ", 2 * limits_.max_nesting, " levels"));
    }
  }

  ExprPtr Make(Expr::K k, Pos pos) {
    auto e = std::make_unique<Expr>();
    e->k = k;
    e->pos = pos;
    return e;
  }

  // "a, b" without brackets in a set statement is a tuple.
  ExprPtr ParseTupleOrExpr() {
    const Pos pos = Peek().pos;
    ExprPtr first = ParseExpr();
    if (!IsOp(",")) return first;
    ExprPtr list = Make(Expr::K::kList, pos);
    list->args.push_back(std::move(first));
    while (AcceptOp(",")) list->args.push_back(ParseExpr());
    Done(list.get());
    return list;
  }

  ExprPtr ParseExpr() {
    DepthGuard guard(this, Peek().pos);
    ExprPtr e = ParseOr();
    while (IsName("if")) {
      const Pos pos = Peek().pos;
      ++tok_;
      ExprPtr cond = ParseOr();
      ExprPtr other = AcceptName("else") ? ParseExpr() : nullptr;
      ExprPtr c = Make(Expr::K::kCond, pos);
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(other));
      Done(c.get());
      e = std::move(c);
    }
    return e;
  }

  ExprPtr Binary(Expr::K k, std::string op, Pos pos, ExprPtr a, ExprPtr b) {
    ExprPtr e = Make(k, pos);
    e->name = std::move(op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    Done(e.get());
    return e;
  }

  ExprPtr ParseOr() {
    ExprPtr e = ParseAnd();
    while (IsName("or")) {
      const Pos pos = Peek().pos;
      ++tok_;
      e = Binary(Expr::K::kOr, "or", pos, std::move(e), ParseAnd());
    }
    return e;
  }

  ExprPtr ParseAnd() {
    ExprPtr e = ParseNot();
    while (IsName("and")) {
      const Pos pos = Peek().pos;
      ++tok_;
      e = Binary(Expr::K::kAnd, "and", pos, std::move(e), ParseNot());
    }
    return e;
  }

  ExprPtr ParseNot() {
    if (IsName("not")) {
      DepthGuard guard(this, Peek().pos);
      ExprPtr e = Make(Expr::K::kNot, Peek().pos);
      ++tok_;
      e->args.push_back(ParseNot());
      Done(e.get());
      return e;
    }
    return ParseCompare();
  }

  ExprPtr ParseCompare() {
    ExprPtr e = ParseMath1();
    while (true) {
      const Pos pos = Peek().pos;
      std::string op;
      if (Peek().type == Tok::kOp &&
          (Peek().text == "==" || Peek().text == "!=" || Peek().text == "<" || Peek().text == ">" ||
           Peek().text == "<=" || Peek().text == ">=")) {
        op = Peek().text;
        ++tok_;
      } else if (IsName("in")) {
        op = "in";
        ++tok_;
      } else if (IsName("not") && IsName("in", 1)) {
        op = "not in";
        tok_ += 2;
      } else {
        return e;
      }
      e = Binary(Expr::K::kBinary, op, pos, std::move(e), ParseMath1());
    }
  }

  ExprPtr ParseMath1() {
    ExprPtr e = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      const Token& t = (*toks_)[tok_++];
      e = Binary(Expr::K::kBinary, t.text, t.pos, std::move(e), ParseConcat());
    }
    return e;
  }

  ExprPtr ParseConcat() {
    ExprPtr e = ParseMath2();
    while (IsOp("~")) {
      const Token& t = (*toks_)[tok_++];
      e = Binary(Expr::K::kBinary, "~", t.pos, std::move(e), ParseMath2());
    }
    return e;
  }

  ExprPtr ParseMath2() {
    ExprPtr e = ParsePow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const Token& t = (*toks_)[tok_++];
      e = Binary(Expr::K::kBinary, t.text, t.pos, std::move(e), ParsePow());
    }
    return e;
  }

  ExprPtr ParsePow() {
    ExprPtr e = ParseUnary(true);
    while (IsOp("**")) {
      const Token& t = (*toks_)[tok_++];
      e = Binary(Expr::K::kBinary, "**", t.pos, std::move(e), ParseUnary(true));
    }
    return e;
  }

  ExprPtr ParseUnary(bool with_filter) {
    DepthGuard guard(this, Peek().pos);
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      const Token& t = (*toks_)[tok_++];
      ExprPtr operand = ParseUnary(false);
      if (t.text == "-") {
        e = Make(Expr::K::kNeg, t.pos);
        e->args.push_back(std::move(operand));
        Done(e.get());
      } else {
        e = std::move(operand);
      }
    } else {
      e = ParsePostfix(ParsePrimary());
    }
    if (with_filter) e = ParseFilters(std::move(e));
    return e;
  }

  ExprPtr ParsePrimary() {
    const Token& t = Peek();
    switch (t.type) {
      case Tok::kName: {
        ++tok_;
        ExprPtr e = Make(Expr::K::kLiteral, t.pos);
        if (t.text == "true" || t.text == "True") {
          e->literal = Value::Bool(true);
        } else if (t.text == "false" || t.text == "False") {
          e->literal = Value::Bool(false);
        } else if (t.text == "none" || t.text == "None") {
          e->literal = Value::None();
        } else {
          e->k = Expr::K::kName;
          e->name = t.text;
        }
        return e;
      }
      case Tok::kString: {
        ExprPtr e = Make(Expr::K::kLiteral, t.pos);
        std::string s;
        while (Peek().type == Tok::kString) s += (*toks_)[tok_++].text;  // "a" "b" joins
        e->literal = Value::Str(std::move(s));
        return e;
      }
      case Tok::kInt:
      case Tok::kFloat: {
        ++tok_;
        ExprPtr e = Make(Expr::K::kLiteral, t.pos);
        e->literal = t.type == Tok::kInt ? Value::Int(t.i) : Value::Float(t.f);
        return e;
      }
      case Tok::kOp:
        if (t.text == "(") {
          ++tok_;
          if (AcceptOp(")")) return Make(Expr::K::kList, t.pos);  // ()
          ExprPtr first = ParseExpr();
          if (AcceptOp(")")) return first;
          ExprPtr list = Make(Expr::K::kList, t.pos);
          list->args.push_back(std::move(first));
          while (AcceptOp(",")) {
            if (IsOp(")")) break;
            list->args.push_back(ParseExpr());
          }
          if (!AcceptOp(")")) Fail(Peek().pos, "expected ')'");
          Done(list.get());
          return list;
        }
        if (t.text == "[") {
          ++tok_;
          ExprPtr list = Make(Expr::K::kList, t.pos);
          while (!IsOp("]")) {
            list->args.push_back(ParseExpr());
            if (!AcceptOp(",")) break;
          }
          if (!AcceptOp("]")) Fail(Peek().pos, "expected ']'");
          Done(list.get());
          return list;
        }
        if (t.text == "{") {
          ++tok_;
          ExprPtr dict = Make(Expr::K::kDict, t.pos);
          while (!IsOp("}")) {
            dict->args.push_back(ParseExpr());
            if (!AcceptOp(":")) Fail(Peek().pos, "expected ':' in dict literal");
            dict->args.push_back(ParseExpr());
            if (!AcceptOp(",")) break;
          }
          if (!AcceptOp("}")) Fail(Peek().pos, "expected '}'");
          Done(dict.get());
          return dict;
        }
        break;
      default:
        break;
    }
    Fail(t.pos, t.type == Tok::kEnd ? std::string("unexpected end of tag")
                                    : absl::StrCat("unexpected '", Describe(t), "'"));
  }

  ExprPtr ParsePostfix(ExprPtr e) {
    while (true) {
      const Pos pos = Peek().pos;
      if (AcceptOp(".")) {
        ExprPtr a = Make(Expr::K::kAttr, pos);
        if (Peek().type == Tok::kInt) {  // a.0 is a[0]
          a->k = Expr::K::kIndex;
          a->args.push_back(std::move(e));
          ExprPtr idx = Make(Expr::K::kLiteral, pos);
          idx->literal = Value::Int((*toks_)[tok_++].i);
          a->args.push_back(std::move(idx));
        } else {
          a->name = ExpectName();
          a->args.push_back(std::move(e));
        }
        Done(a.get());
        e = std::move(a);
      } else if (AcceptOp("[")) {
        ExprPtr parts[3];
        bool slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!IsOp(":") && !IsOp("]")) parts[k] = ParseExpr();
          if (k < 2 && AcceptOp(":")) {
            slice = true;
            continue;
          }
          break;
        }
        if (!AcceptOp("]")) Fail(Peek().pos, "expected ']'");
        ExprPtr s = Make(slice ? Expr::K::kSlice : Expr::K::kIndex, pos);
        s->args.push_back(std::move(e));
        if (!slice && parts[0] == nullptr) Fail(pos, "empty subscript");
        s->args.push_back(std::move(parts[0]));
        if (slice) {
          s->args.push_back(std::move(parts[1]));
          s->args.push_back(std::move(parts[2]));
        }
        Done(s.get());
        e = std::move(s);
      } else if (IsOp("(")) {
        ExprPtr c = Make(Expr::K::kCall, e->pos);  // errors point at the callee
        c->args.push_back(std::move(e));
        ParseArgs(c.get());
        Done(c.get());
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  // "( a, b, k=v )" into e->args (after those already there) and e->kwargs.
  void ParseArgs(Expr* e) {
    if (!AcceptOp("(")) Fail(Peek().pos, "expected '('");
    while (!IsOp(")")) {
      if (Peek().type == Tok::kName && IsOp("=", 1)) {
        std::string key = ExpectName();
        ++tok_;
        e->kwargs.emplace_back(std::move(key), ParseExpr());
      } else {
        if (!e->kwargs.empty()) Fail(Peek().pos, "positional argument after keyword argument");
        e->args.push_back(ParseExpr());
      }
      if (!AcceptOp(",")) break;
    }
    if (!AcceptOp(")")) Fail(Peek().pos, "expected ')'");
  }

  ExprPtr ParseFilters(ExprPtr e) {
    while (true) {
      const Pos pos = Peek().pos;
      if (AcceptOp("|")) {
        ExprPtr f = Make(Expr::K::kFilter, pos);
        f->name = ExpectName();
        f->args.push_back(std::move(e));
        if (IsOp("(")) ParseArgs(f.get());
        Done(f.get());
        e = std::move(f);
      } else if (AcceptName("is")) {
        ExprPtr t = Make(Expr::K::kTest, pos);
        t->negate = AcceptName("not");
        t->name = ExpectName();
        t->args.push_back(std::move(e));
        const Token& n = Peek();
        if (IsOp("(")) {
          ParseArgs(t.get());
        } else if ((n.type == Tok::kName || n.type == Tok::kString || n.type == Tok::kInt ||
                    n.type == Tok::kFloat || IsOp("[") || IsOp("{")) &&
                   !(IsName("else") || IsName("or") || IsName("and") || IsName("if") ||
                     IsName("not") || IsName("in") || IsName("is"))) {
          t->args.push_back(ParsePostfix(ParsePrimary()));  // "is divisibleby 3"
        }
        Done(t.get());
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  std::vector<Segment> segs_;
  const ChatTemplateLimits& limits_;
  size_t seg_ = 0;
  const std::vector<Token>* toks_ = nullptr;
  size_t tok_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

struct ChatTemplate::Program {
  Body body;
  ChatTemplateLimits limits;
};

namespace {

// ---------------------------------------------------------------------------
// Printing: Python's str() and repr(), json.dumps.

void AppendRepr(const Value& v, std::string* out, int depth, Pos pos);

std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[40];
  int prec = 1;
  for (; prec <= 17; ++prec) {  // shortest digits that read back as d
    std::snprintf(buf, sizeof(buf), "%.*e", prec - 1, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  std::string s(buf);
  const size_t e = s.find('e');
  const int exp = std::atoi(s.c_str() + e + 1);
  std::string digits;
  for (size_t k = 0; k < e; ++k) {
    if (std::isdigit(static_cast<unsigned char>(s[k]))) digits += s[k];
  }
  const std::string sign = d < 0 ? "-" : "";
  if (exp < -4 || exp >= 16) {
    std::string m = digits.substr(0, 1);
    if (digits.size() > 1) m += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return sign + m + eb;
  }
  std::string r;
  if (exp < 0) {
    r = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
    r = digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
  } else {
    r = digits.substr(0, static_cast<size_t>(exp) + 1) + "." +
        digits.substr(static_cast<size_t>(exp) + 1);
  }
  return sign + r;
}

void CheckDepth(int depth, Pos pos) {
  if (depth > 64) Fail(pos, "value nested deeper than 64 levels");
}

void AppendStr(const Value& v, std::string* out, int depth, Pos pos) {
  switch (v.kind) {
    case Kind::kUndefined:
      return;
    case Kind::kString:
      *out += v.str();
      return;
    default:
      AppendRepr(v, out, depth, pos);
  }
}

void AppendStringRepr(const std::string& s, std::string* out) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  *out += q;
  for (char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (c == q || c == '\\') {
      *out += '\\';
      *out += c;
    } else if (c == '\n') {
      *out += "\\n";
    } else if (c == '\r') {
      *out += "\\r";
    } else if (c == '\t') {
      *out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof(b), "\\x%02x", u);
      *out += b;
    } else {
      *out += c;
    }
  }
  *out += q;
}

void AppendRepr(const Value& v, std::string* out, int depth, Pos pos) {
  CheckDepth(depth, pos);
  switch (v.kind) {
    case Kind::kUndefined:
      return;
    case Kind::kNone:
      *out += "None";
      return;
    case Kind::kBool:
      *out += v.b ? "True" : "False";
      return;
    case Kind::kInt:
      *out += std::to_string(v.i);
      return;
    case Kind::kFloat:
      *out += FloatRepr(v.f);
      return;
    case Kind::kString:
      AppendStringRepr(v.str(), out);
      return;
    case Kind::kList: {
      *out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k > 0) *out += ", ";
        AppendRepr((*v.list)[k], out, depth + 1, pos);
      }
      *out += ']';
      return;
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      if (v.kind == Kind::kNamespace) *out += "<Namespace ";
      *out += '{';
      bool first = true;
      for (const auto& [k, x] : v.dict->items) {
        if (!first) *out += ", ";
        first = false;
        AppendStringRepr(k, out);
        *out += ": ";
        AppendRepr(x, out, depth + 1, pos);
      }
      *out += '}';
      if (v.kind == Kind::kNamespace) *out += '>';
      return;
    }
    case Kind::kMacro:
      *out += "<macro>";
      return;
    case Kind::kBuiltin:
      *out += "<function>";
      return;
  }
}

std::string Str(const Value& v, Pos pos) {
  std::string s;
  AppendStr(v, &s, 0, pos);
  return s;
}

struct JsonOptions {
  int indent = -1;  // < 0: none
  bool ensure_ascii = false;
  std::string item_sep = ", ", key_sep = ": ";
  bool sort_keys = false;
};

void AppendJsonString(const std::string& s, bool ensure_ascii, std::string* out) {
  *out += '"';
  for (size_t k = 0; k < s.size(); ++k) {
    const unsigned char u = static_cast<unsigned char>(s[k]);
    switch (u) {
      case '"':
        *out += "\\\"";
        continue;
      case '\\':
        *out += "\\\\";
        continue;
      case '\n':
        *out += "\\n";
        continue;
      case '\r':
        *out += "\\r";
        continue;
      case '\t':
        *out += "\\t";
        continue;
      case '\b':
        *out += "\\b";
        continue;
      case '\f':
        *out += "\\f";
        continue;
      default:
        break;
    }
    if (u < 0x20) {
      char b[8];
      std::snprintf(b, sizeof(b), "\\u%04x", u);
      *out += b;
    } else if (u >= 0x80 && ensure_ascii) {
      // Decode one UTF-8 sequence (input JSON is valid UTF-8) to \uXXXX.
      uint32_t cp = 0;
      int extra = u >= 0xF0 ? 3 : u >= 0xE0 ? 2 : 1;
      cp = u & (0x3F >> extra);
      for (int m = 0; m < extra && k + 1 < s.size(); ++m) {
        cp = (cp << 6) | (static_cast<unsigned char>(s[++k]) & 0x3F);
      }
      char b[16];
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(b, sizeof(b), "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
      } else {
        std::snprintf(b, sizeof(b), "\\u%04x", cp);
      }
      *out += b;
    } else {
      *out += static_cast<char>(u);
    }
  }
  *out += '"';
}

void AppendJson(const Value& v, const JsonOptions& o, int depth, std::string* out, Pos pos) {
  CheckDepth(depth, pos);
  auto newline = [&](int d) {
    if (o.indent < 0) return;
    *out += '\n';
    out->append(static_cast<size_t>(o.indent) * static_cast<size_t>(d), ' ');
  };
  switch (v.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      *out += "null";
      return;
    case Kind::kBool:
      *out += v.b ? "true" : "false";
      return;
    case Kind::kInt:
      *out += std::to_string(v.i);
      return;
    case Kind::kFloat:
      if (!std::isfinite(v.f)) Fail(pos, "tojson: not a finite number");
      *out += FloatRepr(v.f);
      return;
    case Kind::kString:
      AppendJsonString(v.str(), o.ensure_ascii, out);
      return;
    case Kind::kList: {
      if (v.list->empty()) {
        *out += "[]";
        return;
      }
      *out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k > 0) *out += o.item_sep;
        newline(depth + 1);
        AppendJson((*v.list)[k], o, depth + 1, out, pos);
      }
      newline(depth);
      *out += ']';
      return;
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      if (v.dict->items.empty()) {
        *out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (o.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      }
      *out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k > 0) *out += o.item_sep;
        newline(depth + 1);
        AppendJsonString(items[k]->first, o.ensure_ascii, out);
        *out += o.key_sep;
        AppendJson(items[k]->second, o, depth + 1, out, pos);
      }
      newline(depth);
      *out += '}';
      return;
    }
    default:
      Fail(pos, absl::StrCat("tojson: a ", KindName(v.kind), " is not JSON"));
  }
}

// ---------------------------------------------------------------------------
// Comparisons.

bool Equal(const Value& a, const Value& b, int depth, Pos pos) {
  CheckDepth(depth, pos);
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::kFloat || b.kind == Kind::kFloat) return a.number() == b.number();
    return (a.kind == Kind::kBool ? a.b : a.i) == (b.kind == Kind::kBool ? b.b : b.i);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return a.str() == b.str();
    case Kind::kList:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k) {
        if (!Equal((*a.list)[k], (*b.list)[k], depth + 1, pos)) return false;
      }
      return true;
    case Kind::kDict:
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, x] : a.dict->items) {
        const Value* y = b.dict->Find(k);
        if (y == nullptr || !Equal(x, *y, depth + 1, pos)) return false;
      }
      return true;
    case Kind::kNamespace:
      return a.dict == b.dict;
    case Kind::kMacro:
      return a.macro == b.macro;
    case Kind::kBuiltin:
      return a.builtin == b.builtin;
    default:
      return false;
  }
}

// <0, 0, >0; numbers with numbers, strings with strings, lists elementwise.
int Compare(const Value& a, const Value& b, int depth, Pos pos) {
  CheckDepth(depth, pos);
  if (a.is_number() && b.is_number()) {
    const double x = a.number(), y = b.number();
    if (a.kind != Kind::kFloat && b.kind != Kind::kFloat) {
      const int64_t p = a.kind == Kind::kBool ? a.b : a.i, q = b.kind == Kind::kBool ? b.b : b.i;
      return p < q ? -1 : p > q ? 1 : 0;
    }
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.kind == Kind::kString && b.kind == Kind::kString) return a.str().compare(b.str());
  if (a.kind == Kind::kList && b.kind == Kind::kList) {
    for (size_t k = 0; k < a.list->size() && k < b.list->size(); ++k) {
      const int c = Compare((*a.list)[k], (*b.list)[k], depth + 1, pos);
      if (c != 0) return c;
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  Fail(pos, absl::StrCat("cannot compare a ", KindName(a.kind), " with a ", KindName(b.kind)));
}

// ---------------------------------------------------------------------------
// The renderer: one per Render call.

using Frame = std::unordered_map<std::string, Value>;

enum class Flow : uint8_t { kNormal, kBreak, kContinue };

struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;

  // The argument at position `i` or keyword `name`, else undefined.
  const Value* Get(size_t i, std::string_view name) const {
    if (i < pos.size()) return &pos[i];
    for (const auto& [k, v] : kw) {
      if (k == name) return &v;
    }
    return nullptr;
  }
};

class Renderer {
 public:
  explicit Renderer(const ChatTemplateLimits& limits) : limits_(limits) {}

  std::string Run(const Body& body, Frame* globals) {
    scopes_.push_back(globals);
    std::string out;
    out_ = &out;
    if (Exec(body) != Flow::kNormal) Fail(Pos{}, "break or continue outside a loop");
    return out;
  }

 private:
  void Step(Pos pos) {
    if (++steps_ > limits_.max_steps) {
      Fail(pos, absl::StrCat("more than ", limits_.max_steps,
                             " evaluation steps (ChatTemplateLimits.max_steps)"));
    }
  }

  // Accounts for `n` bytes of new text.
  void Built(size_t n, Pos pos) {
    built_ += n;
    if (built_ > limits_.max_built_bytes || n > limits_.max_output_bytes) {
      Fail(pos, absl::StrCat("builds more than ", limits_.max_built_bytes,
                             " bytes of text (ChatTemplateLimits.max_built_bytes)"));
    }
  }

  Value MakeStr(std::string s, Pos pos) {
    Built(s.size(), pos);
    return Value::Str(std::move(s));
  }

  void Emit(std::string_view s, Pos pos) {
    if (out_->size() + s.size() > limits_.max_output_bytes) {
      Fail(pos, absl::StrCat("output longer than ", limits_.max_output_bytes,
                             " bytes (ChatTemplateLimits.max_output_bytes)"));
    }
    Built(s.size(), pos);
    out_->append(s);
  }

  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = (*it)->find(name);
      if (f != (*it)->end()) return f->second;
    }
    static const std::unordered_map<std::string, std::string_view> kBuiltins = {
        {"namespace", "namespace"},
        {"raise_exception", "raise_exception"},
        {"strftime_now", "strftime_now"},
        {"range", "range"},
        {"dict", "dict"}};
    auto b = kBuiltins.find(name);
    if (b != kBuiltins.end()) {
      Value v = Value::Of(Kind::kBuiltin);
      v.builtin = b->second;
      return v;
    }
    return Value::Undefined(name);
  }

  void Assign(const std::string& name, Value v) { (*scopes_.back())[name] = std::move(v); }

  // --- statements ---

  Flow Exec(const Body& body) {
    for (const auto& st : body) {
      const Flow f = Exec(*st);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  Flow Exec(const Stmt& st) {
    Step(st.pos);
    switch (st.k) {
      case Stmt::K::kText:
        Emit(st.text, st.pos);
        return Flow::kNormal;
      case Stmt::K::kOutput: {
        const Value v = Eval(*st.expr);
        if (v.kind == Kind::kString) {
          Emit(v.str(), st.pos);
        } else {
          std::string s;
          AppendStr(v, &s, 0, st.pos);
          Emit(s, st.pos);
        }
        return Flow::kNormal;
      }
      case Stmt::K::kIf:
        for (const auto& [cond, body] : st.branches) {
          if (Truthy(Eval(*cond))) return Exec(body);
        }
        return Exec(st.else_body);
      case Stmt::K::kFor:
        return ExecFor(st);
      case Stmt::K::kSet: {
        Value v = Eval(*st.expr);
        if (st.attr_target) {
          Value ns = Lookup(st.targets[0]);
          if (ns.kind != Kind::kNamespace) {
            Fail(st.pos, absl::StrCat("cannot set an attribute of '", st.targets[0],
                                      "': it is not a namespace()"));
          }
          // No namespace inside a namespace: lists and dicts are immutable,
          // so values can only form a cycle through one.
          if (HoldsNamespace(v, 0)) {
            Fail(st.pos, "a namespace() attribute cannot hold a namespace");
          }
          ns.dict->Set(st.targets[1], std::move(v));
        } else {
          AssignTargets(st.targets, std::move(v), st.pos);
        }
        return Flow::kNormal;
      }
      case Stmt::K::kSetBlock: {
        std::string captured = Capture(st.body, st.pos);
        Assign(st.targets[0], Value::Str(std::move(captured)));
        return Flow::kNormal;
      }
      case Stmt::K::kMacro: {
        Value m = Value::Of(Kind::kMacro);
        m.macro = &st;
        Assign(st.name, std::move(m));
        return Flow::kNormal;
      }
      case Stmt::K::kBreak:
        return Flow::kBreak;
      case Stmt::K::kContinue:
        return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  static bool HoldsNamespace(const Value& v, int depth) {
    if (v.kind == Kind::kNamespace) return true;
    if (depth > 70) return false;  // deeper values are refused by Eval
    if (v.kind == Kind::kList) {
      for (const Value& x : *v.list) {
        if (HoldsNamespace(x, depth + 1)) return true;
      }
    }
    if (v.kind == Kind::kDict) {
      for (const auto& kv : v.dict->items) {
        if (HoldsNamespace(kv.second, depth + 1)) return true;
      }
    }
    return false;
  }

  void AssignTargets(const std::vector<std::string>& targets, Value v, Pos pos) {
    if (targets.size() == 1) {
      Assign(targets[0], std::move(v));
      return;
    }
    const List items = Iterate(v, pos);
    if (items.size() != targets.size()) {
      Fail(pos,
           absl::StrCat("cannot unpack ", items.size(), " values into ", targets.size(), " names"));
    }
    for (size_t k = 0; k < targets.size(); ++k) Assign(targets[k], items[k]);
  }

  // Runs `body` with its output collected instead of emitted.
  std::string Capture(const Body& body, Pos pos) {
    std::string captured;
    std::string* saved = out_;
    out_ = &captured;
    const Flow f = Exec(body);
    out_ = saved;
    if (f != Flow::kNormal) Fail(pos, "break or continue outside a loop");
    return captured;
  }

  Flow ExecFor(const Stmt& st) {
    List items = Iterate(Eval(*st.expr), st.pos);
    if (st.filter != nullptr) {  // "for x in xs if cond": loop.* counts the kept ones
      List kept;
      for (Value& item : items) {
        Step(st.pos);
        Frame f;
        scopes_.push_back(&f);
        AssignTargets(st.targets, item, st.pos);
        const bool keep = Truthy(Eval(*st.filter));
        scopes_.pop_back();
        if (keep) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      Frame f;
      scopes_.push_back(&f);
      const Flow flow = Exec(st.else_body);
      scopes_.pop_back();
      return flow;
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < n; ++k) {
      Step(st.pos);
      Frame f;
      scopes_.push_back(&f);
      Dict loop;
      loop.Set("index0", Value::Int(k));
      loop.Set("index", Value::Int(k + 1));
      loop.Set("revindex0", Value::Int(n - k - 1));
      loop.Set("revindex", Value::Int(n - k));
      loop.Set("first", Value::Bool(k == 0));
      loop.Set("last", Value::Bool(k == n - 1));
      loop.Set("length", Value::Int(n));
      loop.Set("previtem",
               k > 0 ? items[static_cast<size_t>(k - 1)] : Value::Undefined("previtem"));
      loop.Set("nextitem",
               k + 1 < n ? items[static_cast<size_t>(k + 1)] : Value::Undefined("nextitem"));
      f["loop"] = Value::Dct(std::move(loop));
      AssignTargets(st.targets, items[static_cast<size_t>(k)], st.pos);
      const Flow flow = Exec(st.body);
      scopes_.pop_back();
      if (flow == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  List Iterate(const Value& v, Pos pos) {
    switch (v.kind) {
      case Kind::kUndefined:
        return {};
      case Kind::kList:
        return *v.list;
      case Kind::kDict: {
        List keys;
        for (const auto& kv : v.dict->items) keys.push_back(Value::Str(kv.first));
        return keys;
      }
      case Kind::kString: {
        List chars;
        const std::vector<size_t> at = CodePointOffsets(v.str());
        for (size_t k = 0; k + 1 < at.size(); ++k) {
          chars.push_back(Value::Str(v.str().substr(at[k], at[k + 1] - at[k])));
        }
        return chars;
      }
      default:
        Fail(pos, absl::StrCat("a ", KindName(v.kind), " is not iterable"));
    }
  }

  // --- expressions ---

  // Every value an expression yields is at most 64 levels deep, so printing,
  // comparing and freeing values cannot exhaust the stack.
  Value Eval(const Expr& e) {
    Value v = EvalNode(e);
    if (v.nest > 64) Fail(e.pos, "value nested deeper than 64 levels");
    return v;
  }

  Value EvalNode(const Expr& e) {
    Step(e.pos);
    switch (e.k) {
      case Expr::K::kLiteral:
        return e.literal;
      case Expr::K::kName:
        return Lookup(e.name);
      case Expr::K::kList: {
        List items;
        for (const auto& a : e.args) items.push_back(Eval(*a));
        return Value::Lst(std::move(items));
      }
      case Expr::K::kDict: {
        Dict d;
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          const Value key = Eval(*e.args[k]);
          if (key.kind != Kind::kString) Fail(e.args[k]->pos, "dict keys must be strings");
          d.Set(key.str(), Eval(*e.args[k + 1]));
        }
        return Value::Dct(std::move(d));
      }
      case Expr::K::kAttr:
        return GetAttr(Eval(*e.args[0]), e.name, *e.args[0], e.pos);
      case Expr::K::kIndex: {
        const Value obj = Eval(*e.args[0]);
        return GetItem(obj, Eval(*e.args[1]), *e.args[0], e.pos);
      }
      case Expr::K::kSlice:
        return EvalSlice(e);
      case Expr::K::kCall:
        return EvalCall(e);
      case Expr::K::kFilter: {
        Value v = Eval(*e.args[0]);
        Args args = EvalArgs(e, 1);
        return Filter(e.name, std::move(v), args, e.pos);
      }
      case Expr::K::kTest: {
        const Value v = Eval(*e.args[0]);
        Args args = EvalArgs(e, 1);
        return Value::Bool(Test(e.name, v, args, e.pos) != e.negate);
      }
      case Expr::K::kNeg: {
        const Value v = Eval(*e.args[0]);
        if (v.kind == Kind::kInt && v.i != INT64_MIN) return Value::Int(-v.i);
        if (v.kind == Kind::kFloat) return Value::Float(-v.f);
        Fail(e.pos, absl::StrCat("cannot negate a ", KindName(v.kind)));
      }
      case Expr::K::kNot:
        return Value::Bool(!Truthy(Eval(*e.args[0])));
      case Expr::K::kAnd: {
        Value a = Eval(*e.args[0]);
        return Truthy(a) ? Eval(*e.args[1]) : a;
      }
      case Expr::K::kOr: {
        Value a = Eval(*e.args[0]);
        return Truthy(a) ? a : Eval(*e.args[1]);
      }
      case Expr::K::kCond:
        if (Truthy(Eval(*e.args[1]))) return Eval(*e.args[0]);
        return e.args[2] != nullptr ? Eval(*e.args[2]) : Value::Undefined();
      case Expr::K::kBinary:
        return EvalBinary(e);
    }
    return Value::Undefined();
  }

  [[noreturn]] void FailUndefined(const Value& v, const Expr& what, Pos pos) {
    const std::string name = what.k == Expr::K::kName ? what.name : v.s ? *v.s : "";
    Fail(pos,
         name.empty() ? std::string("undefined value") : absl::StrCat("'", name, "' is undefined"));
  }

  Value GetAttr(const Value& obj, const std::string& name, const Expr& what, Pos pos) {
    switch (obj.kind) {
      case Kind::kUndefined:
        FailUndefined(obj, what, pos);
      case Kind::kDict:
      case Kind::kNamespace: {
        const Value* v = obj.dict->Find(name);
        return v != nullptr ? *v : Value::Undefined(name);
      }
      default:
        return Value::Undefined(name);
    }
  }

  Value GetItem(const Value& obj, const Value& key, const Expr& what, Pos pos) {
    switch (obj.kind) {
      case Kind::kUndefined:
        FailUndefined(obj, what, pos);
      case Kind::kDict:
      case Kind::kNamespace: {
        if (key.kind != Kind::kString) return Value::Undefined();
        const Value* v = obj.dict->Find(key.str());
        return v != nullptr ? *v : Value::Undefined(key.str());
      }
      case Kind::kList: {
        if (key.kind != Kind::kInt) Fail(pos, "list indices must be integers");
        const int64_t n = static_cast<int64_t>(obj.list->size());
        const int64_t k = key.i < 0 ? key.i + n : key.i;
        if (k < 0 || k >= n) return Value::Undefined();
        return (*obj.list)[static_cast<size_t>(k)];
      }
      case Kind::kString: {
        if (key.kind != Kind::kInt) Fail(pos, "string indices must be integers");
        const std::vector<size_t> at = CodePointOffsets(obj.str());
        const int64_t n = static_cast<int64_t>(at.size()) - 1;
        const int64_t k = key.i < 0 ? key.i + n : key.i;
        if (k < 0 || k >= n) return Value::Undefined();
        return Value::Str(
            obj.str().substr(at[static_cast<size_t>(k)],
                             at[static_cast<size_t>(k) + 1] - at[static_cast<size_t>(k)]));
      }
      default:
        return Value::Undefined();
    }
  }

  Value EvalSlice(const Expr& e) {
    const Value obj = Eval(*e.args[0]);
    std::optional<int64_t> part[3];
    for (int k = 0; k < 3; ++k) {
      if (e.args[k + 1] == nullptr) continue;
      const Value v = Eval(*e.args[k + 1]);
      if (v.kind == Kind::kNone) continue;
      if (v.kind != Kind::kInt) Fail(e.args[k + 1]->pos, "slice indices must be integers");
      part[k] = v.i;
    }
    const int64_t step = part[2].value_or(1);
    if (step == 0) Fail(e.pos, "slice step cannot be zero");
    std::vector<size_t> at;
    int64_t n;
    if (obj.kind == Kind::kList) {
      n = static_cast<int64_t>(obj.list->size());
    } else if (obj.kind == Kind::kString) {
      at = CodePointOffsets(obj.str());
      n = static_cast<int64_t>(at.size()) - 1;
    } else if (obj.kind == Kind::kUndefined) {
      FailUndefined(obj, *e.args[0], e.pos);
    } else {
      Fail(e.pos, absl::StrCat("cannot slice a ", KindName(obj.kind)));
    }
    // Python's slice.indices().
    auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
      if (!v) return dflt;
      int64_t x = *v;
      if (x < 0) x += n;
      if (step > 0) return std::clamp<int64_t>(x, 0, n);
      return std::clamp<int64_t>(x, -1, n - 1);
    };
    const int64_t start = clamp(part[0], step > 0 ? 0 : n - 1);
    const int64_t stop = clamp(part[1], step > 0 ? n : -1);
    std::vector<int64_t> idx;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) idx.push_back(k);
    if (obj.kind == Kind::kList) {
      List out;
      for (int64_t k : idx) out.push_back((*obj.list)[static_cast<size_t>(k)]);
      return Value::Lst(std::move(out));
    }
    std::string out;
    for (int64_t k : idx) {
      out.append(obj.str(), at[static_cast<size_t>(k)],
                 at[static_cast<size_t>(k) + 1] - at[static_cast<size_t>(k)]);
    }
    return MakeStr(std::move(out), e.pos);
  }

  Args EvalArgs(const Expr& e, size_t first) {
    Args a;
    for (size_t k = first; k < e.args.size(); ++k) a.pos.push_back(Eval(*e.args[k]));
    for (const auto& [name, x] : e.kwargs) a.kw.emplace_back(name, Eval(*x));
    return a;
  }

  Value EvalBinary(const Expr& e) {
    const std::string& op = e.name;
    const Value a = Eval(*e.args[0]);
    const Value b = Eval(*e.args[1]);
    const Pos pos = e.pos;
    if (op == "~") return MakeStr(Str(a, pos) + Str(b, pos), pos);
    if (op == "==") return Value::Bool(Equal(a, b, 0, pos));
    if (op == "!=") return Value::Bool(!Equal(a, b, 0, pos));
    if (op == "<") return Value::Bool(Compare(a, b, 0, pos) < 0);
    if (op == ">") return Value::Bool(Compare(a, b, 0, pos) > 0);
    if (op == "<=") return Value::Bool(Compare(a, b, 0, pos) <= 0);
    if (op == ">=") return Value::Bool(Compare(a, b, 0, pos) >= 0);
    if (op == "in" || op == "not in") return Value::Bool(Contains(b, a, pos) == (op == "in"));
    if (op == "+") {
      if (a.kind == Kind::kString && b.kind == Kind::kString) {
        Built(a.str().size() + b.str().size(), pos);
        return Value::Str(a.str() + b.str());
      }
      if (a.kind == Kind::kList && b.kind == Kind::kList) {
        List out = *a.list;
        out.insert(out.end(), b.list->begin(), b.list->end());
        Built(out.size() * sizeof(Value), pos);
        return Value::Lst(std::move(out));
      }
    }
    if (op == "*") {
      const Value* seq = a.kind == Kind::kString || a.kind == Kind::kList ? &a : &b;
      const Value* times = seq == &a ? &b : &a;
      if ((seq->kind == Kind::kString || seq->kind == Kind::kList) &&
          (times->kind == Kind::kInt || times->kind == Kind::kBool)) {
        const int64_t n = std::max<int64_t>(0, times->kind == Kind::kBool ? times->b : times->i);
        const size_t unit =
            seq->kind == Kind::kString ? seq->str().size() : seq->list->size() * sizeof(Value);
        if (unit > 0 && static_cast<uint64_t>(n) > limits_.max_built_bytes / unit) {
          Built(limits_.max_built_bytes + 1, pos);
        }
        Built(unit * static_cast<size_t>(n), pos);
        if (seq->kind == Kind::kString) {
          std::string out;
          for (int64_t k = 0; k < n; ++k) out += seq->str();
          return Value::Str(std::move(out));
        }
        List out;
        for (int64_t k = 0; k < n; ++k) out.insert(out.end(), seq->list->begin(), seq->list->end());
        return Value::Lst(std::move(out));
      }
    }
    if (!a.is_number() || !b.is_number()) {
      Fail(pos, absl::StrCat("unsupported operand types for ", op, ": ", KindName(a.kind), " and ",
                             KindName(b.kind)));
    }
    const bool ints = a.kind != Kind::kFloat && b.kind != Kind::kFloat;
    const int64_t x = a.kind == Kind::kBool ? a.b : a.i, y = b.kind == Kind::kBool ? b.b : b.i;
    const double p = a.number(), q = b.number();
    int64_t r = 0;
    if (op == "+") {
      if (!ints) return Value::Float(p + q);
      if (__builtin_add_overflow(x, y, &r)) Fail(pos, "integer overflow");
      return Value::Int(r);
    }
    if (op == "-") {
      if (!ints) return Value::Float(p - q);
      if (__builtin_sub_overflow(x, y, &r)) Fail(pos, "integer overflow");
      return Value::Int(r);
    }
    if (op == "*") {
      if (!ints) return Value::Float(p * q);
      if (__builtin_mul_overflow(x, y, &r)) Fail(pos, "integer overflow");
      return Value::Int(r);
    }
    if (op == "/") {
      if (q == 0) Fail(pos, "division by zero");
      return Value::Float(p / q);
    }
    if (op == "//" || op == "%") {
      if (q == 0) Fail(pos, op == "%" ? "modulo by zero" : "division by zero");
      if (ints) {
        if (x == INT64_MIN && y == -1) Fail(pos, "integer overflow");
        int64_t d = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {  // Python floors
          d -= 1;
          m += y;
        }
        return Value::Int(op == "//" ? d : m);
      }
      const double d = std::floor(p / q);
      return Value::Float(op == "//" ? d : p - d * q);
    }
    if (op == "**") {
      if (ints && y >= 0) {
        int64_t acc = 1;
        for (int64_t k = 0; k < y; ++k) {
          if (__builtin_mul_overflow(acc, x, &acc)) Fail(pos, "integer overflow");
          if (acc == 0 || acc == 1) break;
          Step(pos);
        }
        return Value::Int(acc);
      }
      return Value::Float(std::pow(p, q));
    }
    Fail(pos, absl::StrCat("unknown operator ", op));
  }

  bool Contains(const Value& container, const Value& item, Pos pos) {
    switch (container.kind) {
      case Kind::kString:
        if (item.kind != Kind::kString) Fail(pos, "'in <string>' needs a string on the left");
        return container.str().find(item.str()) != std::string::npos;
      case Kind::kList:
        for (const Value& v : *container.list) {
          if (Equal(v, item, 0, pos)) return true;
        }
        return false;
      case Kind::kDict:
      case Kind::kNamespace:
        return item.kind == Kind::kString && container.dict->Find(item.str()) != nullptr;
      case Kind::kUndefined:
        return false;
      default:
        Fail(pos,
             absl::StrCat("'in' needs a string, list or dict, not a ", KindName(container.kind)));
    }
  }

  // --- calls ---

  Value EvalCall(const Expr& e) {
    const Expr& callee = *e.args[0];
    if (callee.k == Expr::K::kAttr) {  // obj.method(...)
      const Value obj = Eval(*callee.args[0]);
      if (obj.kind == Kind::kUndefined) FailUndefined(obj, *callee.args[0], callee.pos);
      Args args = EvalArgs(e, 1);
      if (obj.kind == Kind::kNamespace || obj.kind == Kind::kDict) {
        const Value* member = obj.dict->Find(callee.name);
        if (member != nullptr && (member->kind == Kind::kMacro || member->kind == Kind::kBuiltin)) {
          return CallValue(*member, args, e.pos);
        }
      }
      return Method(obj, callee.name, args, e.pos);
    }
    const Value f = Eval(callee);
    Args args = EvalArgs(e, 1);
    if (f.kind == Kind::kUndefined) FailUndefined(f, callee, e.pos);
    return CallValue(f, args, e.pos);
  }

  Value CallValue(const Value& f, const Args& args, Pos pos) {
    if (f.kind == Kind::kMacro) return CallMacro(*f.macro, args, pos);
    if (f.kind != Kind::kBuiltin)
      Fail(pos, absl::StrCat("a ", KindName(f.kind), " is not callable"));
    const std::string name(f.builtin);
    if (name == "namespace" || name == "dict") {
      Dict d;
      for (const Value& p : args.pos) {  // namespace({'a': 1}) / dict(other)
        if (p.kind != Kind::kDict && p.kind != Kind::kNamespace) {
          Fail(pos, absl::StrCat(name, "(): positional arguments must be dicts"));
        }
        for (const auto& [k, v] : p.dict->items) d.Set(k, v);
      }
      for (const auto& [k, v] : args.kw) d.Set(k, v);
      return Value::Dct(std::move(d), name == "namespace" ? Kind::kNamespace : Kind::kDict);
    }
    if (name == "raise_exception") {
      const Value* m = args.Get(0, "message");
      Fail(pos, absl::StrCat("raised: ", m != nullptr ? Str(*m, pos) : std::string()));
    }
    if (name == "strftime_now") {
      const Value* fmt = args.Get(0, "format");
      if (fmt == nullptr || fmt->kind != Kind::kString || fmt->str().size() > 256) {
        Fail(pos, "strftime_now(format): format must be a string of at most 256 bytes");
      }
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[1024];
      const size_t n = std::strftime(buf, sizeof(buf), fmt->str().c_str(), &tm);
      return MakeStr(std::string(buf, n), pos);
    }
    if (name == "range") {
      int64_t lo = 0, hi = 0, step = 1;
      std::vector<int64_t> v;
      for (const Value& a : args.pos) {
        if (a.kind != Kind::kInt) Fail(pos, "range(): arguments must be integers");
        v.push_back(a.i);
      }
      if (v.size() == 1) {
        hi = v[0];
      } else if (v.size() == 2 || v.size() == 3) {
        lo = v[0];
        hi = v[1];
        if (v.size() == 3) step = v[2];
      } else {
        Fail(pos, "range() takes 1 to 3 arguments");
      }
      if (step == 0) Fail(pos, "range() step must not be zero");
      List out;
      for (int64_t k = lo; step > 0 ? k < hi : k > hi; k += step) {
        Step(pos);
        out.push_back(Value::Int(k));
        if (k > INT64_MAX - std::abs(step) || k < INT64_MIN + std::abs(step)) break;
      }
      return Value::Lst(std::move(out));
    }
    Fail(pos, absl::StrCat("unknown function ", name));
  }

  Value CallMacro(const Stmt& m, const Args& args, Pos pos) {
    if (call_depth_ >= limits_.max_call_depth) {
      Fail(pos, absl::StrCat("macro calls nested deeper than ", limits_.max_call_depth));
    }
    if (args.pos.size() > m.params.size()) {
      Fail(pos, absl::StrCat("macro '", m.name, "' takes ", m.params.size(), " arguments, got ",
                             args.pos.size()));
    }
    Frame params;
    for (size_t k = 0; k < m.params.size(); ++k) {
      const Value* v = args.Get(k, m.params[k]);
      if (v != nullptr) {
        params[m.params[k]] = *v;
      } else {
        params[m.params[k]] =
            m.defaults[k] != nullptr ? Eval(*m.defaults[k]) : Value::Undefined(m.params[k]);
      }
    }
    for (const auto& [k, v] : args.kw) {
      if (std::find(m.params.begin(), m.params.end(), k) == m.params.end()) {
        Fail(pos, absl::StrCat("macro '", m.name, "' has no parameter '", k, "'"));
      }
    }
    // A macro sees the template's top level and its own parameters.
    std::vector<Frame*> saved = {scopes_[0], &params};
    std::swap(saved, scopes_);
    ++call_depth_;
    std::string out = Capture(m.body, pos);
    --call_depth_;
    std::swap(saved, scopes_);
    return Value::Str(std::move(out));
  }

  static std::string ArgStr(const Args& a, size_t i, const std::string& name, const char* what,
                            Pos pos, std::optional<std::string> dflt = std::nullopt) {
    const Value* v = a.Get(i, name);
    if (v == nullptr || v->kind == Kind::kNone) {
      if (dflt) return *dflt;
      Fail(pos, absl::StrCat(what, ": missing argument '", name, "'"));
    }
    if (v->kind != Kind::kString) Fail(pos, absl::StrCat(what, ": '", name, "' must be a string"));
    return v->str();
  }

  static int64_t ArgInt(const Args& a, size_t i, const std::string& name, int64_t dflt, Pos pos) {
    const Value* v = a.Get(i, name);
    if (v == nullptr || v->kind == Kind::kNone) return dflt;
    if (v->kind != Kind::kInt) Fail(pos, absl::StrCat("argument '", name, "' must be an integer"));
    return v->i;
  }

  static bool ArgBool(const Args& a, size_t i, std::string_view name, bool dflt) {
    const Value* v = a.Get(i, name);
    return v == nullptr ? dflt : Truthy(*v);
  }

  // Python's str.strip family: `chars` (code points) or whitespace.
  static std::string Strip(const std::string& s, const Value* chars, bool left, bool right) {
    std::vector<std::string> set;
    if (chars != nullptr && chars->kind == Kind::kString) {
      const std::vector<size_t> at = CodePointOffsets(chars->str());
      for (size_t k = 0; k + 1 < at.size(); ++k)
        set.push_back(chars->str().substr(at[k], at[k + 1] - at[k]));
    }
    const bool ws = chars == nullptr || chars->kind != Kind::kString;
    const std::vector<size_t> at = CodePointOffsets(s);
    size_t b = 0, e = at.size() - 1;  // code point range [b, e)
    auto strippable = [&](size_t k) {
      const std::string cp = s.substr(at[k], at[k + 1] - at[k]);
      if (ws) return cp.size() == 1 && IsSpace(cp[0]);
      return std::find(set.begin(), set.end(), cp) != set.end();
    };
    if (left) {
      while (b < e && strippable(b)) ++b;
    }
    if (right) {
      while (e > b && strippable(e - 1)) --e;
    }
    return s.substr(at[b], at[e] - at[b]);
  }

  static List Split(const std::string& s, const Value* sep, int64_t maxsplit, Pos pos) {
    List out;
    if (sep == nullptr || sep->kind == Kind::kNone) {
      size_t k = 0;
      while (true) {
        while (k < s.size() && IsSpace(s[k])) ++k;
        if (k >= s.size()) break;
        size_t j = k;
        if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
          out.push_back(Value::Str(s.substr(k)));
          break;
        }
        while (j < s.size() && !IsSpace(s[j])) ++j;
        out.push_back(Value::Str(s.substr(k, j - k)));
        k = j;
      }
      return out;
    }
    if (sep->kind != Kind::kString) Fail(pos, "split(): separator must be a string");
    const std::string& d = sep->str();
    if (d.empty()) Fail(pos, "split(): empty separator");
    size_t from = 0;
    while (true) {
      const size_t at = s.find(d, from);
      if (at == std::string::npos ||
          (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit)) {
        out.push_back(Value::Str(s.substr(from)));
        break;
      }
      out.push_back(Value::Str(s.substr(from, at - from)));
      from = at + d.size();
    }
    return out;
  }

  static std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                             int64_t count) {
    if (from.empty()) {
      // Python inserts `to` between code points (and at both ends).
      std::string out;
      const std::vector<size_t> at = CodePointOffsets(s);
      int64_t done = 0;
      for (size_t k = 0; k < at.size(); ++k) {
        if (count < 0 || done < count) {
          out += to;
          ++done;
        }
        if (k + 1 < at.size()) out.append(s, at[k], at[k + 1] - at[k]);
      }
      return out;
    }
    std::string out;
    size_t pos = 0;
    int64_t done = 0;
    while (count < 0 || done < count) {
      const size_t at = s.find(from, pos);
      if (at == std::string::npos) break;
      out.append(s, pos, at - pos);
      out += to;
      pos = at + from.size();
      ++done;
    }
    out.append(s, pos, std::string::npos);
    return out;
  }

  static std::string Upper(std::string s) {
    for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return s;
  }
  static std::string Lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  }
  static std::string Capitalize(const std::string& s) {
    std::string out = Lower(s);
    if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
    return out;
  }
  static std::string Title(const std::string& s) {
    std::string out = s;
    bool start = true;
    for (char& c : out) {
      const unsigned char u = static_cast<unsigned char>(c);
      if (std::isalpha(u)) {
        c = static_cast<char>(start ? std::toupper(u) : std::tolower(u));
        start = false;
      } else {
        start = true;
      }
    }
    return out;
  }

  size_t Length(const Value& v, Pos pos) {
    switch (v.kind) {
      case Kind::kString:
        return CodePointOffsets(v.str()).size() - 1;
      case Kind::kList:
        return v.list->size();
      case Kind::kDict:
      case Kind::kNamespace:
        return v.dict->items.size();
      case Kind::kUndefined:
        return 0;
      default:
        Fail(pos, absl::StrCat("a ", KindName(v.kind), " has no length"));
    }
  }

  Value Method(const Value& obj, const std::string& name, const Args& a, Pos pos) {
    if (obj.kind == Kind::kString) {
      const std::string& s = obj.str();
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        return MakeStr(Strip(s, a.Get(0, "chars"), name != "rstrip", name != "lstrip"), pos);
      }
      if (name == "startswith" || name == "endswith") {
        const Value* p = a.Get(0, "prefix");
        if (p == nullptr) Fail(pos, absl::StrCat(name, "(): missing argument"));
        List options = p->kind == Kind::kList ? *p->list : List{*p};
        for (const Value& o : options) {
          if (o.kind != Kind::kString) Fail(pos, absl::StrCat(name, "(): expected a string"));
          const std::string& x = o.str();
          if (x.size() <= s.size() &&
              (name == "startswith" ? s.compare(0, x.size(), x) == 0
                                    : s.compare(s.size() - x.size(), x.size(), x) == 0)) {
            return Value::Bool(true);
          }
        }
        return Value::Bool(false);
      }
      if (name == "split") {
        List parts = Split(s, a.Get(0, "sep"), ArgInt(a, 1, "maxsplit", -1, pos), pos);
        Built(s.size() + parts.size() * sizeof(Value), pos);
        return Value::Lst(std::move(parts));
      }
      if (name == "rsplit") {
        if (ArgInt(a, 1, "maxsplit", -1, pos) >= 0)
          Fail(pos, "rsplit(): maxsplit is not supported");
        List parts = Split(s, a.Get(0, "sep"), -1, pos);
        Built(s.size() + parts.size() * sizeof(Value), pos);
        return Value::Lst(std::move(parts));
      }
      if (name == "splitlines") {
        List parts;
        size_t from = 0;
        while (from < s.size()) {
          size_t at = s.find_first_of("\r\n", from);
          if (at == std::string::npos) {
            parts.push_back(Value::Str(s.substr(from)));
            break;
          }
          parts.push_back(Value::Str(s.substr(from, at - from)));
          from = at + (s.compare(at, 2, "\r\n") == 0 ? 2 : 1);
        }
        Built(s.size() + parts.size() * sizeof(Value), pos);
        return Value::Lst(std::move(parts));
      }
      if (name == "lower") return MakeStr(Lower(s), pos);
      if (name == "upper") return MakeStr(Upper(s), pos);
      if (name == "title") return MakeStr(Title(s), pos);
      if (name == "capitalize") return MakeStr(Capitalize(s), pos);
      if (name == "replace") {
        const std::string from = ArgStr(a, 0, "old", "replace()", pos);
        const std::string to = ArgStr(a, 1, "new", "replace()", pos);
        const int64_t count = ArgInt(a, 2, "count", -1, pos);
        const size_t max_growth = to.size() * (CodePointOffsets(s).size() + 1);
        Built(s.size() + (to.size() > from.size() ? max_growth : 0), pos);
        return Value::Str(Replace(s, from, to, count));
      }
      if (name == "find" || name == "count") {
        const std::string x = ArgStr(a, 0, "sub", name.c_str(), pos);
        if (name == "find") {
          const size_t at = s.find(x);
          return Value::Int(at == std::string::npos
                                ? -1
                                : static_cast<int64_t>(CodePointOffsets(s.substr(0, at)).size()) -
                                      1);
        }
        if (x.empty()) return Value::Int(static_cast<int64_t>(CodePointOffsets(s).size()));
        int64_t n = 0;
        for (size_t at = s.find(x); at != std::string::npos; at = s.find(x, at + x.size())) ++n;
        return Value::Int(n);
      }
      if (name == "join") {
        const Value* items = a.Get(0, "iterable");
        if (items == nullptr) Fail(pos, "join(): missing argument");
        return Join(Iterate(*items, pos), s, pos);
      }
      if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isalnum") {
        if (s.empty()) return Value::Bool(false);
        for (char c : s) {
          const unsigned char u = static_cast<unsigned char>(c);
          const bool ok = name == "isdigit"   ? std::isdigit(u) != 0
                          : name == "isspace" ? IsSpace(c)
                          : name == "isalpha" ? std::isalpha(u) != 0
                                              : std::isalnum(u) != 0;
          if (!ok) return Value::Bool(false);
        }
        return Value::Bool(true);
      }
      if (name == "format") {
        std::string out;
        size_t next = 0;
        for (size_t k = 0; k < s.size(); ++k) {
          if (s.compare(k, 2, "{{") == 0 || s.compare(k, 2, "}}") == 0) {
            out += s[k++];
          } else if (s.compare(k, 2, "{}") == 0) {
            if (next >= a.pos.size()) Fail(pos, "format(): not enough arguments");
            AppendStr(a.pos[next++], &out, 0, pos);
            ++k;
          } else {
            out += s[k];
          }
        }
        return MakeStr(std::move(out), pos);
      }
    } else if (obj.kind == Kind::kDict || obj.kind == Kind::kNamespace) {
      if (name == "get") {
        const Value* key = a.Get(0, "key");
        if (key == nullptr) Fail(pos, "get(): missing key");
        if (key->kind == Kind::kString) {
          const Value* v = obj.dict->Find(key->str());
          if (v != nullptr) return *v;
        }
        const Value* dflt = a.Get(1, "default");
        return dflt != nullptr ? *dflt : Value::None();
      }
      if (name == "items") return Items(obj);
      if (name == "keys" || name == "values") {
        List out;
        for (const auto& [k, v] : obj.dict->items)
          out.push_back(name == "keys" ? Value::Str(k) : v);
        return Value::Lst(std::move(out));
      }
    } else if (obj.kind == Kind::kList) {
      if (name == "index") {
        const Value* x = a.Get(0, "value");
        if (x == nullptr) Fail(pos, "index(): missing argument");
        for (size_t k = 0; k < obj.list->size(); ++k) {
          if (Equal((*obj.list)[k], *x, 0, pos)) return Value::Int(static_cast<int64_t>(k));
        }
        Fail(pos, "index(): value is not in the list");
      }
    }
    Fail(pos, absl::StrCat("a ", KindName(obj.kind), " has no method '", name, "'"));
  }

  static Value Items(const Value& obj) {
    List out;
    for (const auto& [k, v] : obj.dict->items) out.push_back(Value::Lst({Value::Str(k), v}));
    return Value::Lst(std::move(out));
  }

  Value Join(const List& items, const std::string& sep, Pos pos) {
    std::string out;
    for (size_t k = 0; k < items.size(); ++k) {
      if (k > 0) out += sep;
      AppendStr(items[k], &out, 0, pos);
      if (out.size() > limits_.max_output_bytes) Built(out.size(), pos);
    }
    return MakeStr(std::move(out), pos);
  }

  // --- filters and tests ---

  Value Filter(const std::string& name, Value v, const Args& a, Pos pos) {
    if (name == "safe") return v;
    if (name == "default" || name == "d") {
      const bool boolean = ArgBool(a, 1, "boolean", false);
      if (v.kind == Kind::kUndefined || (boolean && !Truthy(v))) {
        const Value* d = a.Get(0, "default_value");
        return d != nullptr ? *d : Value::Str("");
      }
      return v;
    }
    if (name == "length" || name == "count") {
      return Value::Int(static_cast<int64_t>(Length(v, pos)));
    }
    if (name == "string") return MakeStr(Str(v, pos), pos);
    if (name == "tojson") {
      JsonOptions o;
      const Value* indent = a.Get(0, "indent");
      if (indent != nullptr && indent->kind == Kind::kInt) {
        o.indent = static_cast<int>(std::clamp<int64_t>(indent->i, 0, 64));
        o.item_sep = ",";
      }
      o.ensure_ascii = ArgBool(a, 99, "ensure_ascii", false);
      o.sort_keys = ArgBool(a, 99, "sort_keys", false);
      const Value* seps = a.Get(99, "separators");
      if (seps != nullptr && seps->kind == Kind::kList && seps->list->size() == 2 &&
          (*seps->list)[0].kind == Kind::kString && (*seps->list)[1].kind == Kind::kString) {
        o.item_sep = (*seps->list)[0].str();
        o.key_sep = (*seps->list)[1].str();
      }
      std::string out;
      AppendJson(v, o, 0, &out, pos);
      return MakeStr(std::move(out), pos);
    }
    if (name == "items") {
      if (v.kind == Kind::kUndefined) return Value::Lst({});
      if (v.kind != Kind::kDict && v.kind != Kind::kNamespace) Fail(pos, "items: expected a dict");
      return Items(v);
    }
    if (name == "list") return Value::Lst(Iterate(v, pos));
    if (name == "first" || name == "last") {
      const List items = Iterate(v, pos);
      if (items.empty()) return Value::Undefined();
      return name == "first" ? items.front() : items.back();
    }
    if (name == "reverse") {
      if (v.kind == Kind::kString) {
        const List chars = Iterate(v, pos);
        std::string out;
        for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += it->str();
        return MakeStr(std::move(out), pos);
      }
      List items = Iterate(v, pos);
      std::reverse(items.begin(), items.end());
      return Value::Lst(std::move(items));
    }
    if (name == "join") {
      const std::string sep = ArgStr(a, 0, "d", "join", pos, std::string());
      List items = Iterate(v, pos);
      const Value* attr = a.Get(1, "attribute");
      if (attr != nullptr && attr->kind == Kind::kString) {
        for (Value& x : items) x = GetAttr(x, attr->str(), Expr{}, pos);
      }
      return Join(items, sep, pos);
    }
    if (name == "map") {
      List items = Iterate(v, pos);
      const Value* attr = a.Get(99, "attribute");
      if (attr != nullptr && attr->kind == Kind::kString) {
        const Value* dflt = a.Get(99, "default");
        for (Value& x : items) {
          Value y = GetAttr(x, attr->str(), Expr{}, pos);
          if (y.kind == Kind::kUndefined && dflt != nullptr) y = *dflt;
          x = std::move(y);
        }
        return Value::Lst(std::move(items));
      }
      const std::string f = ArgStr(a, 0, "filter", "map", pos);
      Args rest;
      rest.pos.assign(a.pos.begin() + 1, a.pos.end());
      for (Value& x : items) {
        Step(pos);
        x = Filter(f, std::move(x), rest, pos);
      }
      return Value::Lst(std::move(items));
    }
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
      const bool by_attr = name == "selectattr" || name == "rejectattr";
      const bool keep_if = name == "select" || name == "selectattr";
      const std::string attr = by_attr ? ArgStr(a, 0, "attribute", name.c_str(), pos) : "";
      const size_t test_at = by_attr ? 1 : 0;
      const Value* test = a.Get(test_at, "test");
      Args rest;
      if (a.pos.size() > test_at + 1) rest.pos.assign(a.pos.begin() + test_at + 1, a.pos.end());
      List out;
      for (const Value& x : Iterate(v, pos)) {
        Step(pos);
        const Value y = by_attr ? GetAttr(x, attr, Expr{}, pos) : x;
        bool pass;
        if (test == nullptr) {
          pass = Truthy(y);
        } else {
          if (test->kind != Kind::kString)
            Fail(pos, absl::StrCat(name, ": test name must be a string"));
          pass = Test(test->str(), y, rest, pos);
        }
        if (pass == keep_if) out.push_back(x);
      }
      return Value::Lst(std::move(out));
    }
    if (name == "unique") {
      List out;
      for (const Value& x : Iterate(v, pos)) {
        bool seen = false;
        for (const Value& y : out) seen = seen || Equal(x, y, 0, pos);
        if (!seen) out.push_back(x);
        Step(pos);
      }
      return Value::Lst(std::move(out));
    }
    if (name == "sort") {
      List items = Iterate(v, pos);
      const bool reverse = ArgBool(a, 0, "reverse", false);
      const Value* attr = a.Get(2, "attribute");
      auto key = [&](const Value& x) {
        return attr != nullptr && attr->kind == Kind::kString ? GetAttr(x, attr->str(), Expr{}, pos)
                                                              : x;
      };
      std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
        const int c = Compare(key(x), key(y), 0, pos);
        return reverse ? c > 0 : c < 0;
      });
      return Value::Lst(std::move(items));
    }
    if (name == "sum") {
      Value acc = Value::Int(0);
      for (const Value& x : Iterate(v, pos)) {
        if (!x.is_number()) Fail(pos, "sum: items must be numbers");
        acc = acc.kind == Kind::kFloat || x.kind == Kind::kFloat
                  ? Value::Float(acc.number() + x.number())
                  : Value::Int(acc.i + (x.kind == Kind::kBool ? x.b : x.i));
      }
      return acc;
    }
    if (name == "abs") {
      if (v.kind == Kind::kInt && v.i != INT64_MIN) return Value::Int(v.i < 0 ? -v.i : v.i);
      if (v.kind == Kind::kFloat) return Value::Float(std::fabs(v.f));
      Fail(pos, "abs: expected a number");
    }
    if (name == "int") {
      if (v.kind == Kind::kInt) return v;
      if (v.kind == Kind::kBool) return Value::Int(v.b);
      if (v.kind == Kind::kFloat && std::isfinite(v.f) && std::fabs(v.f) < 9.2e18) {
        return Value::Int(static_cast<int64_t>(v.f));
      }
      if (v.kind == Kind::kString) {
        int64_t x = 0;
        const std::string t = Strip(v.str(), nullptr, true, true);
        char* end = nullptr;
        errno = 0;
        x = std::strtoll(t.c_str(), &end, 10);
        if (!t.empty() && end == t.c_str() + t.size() && errno == 0) return Value::Int(x);
      }
      const Value* d = a.Get(0, "default");
      return d != nullptr ? *d : Value::Int(0);
    }
    if (name == "float") {
      if (v.is_number()) return Value::Float(v.number());
      if (v.kind == Kind::kString) {
        const std::string t = Strip(v.str(), nullptr, true, true);
        char* end = nullptr;
        const double x = std::strtod(t.c_str(), &end);
        if (!t.empty() && end == t.c_str() + t.size()) return Value::Float(x);
      }
      const Value* d = a.Get(0, "default");
      return d != nullptr ? *d : Value::Float(0);
    }
    // The rest work on text.
    const std::string s = Str(v, pos);
    if (name == "trim") return MakeStr(Strip(s, a.Get(0, "chars"), true, true), pos);
    if (name == "upper") return MakeStr(Upper(s), pos);
    if (name == "lower") return MakeStr(Lower(s), pos);
    if (name == "capitalize") return MakeStr(Capitalize(s), pos);
    if (name == "title") return MakeStr(Title(s), pos);
    if (name == "replace") {
      const std::string from = ArgStr(a, 0, "old", "replace", pos);
      const std::string to = ArgStr(a, 1, "new", "replace", pos);
      const size_t max_growth = to.size() * (CodePointOffsets(s).size() + 1);
      Built(s.size() + (to.size() > from.size() ? max_growth : 0), pos);
      return Value::Str(Replace(s, from, to, ArgInt(a, 2, "count", -1, pos)));
    }
    if (name == "escape" || name == "e") {
      std::string out;
      for (char c : s) {
        switch (c) {
          case '&':
            out += "&amp;";
            break;
          case '<':
            out += "&lt;";
            break;
          case '>':
            out += "&gt;";
            break;
          case '"':
            out += "&#34;";
            break;
          case '\'':
            out += "&#39;";
            break;
          default:
            out += c;
        }
      }
      return MakeStr(std::move(out), pos);
    }
    if (name == "indent") {
      const Value* w = a.Get(0, "width");
      std::string pad =
          w != nullptr && w->kind == Kind::kString
              ? w->str()
              : std::string(
                    static_cast<size_t>(std::clamp<int64_t>(ArgInt(a, 0, "width", 4, pos), 0, 256)),
                    ' ');
      const bool first = ArgBool(a, 1, "first", false);
      const bool blank = ArgBool(a, 2, "blank", false);
      std::string out;
      size_t from = 0;
      bool line0 = true;
      while (from <= s.size()) {
        size_t at = s.find('\n', from);
        const std::string line =
            s.substr(from, at == std::string::npos ? std::string::npos : at - from);
        if ((line0 ? first : true) && (blank || !line.empty())) out += pad;
        out += line;
        if (at == std::string::npos) break;
        out += '\n';
        from = at + 1;
        line0 = false;
        Built(pad.size(), pos);
      }
      return MakeStr(std::move(out), pos);
    }
    Fail(pos, absl::StrCat("unknown filter '", name, "'"));
  }

  bool Test(const std::string& name, const Value& v, const Args& a, Pos pos) {
    auto arg = [&]() -> const Value& {
      if (a.pos.empty()) Fail(pos, absl::StrCat("test '", name, "' needs an argument"));
      return a.pos[0];
    };
    if (name == "defined") return v.kind != Kind::kUndefined;
    if (name == "undefined") return v.kind == Kind::kUndefined;
    if (name == "none") return v.kind == Kind::kNone;
    if (name == "boolean") return v.kind == Kind::kBool;
    if (name == "true") return v.kind == Kind::kBool && v.b;
    if (name == "false") return v.kind == Kind::kBool && !v.b;
    if (name == "integer") return v.kind == Kind::kInt;
    if (name == "float") return v.kind == Kind::kFloat;
    if (name == "number") return v.is_number();
    if (name == "string") return v.kind == Kind::kString;
    if (name == "mapping") return v.kind == Kind::kDict || v.kind == Kind::kNamespace;
    if (name == "iterable") {  // Jinja2's Undefined iterates as empty
      return v.kind == Kind::kList || v.kind == Kind::kDict || v.kind == Kind::kString ||
             v.kind == Kind::kUndefined;
    }
    if (name == "sequence") {
      return v.kind == Kind::kList || v.kind == Kind::kDict || v.kind == Kind::kString;
    }
    if (name == "callable") return v.kind == Kind::kMacro || v.kind == Kind::kBuiltin;
    if (name == "even" || name == "odd") {
      if (v.kind != Kind::kInt) Fail(pos, absl::StrCat("test '", name, "' needs an integer"));
      return (v.i % 2 == 0) == (name == "even");
    }
    if (name == "divisibleby") {
      const Value& d = arg();
      if (v.kind != Kind::kInt || d.kind != Kind::kInt || d.i == 0) {
        Fail(pos, "divisibleby needs a nonzero integer");
      }
      return d.i == -1 || v.i % d.i == 0;
    }
    if (name == "equalto" || name == "eq" || name == "==") return Equal(v, arg(), 0, pos);
    if (name == "ne" || name == "!=") return !Equal(v, arg(), 0, pos);
    if (name == "lt" || name == "lessthan") return Compare(v, arg(), 0, pos) < 0;
    if (name == "le") return Compare(v, arg(), 0, pos) <= 0;
    if (name == "gt" || name == "greaterthan") return Compare(v, arg(), 0, pos) > 0;
    if (name == "ge") return Compare(v, arg(), 0, pos) >= 0;
    if (name == "in") return Contains(arg(), v, pos);
    if (name == "sameas") {
      const Value& o = arg();
      if (v.kind != o.kind) return false;
      if (v.kind == Kind::kNone || v.kind == Kind::kUndefined) return true;
      if (v.kind == Kind::kBool) return v.b == o.b;
      if (v.kind == Kind::kList) return v.list == o.list;
      if (v.kind == Kind::kDict || v.kind == Kind::kNamespace) return v.dict == o.dict;
      return Equal(v, o, 0, pos);
    }
    if (name == "lower" || name == "upper") {
      if (v.kind != Kind::kString) return false;
      return v.str() == (name == "lower" ? Lower(v.str()) : Upper(v.str()));
    }
    Fail(pos, absl::StrCat("unknown test '", name, "'"));
  }

  const ChatTemplateLimits& limits_;
  std::vector<Frame*> scopes_;
  std::string* out_ = nullptr;
  int64_t steps_ = 0;
  size_t built_ = 0;
  int call_depth_ = 0;
};

template <typename Json>
Value FromJson(const Json& j, int depth) {
  if (depth > 64) Fail(Pos{}, "variables nested deeper than 64 levels");
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::None();
    case nlohmann::json::value_t::boolean:
      return Value::Bool(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value::Int(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const uint64_t u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::Float(static_cast<double>(u));
      return Value::Int(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value::Float(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value::Str(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      List items;
      for (const auto& x : j) items.push_back(FromJson(x, depth + 1));
      return Value::Lst(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it)
        d.Set(it.key(), FromJson(it.value(), depth + 1));
      return Value::Dct(std::move(d));
    }
    default:
      return Value::Undefined();
  }
}

}  // namespace

ChatTemplate::ChatTemplate(std::shared_ptr<const Program> program) : program_(std::move(program)) {}
ChatTemplate::ChatTemplate() : program_(std::make_shared<const Program>()) {}
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::ChatTemplate(const ChatTemplate&) = default;
ChatTemplate& ChatTemplate::operator=(const ChatTemplate&) = default;
ChatTemplate::~ChatTemplate() = default;

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source,
                                                 const ChatTemplateLimits& limits) {
  if (source.size() > limits.max_source_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("chat template: ", source.size(),
                                                   " bytes, more than the limit of ",
                                                   limits.max_source_bytes));
  }
  // Jinja2's default keep_trailing_newline=False drops one final newline.
  if (!source.empty() && source.back() == '\n') {
    source.remove_suffix(1);
    if (!source.empty() && source.back() == '\r') source.remove_suffix(1);
  }
  try {
    Lexer lexer(source);
    std::vector<Segment> segs = ApplyWhitespaceControl(lexer.Run());
    auto program = std::make_shared<Program>();
    program->limits = limits;
    Parser parser(std::move(segs), program->limits);
    program->body = parser.ParseTemplate();
    return ChatTemplate(std::move(program));
  } catch (const TemplateError& e) {
    return ToStatus(e);
  }
}

namespace {
template <typename Json>
absl::StatusOr<std::string> RenderWith(const ChatTemplate::Program& p, const Json& variables) {
  if (!variables.is_object()) {
    return absl::InvalidArgumentError("chat template: the variables must be a JSON object");
  }
  try {
    Frame globals;
    for (auto it = variables.begin(); it != variables.end(); ++it) {
      globals[it.key()] = FromJson(it.value(), 1);
    }
    Renderer r(p.limits);
    return r.Run(p.body, &globals);
  } catch (const TemplateError& e) {
    return ToStatus(e);
  }
}
}  // namespace

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::json& variables) const {
  return RenderWith(*program_, variables);
}

}  // namespace infoflow
