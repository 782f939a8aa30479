// A person on matrix-js-sdk with its Rust crypto, driven by the integration
// tests: one JSON command a line on stdin, one JSON reply a line on stdout.
// The person cross-signs her own device and excludes insecure devices
// (OnlySignedDevicesIsolationMode, what current Element does), so she reads
// only what devices cross-signed by their owner send.
//
// Commands: {"cmd": "start", "base_url", "user_id", "access_token", "device_id", "password"}
//           {"cmd": "messages", "room_id"}            -> {"events": [...]} oldest first, decrypted
//           {"cmd": "send", "room_id", "type", "content"} -> {"event_id"}
//           {"cmd": "device_status", "user_id", "device_id"} -> {"status": {...} | null}
//           {"cmd": "stop"}
// Every reply is {"ok": true, ...} or {"ok": false, "error": "..."}.

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

const handlers = { start, messages, send, device_status: deviceStatus };

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
