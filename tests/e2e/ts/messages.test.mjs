// End-to-end check of a running Tollway gateway's POST /v1/messages with the official Anthropic
// TypeScript SDK (npm package `@anthropic-ai/sdk`, pinned in package.json), changing only the base
// URL and the key. Same environment as chat.test.mjs; TOLLWAY_ANTHROPIC_MODEL names the alias
// served by the Anthropic-format route, TOLLWAY_MODEL the OpenAI-format one (translated).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';

const BASE_URL = process.env.TOLLWAY_BASE_URL?.trim() || '';
const API_KEY = process.env.TOLLWAY_API_KEY?.trim() || '';
const MODELS = [process.env.TOLLWAY_ANTHROPIC_MODEL?.trim(), process.env.TOLLWAY_MODEL?.trim()];
const TEST_TIMEOUT_MS = 20_000;
const WEATHER = {
  name: 'get_weather',
  description: 'The weather in a city.',
  input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
};

function makeClient(apiKey = API_KEY) {
  if (!BASE_URL || !apiKey || MODELS.some((m) => !m)) {
    throw new Error('TOLLWAY_BASE_URL, TOLLWAY_API_KEY, TOLLWAY_MODEL and TOLLWAY_ANTHROPIC_MODEL must be set');
  }
  // The SDK appends /v1/messages to its base URL.
  return new Anthropic({ baseURL: BASE_URL.replace(/\/v1$/, ''), apiKey, maxRetries: 0, timeout: 15_000 });
}

for (const model of MODELS) {
  test(`messages.create answers in Anthropic's shape (${model})`, { timeout: TEST_TIMEOUT_MS }, async () => {
    const message = await makeClient().messages.create({
      model,
      max_tokens: 64,
      messages: [{ role: 'user', content: 'hello from the anthropic typescript sdk' }],
    });
    assert.equal(message.type, 'message');
    assert.equal(message.model, model);
    const text = message.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
    assert.match(text, /hello from the anthropic typescript sdk/);
    assert.ok(message.usage.output_tokens > 0);
  });

  test(`messages.stream assembles the event stream (${model})`, { timeout: TEST_TIMEOUT_MS }, async () => {
    const stream = makeClient().messages.stream({
      model,
      max_tokens: 64,
      messages: [{ role: 'user', content: 'stream from typescript' }],
    });
    let streamed = '';
    stream.on('text', (delta) => {
      streamed += delta;
    });
    const final = await stream.finalMessage();
    assert.match(streamed, /stream from typescript/);
    assert.equal(final.content.filter((b) => b.type === 'text').map((b) => b.text).join(''), streamed);
  });

  test(`tools come back as tool_use blocks (${model})`, { timeout: TEST_TIMEOUT_MS }, async () => {
    const message = await makeClient().messages.create({
      model,
      max_tokens: 128,
      tools: [WEATHER],
      messages: [{ role: 'user', content: 'weather in Paris?' }],
    });
    assert.equal(message.stop_reason, 'tool_use');
    const call = message.content.find((b) => b.type === 'tool_use');
    assert.equal(call.name, 'get_weather');
    assert.equal(typeof call.input.city, 'string');
  });
}

test('countTokens answers a positive estimate', { timeout: TEST_TIMEOUT_MS }, async () => {
  const count = await makeClient().messages.countTokens({
    model: MODELS[0],
    messages: [{ role: 'user', content: 'how many tokens is this?' }],
  });
  assert.ok(count.input_tokens > 0);
});

test('a wrong key is an AuthenticationError in Anthropic\'s envelope', { timeout: TEST_TIMEOUT_MS }, async () => {
  await assert.rejects(
    makeClient('tollway-e2e-invalid-key').messages.create({
      model: MODELS[0],
      max_tokens: 8,
      messages: [{ role: 'user', content: 'x' }],
    }),
    (err) => err instanceof Anthropic.AuthenticationError && err.error?.error?.type === 'authentication_error',
  );
});
