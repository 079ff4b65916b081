// openclaw-jax: tags each OpenClaw run's model requests for the openclaw_jax gateway.
//
// Static provider `headers` are the same for every session and every run, so they cannot carry the
// session id or tell a person's turn from a heartbeat. Two OpenClaw surfaces together can:
//   * typed agent hooks (`before_model_resolve`, `before_prompt_build`, `before_agent_run`) see the run's
//     session id and its trigger (user, manual, heartbeat, cron, memory, overflow) and input provenance;
//   * the provider hook `resolveTransportTurnState` is called for every HTTP attempt of the provider
//     (streamed runs and simple completions) with the session id, and returns per-request headers.
// The first records the run kind per session id; the second turns it into headers.
// See README.md for the rule and the config.

const PROVIDER_ID = "openclaw-jax";

const DEFAULTS = Object.freeze({
  gatewayUrl: "",
  apiKey: "",
  personId: "",
  personIdHeader: "X-Person-Id",
  sessionDonePath: "/v1/sessions/{sessionId}/done",
  turnStartingPath: "/v1/sessions/{sessionId}/turn_starting",
  sessionIdHeader: "X-Session-Id",
  turnTypeHeader: "X-Turn-Type",
  sessionDoneHeader: "X-Session-Done",
  mainTriggers: ["user", "manual"],
  doneReasons: ["new", "reset", "idle", "daily", "deleted"],
  sideSessionPrefixes: [],
});

// The gateway's person ids (openclaw_jax/samples/person.py PERSON_ID).
const PERSON_ID = /^[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}$/;

/** Whether an http(s) URL names this machine: 127.0.0.0/8, ::1 or localhost. */
export function isLoopbackUrl(url) {
  let host;
  try {
    host = new URL(url).hostname.toLowerCase();
  } catch {
    return false;
  }
  if (host.startsWith("[") && host.endsWith("]")) host = host.slice(1, -1);
  return host === "localhost" || host === "::1" || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host);
}

// Input that did not come from the person (another session, a system event) never trains.
const SIDE_PROVENANCE = new Set(["inter_session", "internal_system"]);
const NOTICE_TIMEOUT_MS = 5000;
const TURN_NOTICE_TIMEOUT_MS = 2000;
const NOTIFIED_MAX = 1024; // remembered session ids, so before_reset + session_end send one notice

export function resolveConfig(raw) {
  const cfg = { ...DEFAULTS, ...(raw ?? {}) };
  for (const key of ["sessionIdHeader", "turnTypeHeader", "sessionDoneHeader", "personIdHeader"]) {
    if (typeof cfg[key] !== "string" || !/^[A-Za-z0-9-]+$/.test(cfg[key])) {
      throw new Error(`openclaw-jax: config ${key}=${JSON.stringify(cfg[key])} is not an HTTP header name (letters, digits, '-')`);
    }
  }
  if (cfg.gatewayUrl && !/^https?:\/\//.test(cfg.gatewayUrl)) {
    throw new Error(`openclaw-jax: config gatewayUrl=${JSON.stringify(cfg.gatewayUrl)} must start with http:// or https://`);
  }
  if (cfg.gatewayUrl && !cfg.gatewayUrl.startsWith("https://") && !isLoopbackUrl(cfg.gatewayUrl)) {
    // the key and the person's conversation would cross the network in clear text
    throw new Error(`openclaw-jax: config gatewayUrl=${JSON.stringify(cfg.gatewayUrl)} is plain http:// to another host; ` +
      "use https:// (e.g. behind a TLS proxy), or http:// only to 127.0.0.1, ::1 or localhost");
  }
  if (typeof cfg.personId !== "string" || (cfg.personId && !PERSON_ID.test(cfg.personId))) {
    throw new Error(`openclaw-jax: config personId=${JSON.stringify(cfg.personId)} must be 1 to 64 letters, digits and . _ @ + -, starting with a letter or digit`);
  }
  cfg.gatewayUrl = cfg.gatewayUrl.replace(/\/+$/, "");
  cfg.mainTriggers = new Set(cfg.mainTriggers);
  cfg.doneReasons = new Set(cfg.doneReasons);
  if (!Array.isArray(cfg.sideSessionPrefixes) || cfg.sideSessionPrefixes.some((p) => typeof p !== "string" || !p)) {
    throw new Error(`openclaw-jax: config sideSessionPrefixes=${JSON.stringify(cfg.sideSessionPrefixes)} must be a list of non-empty strings`);
  }
  return cfg;
}

/** Whether a session key names a conversation the config keeps out of training: its last part
 * (OpenClaw's OpenAI endpoint keys a request's `user` as `agent:<id>:openai-user:<user>`) or the
 * whole key starts with one of `sideSessionPrefixes` (e.g. held-out evaluation sessions). */
export function isSideSession(cfg, sessionKey) {
  if (!sessionKey || cfg.sideSessionPrefixes.length === 0) return false;
  const last = sessionKey.slice(sessionKey.lastIndexOf(":") + 1);
  return cfg.sideSessionPrefixes.some((p) => sessionKey.startsWith(p) || last.startsWith(p));
}

/** "main" for a person's own run, "side" for housekeeping; `run` is what the prompt hooks saw. */
export function turnType(cfg, run) {
  if (!run || run.compacting) return "side";
  if (isSideSession(cfg, run.sessionKey)) return "side";
  if (!cfg.mainTriggers.has(run.trigger ?? "")) return "side";
  if (SIDE_PROVENANCE.has(run.provenance ?? "")) return "side";
  return "main";
}

/** The per-request headers for one attempt of session `sessionId` (with the configured person, if any). */
export function requestHeaders(cfg, runs, sessionId) {
  const person = cfg.personId ? { [cfg.personIdHeader]: cfg.personId } : {};
  if (!sessionId) return { [cfg.turnTypeHeader]: "side", ...person };
  return { [cfg.sessionIdHeader]: sessionId, [cfg.turnTypeHeader]: turnType(cfg, runs.get(sessionId)), ...person };
}

/** The headers of a notice to the gateway about session `sessionId` (not a model request: turn type side). */
function noticeHeaders(cfg, sessionId) {
  const headers = { "Content-Type": "application/json", [cfg.sessionIdHeader]: sessionId, [cfg.turnTypeHeader]: "side" };
  if (cfg.apiKey) headers.Authorization = `Bearer ${cfg.apiKey}`;
  if (cfg.personId) headers[cfg.personIdHeader] = cfg.personId;
  return headers;
}

function noticeUrl(cfg, path, sessionId) {
  return cfg.gatewayUrl + path.replace("{sessionId}", encodeURIComponent(sessionId));
}

/** Tells the gateway that a person's turn has begun in session `sessionId`: its model request follows
 * once OpenClaw has built the prompt, and the policy server holds its background work (recomputing
 * prefixes for new weights, compiling ahead) meanwhile. Not awaited by the hook: the turn never waits. */
export function postTurnStarting(cfg, logger, sessionId) {
  if (!cfg.gatewayUrl || !cfg.turnStartingPath || !sessionId) return Promise.resolve();
  const url = noticeUrl(cfg, cfg.turnStartingPath, sessionId);
  return fetch(url, { method: "POST", headers: noticeHeaders(cfg, sessionId), body: "{}",
    signal: AbortSignal.timeout(TURN_NOTICE_TIMEOUT_MS) })
    .then((res) => {
      // 404: a gateway without the route; the turn is served the same, only without the hold
      if (!res.ok && res.status !== 404) logger.warn?.(`openclaw-jax: turn notice for ${sessionId} to ${url} answered ${res.status}`);
    })
    .catch((err) => logger.warn?.(`openclaw-jax: turn notice for ${sessionId} to ${url} failed: ${err}`));
}

async function postSessionDone(cfg, logger, notified, sessionId, reason) {
  if (!cfg.gatewayUrl || !sessionId || notified.has(sessionId)) return;
  notified.add(sessionId);
  if (notified.size > NOTIFIED_MAX) notified.delete(notified.values().next().value);
  const headers = { ...noticeHeaders(cfg, sessionId), [cfg.sessionDoneHeader]: "1" };
  const url = noticeUrl(cfg, cfg.sessionDonePath, sessionId);
  try {
    const res = await fetch(url, {
      method: "POST",
      headers,
      body: JSON.stringify({ session_id: sessionId, reason }),
      signal: AbortSignal.timeout(NOTICE_TIMEOUT_MS),
    });
    if (!res.ok) logger.warn?.(`openclaw-jax: session-done notice for ${sessionId} to ${url} answered ${res.status}`);
  } catch (err) {
    // The gateway also ends idle sessions on its own timeout: a lost notice delays, never loses, data.
    logger.warn?.(`openclaw-jax: session-done notice for ${sessionId} to ${url} failed: ${err}`);
  }
}

function register(api) {
  const cfg = resolveConfig(api.pluginConfig);
  const logger = api.logger ?? {};
  const runs = new Map(); // session id -> { trigger, provenance, compacting }
  const notified = new Set(); // session ids already reported done

  const noteRun = (_event, ctx) => {
    if (!ctx?.sessionId) return;
    const prev = runs.get(ctx.sessionId);
    const run = {
      trigger: ctx.trigger ?? prev?.trigger,
      provenance: ctx.inputProvenance?.kind ?? prev?.provenance,
      sessionKey: ctx.sessionKey ?? prev?.sessionKey,
      compacting: prev?.compacting ?? false,
      announced: prev?.announced ?? false,
    };
    runs.set(ctx.sessionId, run);
    // the first hook of a person's run (agent_end forgets the run): one notice per turn
    if (!run.announced && turnType(cfg, run) === "main") {
      run.announced = true;
      void postTurnStarting(cfg, logger, ctx.sessionId);
    }
  };
  const setCompacting = (flag) => (_event, ctx) => {
    const run = ctx?.sessionId && runs.get(ctx.sessionId);
    if (run) run.compacting = flag;
  };
  // before_model_resolve: the first hook of a run (before OpenClaw loads the session and builds the prompt),
  // so the turn notice leaves as the person's message arrives
  api.on("before_model_resolve", noteRun);
  api.on("before_prompt_build", noteRun);
  api.on("before_agent_run", noteRun);
  api.on("before_compaction", setCompacting(true));
  api.on("after_compaction", setCompacting(false));
  api.on("agent_end", (_event, ctx) => {
    if (ctx?.sessionId) runs.delete(ctx.sessionId);
  });
  api.on("session_end", async (event, ctx) => {
    const sessionId = event?.sessionId ?? ctx?.sessionId;
    runs.delete(sessionId);
    if (cfg.doneReasons.has(event?.reason ?? "unknown")) await postSessionDone(cfg, logger, notified, sessionId, event.reason);
  });
  api.on("before_reset", async (event, ctx) => {
    await postSessionDone(cfg, logger, notified, event?.sessionId ?? ctx?.sessionId, event?.reason ?? "reset");
  });

  api.registerProvider({
    id: PROVIDER_ID,
    label: "openclaw_jax gateway",
    docsPath: "/providers/models",
    auth: [],
    resolveTransportTurnState: (ctx) => ({ headers: requestHeaders(cfg, runs, ctx.sessionId) }),
  });
}

export default {
  id: "openclaw-jax",
  name: "openclaw-jax",
  description: "Tags each run's model requests for the openclaw_jax gateway: session id, main/side turn type, session done",
  register,
};
