// Drives infoflow-server's HTTP front end with the official `openai` npm
// package (installed by openai_client_test.sh) and checks it answers with
// the same greedy text as the gRPC Query (through the `infoflow` CLI) under
// the blend convention: prefix = first piece, chunks = middle pieces,
// question = last piece, prompt_template = "{question}".
import OpenAI from 'openai';
import { execFileSync } from 'node:child_process';
import assert from 'node:assert/strict';

const { BASE_URL, API_KEY, MODEL, CLI, GRPC_ADDR, TOKEN_FILE } = process.env;
const SEP = ' # # ';
const nonce = `${process.pid}-${Date.now()}`;  // chunks no earlier run stored
const prefix = 'Read the records below.';
const chunks = [
  `Record ${nonce}. Arthur Tanaka lives in Paris. His secret code is 4417.`,
  `Record ${nonce}. Maria Lopez owns a red boat and her secret code is 9021.`,
];
const question = '\nQuestion: What is the secret code of Arthur Tanaka?\nAnswer:';
const prompt = [prefix, ...chunks, question].join(SEP);
const MAX_TOKENS = 12;

const client = new OpenAI({ baseURL: `${BASE_URL}/v1`, apiKey: API_KEY, maxRetries: 0 });
let failures = 0;
async function check(name, fn) {
  try {
    await fn();
    console.log(`ok   ${name}`);
  } catch (e) {
    failures++;
    console.log(`FAIL ${name}: ${e && e.stack ? e.stack : e}`);
  }
}

function grpcAnswer(extra = ['--prefix', prefix, ...chunks.flatMap((c) => ['--chunk-text', c])]) {
  const args = ['query', '--server', GRPC_ADDR, '--token-file', TOKEN_FILE, '--template',
                '{question}', '--question', question, '--temperature', '0', '--max-new-tokens',
                String(MAX_TOKENS), ...extra];
  const out = execFileSync(CLI, args, { encoding: 'utf8' });
  assert.ok(out.endsWith('\n'), 'the CLI ends its answer with a newline');
  return out.slice(0, -1);
}

function checkUsage(usage) {
  assert.ok(usage, 'usage present');
  for (const k of ['prompt_tokens', 'completion_tokens', 'total_tokens']) {
    assert.equal(typeof usage[k], 'number', k);
  }
  assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens);
  assert.equal(typeof usage.prompt_tokens_details?.cached_tokens, 'number', 'cached_tokens');
}

const base = { model: MODEL, temperature: 0, max_tokens: MAX_TOKENS };
let first, second, grpcText;

await check('completions, non-streaming (chunks prefilled now)', async () => {
  first = await client.completions.create({ ...base, prompt, infoflow: { report: true } });
  assert.equal(first.object, 'text_completion');
  assert.equal(first.choices.length, 1);
  checkUsage(first.usage);
  assert.equal(first.usage.completion_tokens, first.infoflow.generated_tokens);
  assert.equal(first.infoflow.chunk_misses, chunks.length);
});

await check('a second request with the same chunks reports cached_tokens > 0', async () => {
  second = await client.completions.create({ ...base, prompt, infoflow: { report: true } });
  assert.equal(second.choices[0].text, first.choices[0].text);
  assert.ok(second.usage.prompt_tokens_details.cached_tokens > 0,
            JSON.stringify(second.usage));
  assert.equal(second.infoflow.chunk_hits, chunks.length);
  console.log(`     TTFT first ${first.infoflow.ttft_ms.toFixed(2)} ms (cached_tokens ` +
              `${first.usage.prompt_tokens_details.cached_tokens}), second ` +
              `${second.infoflow.ttft_ms.toFixed(2)} ms (cached_tokens ` +
              `${second.usage.prompt_tokens_details.cached_tokens})`);
});

await check('the same greedy text as the gRPC Query', async () => {
  grpcText = grpcAnswer();
  assert.equal(first.choices[0].text, grpcText);
  console.log(`     answer ${JSON.stringify(grpcText)}`);
});

await check('completions, streaming with stream_options.include_usage', async () => {
  const stream = await client.completions.create({
    ...base, prompt, stream: true, stream_options: { include_usage: true } });
  let text = '', usage = null, finish = null, events = 0;
  for await (const chunk of stream) {
    events++;
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.text ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.ok(events > 2, `events ${events}`);
  assert.equal(text, grpcText);
  assert.ok(finish === 'stop' || finish === 'length', finish);
  checkUsage(usage);
});

await check('chat completions, non-streaming and streaming', async () => {
  const messages = [{ role: 'user', content: prompt }];
  const r = await client.chat.completions.create({ ...base, messages });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  checkUsage(r.usage);
  // The served model has no chat format ("plain"): one user message renders
  // as the bare prompt, so the answer is the completion's.
  assert.equal(r.choices[0].message.content, grpcText);
  const stream = await client.chat.completions.create({
    ...base, messages, stream: true, stream_options: { include_usage: true } });
  let text = '', usage = null, role = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta?.role) role = c.delta.role;
      text += c.delta?.content ?? '';
    }
  }
  assert.equal(role, 'assistant');
  assert.equal(text, grpcText);
  checkUsage(usage);
});

// A prompt without chunks is served as a plain prompt, as any OpenAI
// endpoint serves it: prefix + question prefilled whole. "prefix # # question"
// answers as the gRPC FULL Query over the same tokens given as one chunk
// prefilled at 0 (the prefix has no BOS before it, as a prefix-mode-none chunk).
await check('a prompt without chunks is a plain prompt', async () => {
  const r = await client.completions.create({ ...base, prompt: prefix + SEP + question,
                                              infoflow: { report: true } });
  assert.equal(r.choices[0].text,
               grpcAnswer(['--chunk-text', prefix, '--prefix-mode', 'none', '--method', 'full']));
  assert.equal(r.infoflow.context_tokens, 0);
  checkUsage(r.usage);
  // No separator at all: the same tokens as a completion or as one chat message.
  const bare = await client.completions.create({ ...base, prompt: question });
  const chat = await client.chat.completions.create({
    ...base, messages: [{ role: 'user', content: question }] });
  assert.equal(chat.choices[0].message.content, bare.choices[0].text);
  console.log(`     plain answer ${JSON.stringify(bare.choices[0].text)}`);
});

await check('GET /v1/models lists the served model', async () => {
  const models = [];
  for await (const m of client.models.list()) models.push(m.id);
  assert.deepEqual(models, [MODEL]);
});

await check('a wrong API key is refused with 401', async () => {
  const bad = new OpenAI({ baseURL: `${BASE_URL}/v1`, apiKey: 'wrong-key', maxRetries: 0 });
  await assert.rejects(bad.completions.create({ ...base, prompt }), (e) => {
    assert.ok(e instanceof OpenAI.AuthenticationError, String(e));
    assert.equal(e.status, 401);
    return true;
  });
});

await check('a bad field is refused with 400 naming it', async () => {
  await assert.rejects(client.completions.create({ ...base, prompt, temperature: 'hot' }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError, String(e));
    assert.equal(e.status, 400);
    assert.equal(e.param, 'temperature');
    return true;
  });
  await assert.rejects(client.completions.create({ ...base, prompt, n: 2 }), (e) => {
    assert.equal(e.status, 400);
    assert.equal(e.param, 'n');
    return true;
  });
});

await check('a prompt past the model\'s positions is context_length_exceeded', async () => {
  // ~6000 tokens: inside the server's token limits, past infoflow-tiny's 4096 positions.
  const long = ' lamp river'.repeat(1500);
  await assert.rejects(client.completions.create({ ...base, prompt: long }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError, String(e));
    assert.equal(e.code, 'context_length_exceeded');
    assert.equal(e.param, 'prompt');
    return true;
  });
});

await check('an unknown model is 404', async () => {
  await assert.rejects(client.completions.create({ ...base, prompt, model: 'gpt-4o' }), (e) => {
    assert.ok(e instanceof OpenAI.NotFoundError, String(e));
    return true;
  });
});

console.log(failures === 0 ? 'PASS' : `${failures} check(s) failed`);
process.exit(failures === 0 ? 0 : 1);
