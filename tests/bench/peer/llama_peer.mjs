// Drives the prebuilt llama.cpp shipped in the npm package node-llama-cpp
// (installed by install-llama-cpp.sh) for tests/bench/peer_bench and the
// GGUF round-trip test: one JSON request file in, one JSON result on stdout.
//
//   node llama_peer.mjs REQUEST.json
//   request: {"model": "F.gguf", "gpu": false, "threads": 2, "flash_attention": "auto",
//             "kv_cache_type": "F16" | "F32",
//             "tokenize": ["text", ...],                 // optional
//             "runs": [{"name": "2K", "ids": [..], "reps": 3,
//                       "decode_tokens": 32, "logits": true}]}
//   result:  {"llama_cpp": {...build...}, "tokenize": [[ids], ...],
//             "runs": [{"name", "ttft_ms" (median), "ttft_all_ms", "first_token",
//                       "decode_tok_s", "greedy": [ids], "logits": [..] | null}]}
// TTFT = evaluating all prompt ids in one request and sampling the first
// token greedily (what our FULL TTFT measures); decode = each further greedy
// token fed back one at a time. Every run starts from an empty KV cache.
import fs from "node:fs";
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

const bindingVersion = JSON.parse(
  fs.readFileSync(new URL("./node_modules/node-llama-cpp/package.json", import.meta.url), "utf8")).version;

const req = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const llama = await getLlama({
  gpu: req.gpu ? "cuda" : false,
  build: "never", // never compile or download: the prebuilt binary or fail
  logLevel: LlamaLogLevel.error,
});
const model = await llama.loadModel({ modelPath: req.model, gpuLayers: req.gpu ? "max" : 0 });
const out = {
  llama_cpp: {
    release: llama.llamaCppRelease.release,
    repo: llama.llamaCppRelease.repo,
    binding_version: bindingVersion,
    build_type: llama.buildType,
    gpu: llama.gpu,
    system_info: llama.systemInfo,
  },
  tokenize: [],
  runs: [],
};
// Special-token spellings in the text become their ids (parse_special), no
// BOS/EOS added: what the engine's Tokenizer::Encode(text) does.
for (const text of req.tokenize ?? []) out.tokenize.push(Array.from(model.tokenize(text, true)));

const greedy = { temperature: 0 };
const now = () => Number(process.hrtime.bigint()) / 1e6;
const median = (v) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)];
for (const run of req.runs ?? []) {
  const ids = run.ids;
  const decodeTokens = run.decode_tokens ?? 32;
  const ctx = await model.createContext({
    contextSize: ids.length + decodeTokens + 8,
    batchSize: Math.min(ids.length, run.batch_size ?? 2048),
    threads: req.threads ?? 2,
    sequences: 1,
    flashAttention: { on: true, off: false }[req.flash_attention] ?? "auto",
    experimentalKvCacheKeyType: req.kv_cache_type ?? "F16", // llama.cpp's default is F16
    experimentalKvCacheValueType: req.kv_cache_type ?? "F16",
  });
  const seq = ctx.getSequence();
  const prompt = (wantLogits) =>
    ids.map((t, i) =>
      i + 1 < ids.length ? t : [t, { generateNext: { token: true, logits: wantLogits, options: greedy } }]);
  // Logits (and a warm-up) first, untimed: building the full-vocab map costs time.
  let res = await seq.controlledEvaluate(prompt(run.logits ?? false));
  let logits = null;
  const last = res[ids.length - 1].next;
  if (run.logits) {
    logits = [];
    for (const [tok, v] of last.logits) logits[tok] = v;
  }
  const ttfts = [];
  let first = last.token;
  for (let r = 0; r < (run.reps ?? 3); ++r) {
    await seq.clearHistory();
    const t0 = now();
    res = await seq.controlledEvaluate(prompt(false));
    ttfts.push(now() - t0);
    first = res[ids.length - 1].next.token;
  }
  const continuation = [first];
  const t1 = now();
  for (let i = 1; i < decodeTokens; ++i) {
    const r = await seq.controlledEvaluate([
      [continuation[continuation.length - 1], { generateNext: { token: true, options: greedy } }],
    ]);
    continuation.push(r[0].next.token);
  }
  const decodeMs = now() - t1;
  out.runs.push({
    name: run.name,
    n_tokens: ids.length,
    ttft_ms: median(ttfts),
    ttft_all_ms: ttfts,
    first_token: first,
    decode_tok_s: decodeTokens > 1 ? (decodeTokens - 1) / (decodeMs / 1e3) : null,
    greedy: continuation,
    logits,
  });
  await ctx.dispose();
}
await model.dispose();
await llama.dispose();
process.stdout.write(JSON.stringify(out) + "\n");
