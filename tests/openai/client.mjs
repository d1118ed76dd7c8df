// Drives thaw's front door with the official openai client, one call of each
// kind a real application makes, and prints what it saw as one JSON line:
//   node client.mjs BASE_URL WAV_FILE CHAT_MODEL WHISPER_MODEL
// (tests/e2e/test_openai_frontdoor.py runs it and checks the result).
import fs from "node:fs";
import OpenAI, { NotFoundError, toFile } from "openai";

const [baseURL, wavPath, chatModel, whisperModel] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "not-checked", maxRetries: 0, timeout: 30000 });
const out = {};

// The listing, as a UI or a client picking a model does first.
const listed = [];
for await (const m of client.models.list()) {
  listed.push({ id: m.id, object: m.object, owned_by: m.owned_by, state: m.state });
}
out.models = listed;
out.retrieved = (await client.models.retrieve(chatModel)).id;

// A streamed chat.
const stream = await client.chat.completions.create({
  model: chatModel,
  messages: [{ role: "user", content: "hi" }],
  stream: true,
});
let text = "";
for await (const chunk of stream) {
  text += chunk.choices[0]?.delta?.content ?? "";
}
out.chat = text;

// The Responses API.
const resp = await client.responses.create({ model: chatModel, input: "hi" });
out.responses = resp.output_text;

// An embedding (the client asks for base64 and decodes it).
const emb = await client.embeddings.create({ model: chatModel, input: "hi" });
out.embedding = emb.data[0].embedding;

// A transcription: a multipart upload whose "model" field routes it.
const file = await toFile(fs.readFileSync(wavPath), "speech.wav", { type: "audio/wav" });
const tr = await client.audio.transcriptions.create({ model: whisperModel, file });
out.transcription = tr.text;

// An unknown model: thaw's own 404 in OpenAI's shape.
try {
  await client.chat.completions.create({ model: "no-such-model", messages: [] });
  out.unknown = { error: "no error" };
} catch (e) {
  out.unknown = {
    notFound: e instanceof NotFoundError,
    status: e.status,
    error: e.error,
  };
}
try {
  await client.models.retrieve("no-such-model");
  out.unknownRetrieve = { error: "no error" };
} catch (e) {
  out.unknownRetrieve = { notFound: e instanceof NotFoundError, status: e.status, error: e.error };
}
console.log(JSON.stringify(out));
