// End-to-end check of a running Tollway gateway with the official OpenAI
// TypeScript/JavaScript SDK (npm package `openai`, pinned in package.json).
//
// Environment:
//   TOLLWAY_BASE_URL         required, e.g. http://127.0.0.1:8080/v1
//   TOLLWAY_API_KEY          required, a valid gateway key
//   TOLLWAY_MODEL            optional, model alias to call (default "chat-fast-v1")
//   TOLLWAY_ANTHROPIC_MODEL  optional, alias routed to the Anthropic adapter;
//                            the Anthropic test is skipped when unset
//
// Run with `node --test` (or `npm test`) from this directory.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI, { AuthenticationError } from 'openai';

const BASE_URL = process.env.TOLLWAY_BASE_URL?.trim() || '';
const API_KEY = process.env.TOLLWAY_API_KEY?.trim() || '';
const MODEL = process.env.TOLLWAY_MODEL?.trim() || 'chat-fast-v1';
const ANTHROPIC_MODEL = process.env.TOLLWAY_ANTHROPIC_MODEL?.trim() || '';

const TEST_TIMEOUT_MS = 20_000;
const REQUEST_TIMEOUT_MS = 15_000;
const INVALID_KEY = 'tollway-e2e-invalid-key';
const PROMPT = [{ role: 'user', content: 'hello from typescript' }];

// A missing configuration must FAIL every test (never skip), so that a broken
// harness cannot produce a green run.
function makeClient(apiKey = API_KEY) {
  if (!BASE_URL) {
    throw new Error(
      'TOLLWAY_BASE_URL is not set: point it at a running gateway, e.g. ' +
        'TOLLWAY_BASE_URL=http://127.0.0.1:8080/v1',
    );
  }
  if (!apiKey) {
    throw new Error('TOLLWAY_API_KEY is not set: provide a valid gateway API key');
  }
  return new OpenAI({
    baseURL: BASE_URL,
    apiKey,
    maxRetries: 0,
    timeout: REQUEST_TIMEOUT_MS,
  });
}

function assertNonEmptyString(value, what) {
  assert.equal(typeof value, 'string', `${what} should be a string, got ${JSON.stringify(value)}`);
  assert.ok(value.trim().length > 0, `${what} should be non-empty`);
}

function assertBufferedCompletion(completion, alias) {
  assert.equal(completion.object, 'chat.completion');
  assert.ok(
    typeof completion.id === 'string' && completion.id.startsWith('chatcmpl-'),
    `id should start with "chatcmpl-", got ${JSON.stringify(completion.id)}`,
  );
  assert.equal(completion.model, alias, 'response.model should echo the requested alias');
  assert.ok(Array.isArray(completion.choices) && completion.choices.length >= 1, 'expected at least one choice');
  const [choice] = completion.choices;
  assert.equal(choice.message.role, 'assistant');
  assertNonEmptyString(choice.message.content, 'choices[0].message.content');
  assert.equal(choice.finish_reason, 'stop');
  assert.ok(completion.usage, 'usage should be present');
  assert.ok(completion.usage.total_tokens > 0, `usage.total_tokens should be > 0, got ${completion.usage.total_tokens}`);
}

async function collectStream(client, extra = {}) {
  const stream = await client.chat.completions.create({
    model: MODEL,
    messages: PROMPT,
    stream: true,
    ...extra,
  });
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  return chunks;
}

function contentOf(chunk) {
  const content = chunk.choices?.[0]?.delta?.content;
  return typeof content === 'string' ? content : '';
}

function assertChunkEnvelope(chunks) {
  assert.ok(chunks.length > 0, 'stream produced no chunks');
  const firstId = chunks[0].id;
  assert.ok(
    typeof firstId === 'string' && firstId.startsWith('chatcmpl-'),
    `chunk id should start with "chatcmpl-", got ${JSON.stringify(firstId)}`,
  );
  chunks.forEach((chunk, i) => {
    assert.equal(chunk.object, 'chat.completion.chunk', `chunk #${i} object`);
    assert.equal(chunk.id, firstId, `chunk #${i} id should match the first chunk's id`);
    assert.equal(chunk.model, MODEL, `chunk #${i} model should echo the requested alias`);
  });
  const finishReasons = chunks.flatMap((c) => (c.choices ?? []).map((ch) => ch.finish_reason).filter((r) => r != null));
  assert.deepEqual(finishReasons, ['stop'], 'exactly one chunk should carry finish_reason "stop"');
}

test('buffered chat completion', { timeout: TEST_TIMEOUT_MS }, async () => {
  const client = makeClient();
  const completion = await client.chat.completions.create({ model: MODEL, messages: PROMPT });
  assertBufferedCompletion(completion, MODEL);
});

test('streamed chat completion with include_usage', { timeout: TEST_TIMEOUT_MS }, async () => {
  const client = makeClient();
  const chunks = await collectStream(client, { stream_options: { include_usage: true } });
  assertChunkEnvelope(chunks);

  const contentChunks = chunks.filter((c) => contentOf(c).length > 0);
  assert.ok(contentChunks.length >= 2, `expected >= 2 content chunks, got ${contentChunks.length}`);
  assertNonEmptyString(chunks.map(contentOf).join(''), 'joined streamed text');

  const last = chunks.at(-1);
  assert.ok(last.usage, `last chunk should carry usage, got ${JSON.stringify(last)}`);
  assert.ok(last.usage.total_tokens > 0, `usage.total_tokens should be > 0, got ${last.usage.total_tokens}`);
  assert.deepEqual(last.choices, [], 'usage chunk should have an empty choices array');
  chunks.slice(0, -1).forEach((chunk, i) => {
    assert.ok(chunk.usage == null, `only the final chunk may carry usage (chunk #${i}: ${JSON.stringify(chunk.usage)})`);
  });
});

test('streamed chat completion without include_usage', { timeout: TEST_TIMEOUT_MS }, async () => {
  const client = makeClient();
  const chunks = await collectStream(client);
  assertChunkEnvelope(chunks);
  assertNonEmptyString(chunks.map(contentOf).join(''), 'joined streamed text');
  chunks.forEach((chunk, i) => {
    assert.ok(chunk.usage == null, `chunk #${i} must not carry usage: ${JSON.stringify(chunk.usage)}`);
  });
});

test(
  'buffered chat completion via the Anthropic-backed alias',
  { timeout: TEST_TIMEOUT_MS, skip: ANTHROPIC_MODEL ? false : 'TOLLWAY_ANTHROPIC_MODEL not set' },
  async () => {
    const client = makeClient();
    const completion = await client.chat.completions.create({ model: ANTHROPIC_MODEL, messages: PROMPT });
    assertBufferedCompletion(completion, ANTHROPIC_MODEL);
  },
);

test('invalid API key is rejected with AuthenticationError', { timeout: TEST_TIMEOUT_MS }, async () => {
  const client = makeClient(INVALID_KEY);
  await assert.rejects(
    client.chat.completions.create({ model: MODEL, messages: PROMPT }),
    (err) => {
      // The SDK maps HTTP 401 to AuthenticationError and copies the fields of
      // the body's `error` object onto the exception (err.code, err.type, err.param).
      assert.ok(err instanceof AuthenticationError, `expected AuthenticationError, got ${err?.constructor?.name}: ${err?.message}`);
      assert.equal(err.status, 401);
      assert.equal(err.code, 'authentication_error', `error.code (body: ${JSON.stringify(err.error)})`);
      return true;
    },
  );
});

test('models.list() includes the configured model', { timeout: TEST_TIMEOUT_MS }, async () => {
  const client = makeClient();
  const ids = [];
  for await (const model of client.models.list()) {
    assert.equal(model.object, 'model', `model entry ${JSON.stringify(model)}`);
    ids.push(model.id);
  }
  assert.ok(ids.includes(MODEL), `expected ${MODEL} in models.list(), got ${JSON.stringify(ids)}`);
});
