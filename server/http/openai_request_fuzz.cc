// libFuzzer target: ParseOpenAiRequest (openai_request.h) must accept or
// refuse any HTTP body without crashing, throwing, reading out of bounds or
// recursing without bound, and whatever it accepts must stay inside the
// server's limits (max_tokens <= --max-new-tokens, n = 1) and carry a
// question. Both endpoints, under the plain and the qwen chat formats.
//
//   ./openai_request_fuzz -max_len=8192 corpus_dir
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "server/http/openai_request.h"

namespace {

using infoflow::server::http::ChatFormat;
using infoflow::server::http::Endpoint;
using infoflow::server::http::FindChatFormat;
using infoflow::server::http::ParseOpenAiRequest;
using infoflow::server::http::RequestContext;

RequestContext Context(const char* format) {
  RequestContext c;
  c.model_name = "m";
  c.separator = " # # ";
  c.chat_format = *FindChatFormat(format);
  c.max_new_tokens = 64;
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const RequestContext kPlain = Context("plain"), kQwen = Context("qwen");
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (const RequestContext* ctx : {&kPlain, &kQwen}) {
    for (Endpoint ep : {Endpoint::kCompletions, Endpoint::kChatCompletions}) {
      auto r = ParseOpenAiRequest(body, ep, *ctx);
      if (!r.ok()) continue;
      // Accepted: within the limits the server relies on.
      if (r->query.max_new_tokens() > ctx->max_new_tokens || r->query.question().empty()) {
        std::abort();
      }
    }
  }
  return 0;
}
