// A person on matrix-js-sdk with its Rust crypto, driven by the integration
// tests: one JSON command a line on stdin, one JSON reply a line on stdout.
// The person cross-signs her own device and excludes insecure devices
// (OnlySignedDevicesIsolationMode, what current Element does), so she reads
// only what devices cross-signed by their owner send.
//
// Commands: {"cmd": "start", "base_url", "user_id", "access_token", "device_id", "password"}
//           {"cmd": "messages", "room_id"}            -> {"events": [...]} oldest first, decrypted
//           {"cmd": "send", "room_id", "type", "content"} -> {"event_id"}
//           {"cmd": "send_file", "room_id", "path", "name", "thread_root", "with_size"}
//                                                     -> {"event_id", "encrypted"} the file sent in the
//                                                        thread, encrypted first in an encrypted room
//           {"cmd": "device_status", "user_id", "device_id"} -> {"status": {...} | null}
//           {"cmd": "stop"}
// Every reply is {"ok": true, ...} or {"ok": false, "error": "..."}.

import { readFile } from "node:fs/promises";
import readline from "node:readline";

// The SDK logs through console: keep stdout for the replies.
for (const level of ["log", "info", "warn", "debug", "trace", "error"]) {
    console[level] = (...args) => process.stderr.write(args.map(String).join(" ") + "\n");
}

// The SDK targets Node 22; on Node 20 the one newer built-in it uses is
// Promise.withResolvers (ES2024), supplied here with its standard meaning.
if (typeof Promise.withResolvers !== "function") {
    Promise.withResolvers = function withResolvers() {
        let resolve, reject;
        const promise = new this((res, rej) => { resolve = res; reject = rej; });
        return { promise, resolve, reject };
    };
}

const sdk = await import("matrix-js-sdk");
const { OnlySignedDevicesIsolationMode } = await import("matrix-js-sdk/lib/crypto-api/index.js");
const { logger } = await import("matrix-js-sdk/lib/logger.js");
logger.setLevel(process.env.JS_PERSON_LOG || "warn");

let client = null;

function reply(obj) {
    process.stdout.write(JSON.stringify(obj) + "\n");
}

function sleep(ms) {
    return new Promise((resolve) => setTimeout(resolve, ms));
}

async function waitFor(what, predicate, timeoutMs = 30000) {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
        const value = await predicate();
        if (value) return value;
        if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
        await sleep(100);
    }
}

async function start({ base_url, user_id, access_token, device_id, password }) {
    client = sdk.createClient({ baseUrl: base_url, userId: user_id, accessToken: access_token, deviceId: device_id });
    await client.initRustCrypto({ useIndexedDB: false });
    const crypto = client.getCrypto();
    await client.startClient({ initialSyncLimit: 20, threadSupport: false });
    await waitFor("the first sync", () => client.isInitialSyncComplete());
    await crypto.bootstrapCrossSigning({
        setupNewCrossSigning: true,
        authUploadDeviceSigningKeys: async (makeRequest) => {
            try {
                return await makeRequest(null);
            } catch (err) {
                if (err.httpStatus !== 401 || !password) throw err;
                return await makeRequest({
                    type: "m.login.password", identifier: { type: "m.id.user", user: user_id }, password,
                    session: err.data?.session,
                });
            }
        },
    });
    await waitFor("cross-signing", () => crypto.isCrossSigningReady());
    crypto.setDeviceIsolationMode(new OnlySignedDevicesIsolationMode());
    return { device_id: client.getDeviceId() };
}

async function messages({ room_id }) {
    const response = await client.createMessagesRequest(room_id, null, 500, sdk.Direction.Backward);
    const mapper = client.getEventMapper({ decrypt: false });
    const events = [];
    for (const raw of response.chunk.reverse()) {
        const event = mapper(raw);
        if (event.isEncrypted()) await client.decryptEventIfNeeded(event);
        events.push({
            event_id: event.getId(), sender: event.getSender(), type: event.getType(), content: event.getContent(),
            wire_type: event.getWireType(), state_key: event.getStateKey(),
            decryption_failure: event.decryptionFailureReason ?? null,
            sender_device: event.isEncrypted() ? (event.getWireContent().device_id ?? null) : null,
        });
    }
    return { events };
}

async function send({ room_id, type, content }) {
    await waitFor(`room ${room_id}`, () => client.getRoom(room_id)?.getMyMembership() === "join");
    const { event_id } = await client.sendEvent(room_id, type, content);
    return { event_id };
}

function unpaddedBase64(bytes, urlSafe = false) {
    const text = Buffer.from(bytes).toString("base64").replace(/=+$/, "");
    return urlSafe ? text.replace(/\+/g, "-").replace(/\//g, "_") : text;
}

// An attachment encrypted as Element encrypts one (the spec's encrypted
// attachments): AES-256-CTR under a fresh key, a counter block whose low
// 64 bits are zero, the sha256 of the ciphertext.
async function encryptAttachment(plaintext) {
    const subtle = globalThis.crypto.subtle;
    const counter = new Uint8Array(16);
    globalThis.crypto.getRandomValues(counter.subarray(0, 8));
    const key = await subtle.generateKey({ name: "AES-CTR", length: 256 }, true, ["encrypt", "decrypt"]);
    const ciphertext = new Uint8Array(await subtle.encrypt({ name: "AES-CTR", counter, length: 64 }, key, plaintext));
    const jwk = await subtle.exportKey("jwk", key);
    const sha256 = new Uint8Array(await subtle.digest("SHA-256", ciphertext));
    return {
        ciphertext,
        file: {
            v: "v2", iv: unpaddedBase64(counter), hashes: { sha256: unpaddedBase64(sha256) },
            key: { kty: "oct", alg: "A256CTR", ext: true, k: jwk.k, key_ops: ["encrypt", "decrypt"] },
        },
    };
}

async function sendFile({ room_id, path, name, thread_root, with_size }) {
    await waitFor(`room ${room_id}`, () => client.getRoom(room_id)?.getMyMembership() === "join");
    const data = new Uint8Array(await readFile(path));
    const encrypted = await client.getCrypto().isEncryptionEnabledInRoom(room_id);
    const content = { msgtype: "m.file", body: name, filename: name };
    if (with_size) content.info = { mimetype: "application/octet-stream", size: data.length };
    if (encrypted) {
        const { ciphertext, file } = await encryptAttachment(data);
        const { content_uri } = await client.uploadContent(ciphertext, { type: "application/octet-stream",
                                                                         includeFilename: false });
        content.file = { ...file, url: content_uri };
    } else {
        const { content_uri } = await client.uploadContent(data, { type: "application/octet-stream", name });
        content.url = content_uri;
    }
    content["m.relates_to"] = { rel_type: "m.thread", event_id: thread_root, is_falling_back: true,
                                "m.in_reply_to": { event_id: thread_root } };
    const { event_id } = await client.sendEvent(room_id, "m.room.message", content);
    return { event_id, encrypted };
}

async function deviceStatus({ user_id, device_id }) {
    const crypto = client.getCrypto();
    await crypto.getUserDeviceInfo([user_id], true);
    const status = await crypto.getDeviceVerificationStatus(user_id, device_id);
    return {
        status: status && {
            signed_by_owner: status.signedByOwner, cross_signing_verified: status.crossSigningVerified,
            locally_verified: status.localVerified, verified: status.isVerified(),
        },
    };
}

const handlers = { start, messages, send, send_file: sendFile, device_status: deviceStatus };

const lines = readline.createInterface({ input: process.stdin });
for await (const line of lines) {
    if (!line.trim()) continue;
    const command = JSON.parse(line);
    if (command.cmd === "stop") {
        client?.stopClient();
        reply({ ok: true });
        break;
    }
    try {
        reply({ ok: true, ...(await handlers[command.cmd](command)) });
    } catch (err) {
        reply({ ok: false, error: `${err?.name}: ${err?.message}` });
    }
}
process.exit(0);
