// End-to-end check of a running Tollway gateway's POST /v1/responses with the official OpenAI
// TypeScript SDK's `responses.create`, buffered and streamed (same environment as chat.test.mjs).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const BASE_URL = process.env.TOLLWAY_BASE_URL?.trim() || '';
const API_KEY = process.env.TOLLWAY_API_KEY?.trim() || '';
const MODEL = process.env.TOLLWAY_MODEL?.trim() || '';
const TEST_TIMEOUT_MS = 20_000;

function makeClient() {
  if (!BASE_URL || !API_KEY || !MODEL) {
    throw new Error('TOLLWAY_BASE_URL, TOLLWAY_API_KEY and TOLLWAY_MODEL must be set');
  }
  return new OpenAI({ baseURL: BASE_URL, apiKey: API_KEY, maxRetries: 0, timeout: 15_000 });
}

test('responses.create answers a response object', { timeout: TEST_TIMEOUT_MS }, async () => {
  const response = await makeClient().responses.create({ model: MODEL, input: 'responses from typescript' });
  assert.equal(response.object, 'response');
  assert.equal(response.status, 'completed');
  assert.match(response.output_text, /responses from typescript/);
  assert.ok(response.usage.output_tokens > 0);
});

test('responses.create streams numbered events to response.completed', { timeout: TEST_TIMEOUT_MS }, async () => {
  const stream = await makeClient().responses.create({ model: MODEL, input: 'stream responses from typescript', stream: true });
  let text = '';
  const numbers = [];
  let completed;
  for await (const event of stream) {
    numbers.push(event.sequence_number);
    if (event.type === 'response.output_text.delta') text += event.delta;
    if (event.type === 'response.completed') completed = event.response;
  }
  assert.deepEqual(numbers, numbers.map((_, i) => i));
  assert.ok(completed);
  // A raw event's response has no output_text convenience field: join the message items' text.
  const finalText = completed.output
    .filter((item) => item.type === 'message')
    .flatMap((item) => item.content)
    .filter((part) => part.type === 'output_text')
    .map((part) => part.text)
    .join('');
  assert.equal(finalText, text);
  assert.match(text, /stream responses from typescript/);
});
