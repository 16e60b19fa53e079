// End-to-end check of a running Tollway gateway's POST /v1/embeddings with the official OpenAI
// TypeScript SDK's `embeddings.create`, float and base64 (the SDK's default). The Python test that
// runs this file passes the mock's deterministic vectors in TOLLWAY_EMBEDDING_EXPECTED.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const BASE_URL = process.env.TOLLWAY_BASE_URL?.trim() || '';
const API_KEY = process.env.TOLLWAY_API_KEY?.trim() || '';
const MODEL = process.env.TOLLWAY_EMBEDDING_MODEL?.trim() || '';
const EXPECTED = JSON.parse(process.env.TOLLWAY_EMBEDDING_EXPECTED || '{}');
const DIMENSIONS = Number(process.env.TOLLWAY_EMBEDDING_DIMENSIONS || '0');
const TEST_TIMEOUT_MS = 20_000;

function makeClient() {
  if (!BASE_URL || !API_KEY || !MODEL || !DIMENSIONS || Object.keys(EXPECTED).length === 0) {
    throw new Error('TOLLWAY_BASE_URL, TOLLWAY_API_KEY, TOLLWAY_EMBEDDING_MODEL, _DIMENSIONS and _EXPECTED must be set');
  }
  return new OpenAI({ baseURL: BASE_URL, apiKey: API_KEY, maxRetries: 0, timeout: 15_000 });
}

test('embeddings.create answers float vectors exactly', { timeout: TEST_TIMEOUT_MS }, async () => {
  const texts = Object.keys(EXPECTED);
  const result = await makeClient().embeddings.create({
    model: MODEL, input: texts, dimensions: DIMENSIONS, encoding_format: 'float',
  });
  assert.equal(result.object, 'list');
  assert.equal(result.model, MODEL);
  assert.deepEqual(result.data.map((d) => d.index), texts.map((_, i) => i));
  texts.forEach((text, i) => assert.deepEqual(result.data[i].embedding, EXPECTED[text]));
  assert.ok(result.usage.prompt_tokens > 0);
  assert.equal(result.usage.total_tokens, result.usage.prompt_tokens);
});

test('embeddings.create decodes the default base64 to the same float32 vector', { timeout: TEST_TIMEOUT_MS }, async () => {
  const [text] = Object.keys(EXPECTED);
  const result = await makeClient().embeddings.create({ model: MODEL, input: text, dimensions: DIMENSIONS });
  assert.deepEqual(Array.from(result.data[0].embedding), EXPECTED[text].map(Math.fround));
});
