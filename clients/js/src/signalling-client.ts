// Browser SDK of the signalling server: one socket to the server, WebRTC sessions to robots.
// Zero runtime dependencies; the wire format is the Modulr agent interface spec (envelopes
// `{type, version, id, timestamp, correlationId?, payload?}`).

export const PROTOCOL_VERSION = '0.5';

/** One spec envelope, as sent and received on the socket and the data channel. */
export interface Envelope {
  type: string;
  version: string;
  id: string;
  timestamp: string;
  correlationId?: string;
  payload?: any;
  meta?: any;
}

/** A message to send: `id`, `version` and `timestamp` are filled in when missing. */
export type Outgoing = { type: string; payload?: any; id?: string; correlationId?: string; version?: string };

/**
 * Every failure the SDK reports. `code` is the server's or the robot's code
 * (`FORBIDDEN`, `UNAUTHORIZED`, `CONNECTION_FAILED`, `MOVEMENT_FAILED`, …) or one of the
 * SDK's own (`TIMEOUT`, `CLOSED`, `NETWORK`, `INVALID_SIGNATURE` for a robot message
 * refused by `verifyRobot`); `reason` is `details.reason` when the
 * server gave one (`no_grant`, `robot_busy`, `robot_offline`, …).
 */
export class SignallingError extends Error {
  readonly code: string;
  readonly reason?: string;
  readonly details?: Record<string, unknown>;
  readonly correlationId?: string;
  constructor(code: string, message: string, details?: Record<string, unknown>, correlationId?: string) {
    super(message);
    this.name = 'SignallingError';
    this.code = code;
    this.details = details;
    this.reason = typeof details?.reason === 'string' ? details.reason : undefined;
    this.correlationId = correlationId;
  }
  /** From a `signalling.error` or `agent.error` envelope. */
  static from(m: Envelope): SignallingError {
    const p = m.payload ?? {};
    return new SignallingError(String(p.code ?? 'ERROR'), String(p.message ?? m.type), p.details, m.correlationId);
  }
}

type Listener = (...args: any[]) => void;

/** A minimal event emitter: `on` returns a function that removes the listener. */
class Emitter {
  private listeners = new Map<string, Set<Listener>>();
  on(event: string, fn: Listener): () => void {
    let set = this.listeners.get(event);
    if (!set) this.listeners.set(event, (set = new Set()));
    set.add(fn);
    return () => this.off(event, fn);
  }
  off(event: string, fn: Listener): void {
    this.listeners.get(event)?.delete(fn);
  }
  protected emit(event: string, ...args: unknown[]): void {
    for (const fn of [...(this.listeners.get(event) ?? [])]) {
      try {
        fn(...args);
      } catch (e) {
        // A listener's bug must not break the SDK's own state.
        setTimeout(() => { throw e; });
      }
    }
  }
}

/**
 * A random v4 UUID. `crypto.randomUUID` needs a secure context; a console served over
 * plain http from a private address is not one, `getRandomValues` works everywhere.
 */
export function uuid(): string {
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

export function envelope(m: Outgoing): Envelope {
  const e: Envelope = {
    type: m.type,
    version: m.version ?? PROTOCOL_VERSION,
    id: m.id ?? uuid(),
    timestamp: new Date().toISOString(),
  };
  if (m.correlationId) e.correlationId = m.correlationId;
  if (m.payload !== undefined) e.payload = m.payload;
  return e;
}

/** Full jitter: a random delay up to the exponential backoff for this attempt. */
export function backoffDelay(attempt: number, initialMs: number, maxMs: number, random = Math.random): number {
  const ceiling = Math.min(maxMs, initialMs * 2 ** Math.min(attempt, 30));
  return Math.round(ceiling / 2 + random() * (ceiling / 2));
}

export interface ConnectOptions {
  /** `wss://host/ws`, or several: tried in turn (with backoff between rounds). */
  url: string | string[];
  /** An opaque client token (`sct_…`) or a JWT; a function is asked again on every reconnect. */
  token: string | (() => string | Promise<string>);
  /** Reconnect after the socket drops (default true). */
  reconnect?: boolean;
  /** Backoff of reconnects: first delay and ceiling (defaults 500 ms, 10 s). */
  initialDelayMs?: number;
  maxDelayMs?: number;
  /** How long one connection attempt may take to get its welcome (default 10 s). */
  connectTimeoutMs?: number;
  /** Default timeout of `request` and `openSession` (default 15 s). */
  timeoutMs?: number;
  /** Injected for tests or non-browser runtimes. */
  WebSocket?: typeof WebSocket;
  RTCPeerConnection?: typeof RTCPeerConnection;
  fetch?: typeof fetch;
}

export type ClientState = 'connecting' | 'open' | 'reconnecting' | 'closed';

/** A robot the caller holds a grant on (`GET /v1/me/robots`). */
export interface MyRobot {
  robotId: string;
  name: string | null;
  online: boolean;
  lastSeenAt: string | null;
  role: 'viewer' | 'operator' | 'owner';
}

interface Pending {
  resolve: (m: Envelope) => void;
  reject: (e: SignallingError) => void;
  timer: ReturnType<typeof setTimeout>;
}

function tokenSafeForProtocol(token: string): boolean {
  // A WebSocket subprotocol is an RFC 7230 token; JWTs and sct_ tokens fit.
  return /^[A-Za-z0-9!#$%&'*+.^_`|~-]+$/.test(token);
}

/** `wss://host:1/ws` → `https://host:1`: where the HTTP API of that server lives. */
export function httpBase(wsUrl: string): string {
  const u = new URL(wsUrl);
  u.protocol = u.protocol === 'wss:' ? 'https:' : 'http:';
  return u.origin;
}

/**
 * The connection to the signalling server. `SignallingClient.connect` resolves once the
 * server's welcome arrived; afterwards the socket reconnects on its own (backoff with
 * jitter, every URL in turn), and open sessions keep their peer connections meanwhile.
 *
 * Events: `state` (ClientState), `error` (SignallingError), `message` (every envelope
 * from the server), `welcome` (the welcome's payload, after each (re)connect).
 */
export class SignallingClient extends Emitter {
  state: ClientState = 'connecting';
  /** This socket's id from the latest welcome. */
  connectionId: string | null = null;
  iceServers: RTCIceServer[] = [];
  /** The token's subject, once `me()` told it. */
  subject: string | null = null;
  private ws: WebSocket | null = null;
  private urls: string[];
  private urlIndex = 0;
  private attempt = 0;
  private pending = new Map<string, Pending>();
  private sessions = new Map<string, Session>();
  private reconnectTimer: ReturnType<typeof setTimeout> | null = null;
  readonly opts: Required<Pick<ConnectOptions, 'reconnect' | 'initialDelayMs' | 'maxDelayMs' | 'connectTimeoutMs' | 'timeoutMs'>> & ConnectOptions;

  private constructor(opts: ConnectOptions) {
    super();
    this.opts = { reconnect: true, initialDelayMs: 500, maxDelayMs: 10_000, connectTimeoutMs: 10_000, timeoutMs: 15_000, ...opts };
    this.urls = Array.isArray(opts.url) ? [...opts.url] : [opts.url];
    if (this.urls.length === 0) throw new SignallingError('BAD_REQUEST', 'no url given');
  }

  /**
   * Connects and resolves after the server's welcome. Each URL is tried once, in turn; if
   * none answers, rejects with the last error (`UNAUTHORIZED` when the server refused the
   * token).
   */
  static async connect(opts: ConnectOptions): Promise<SignallingClient> {
    const client = new SignallingClient(opts);
    let last: SignallingError | undefined;
    for (let i = 0; i < client.urls.length; i++) {
      client.urlIndex = i;
      try {
        await client.open();
        return client;
      } catch (e) {
        last = e as SignallingError;
        if (last.code === 'UNAUTHORIZED') break;
      }
    }
    client.setState('closed');
    throw last ?? new SignallingError('NETWORK', 'could not connect');
  }

  get url(): string {
    return this.urls[this.urlIndex];
  }

  private setState(s: ClientState): void {
    if (this.state === s) return;
    this.state = s;
    this.emit('state', s);
  }

  private async token(): Promise<string> {
    const t = this.opts.token;
    return typeof t === 'function' ? await t() : t;
  }

  /** One connection attempt to the current URL: resolves on the welcome. */
  private async open(): Promise<void> {
    const token = await this.token();
    const WS = this.opts.WebSocket ?? globalThis.WebSocket;
    const url = this.url;
    const ws = tokenSafeForProtocol(token)
      ? new WS(url, [`bearer.${token}`])
      : new WS(`${url}${url.includes('?') ? '&' : '?'}token=${encodeURIComponent(token)}`);
    this.ws = ws;
    await new Promise<void>((resolve, reject) => {
      let settled = false;
      const fail = (e: SignallingError) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        try { ws.close(); } catch { /* already closed */ }
        reject(e);
      };
      const timer = setTimeout(() => fail(new SignallingError('TIMEOUT', `no welcome from ${url}`)), this.opts.connectTimeoutMs);
      ws.onmessage = (ev) => {
        const m = parse(ev.data);
        if (!m) return;
        if (!settled && m.type === 'signalling.welcome') {
          settled = true;
          clearTimeout(timer);
          this.attempt = 0;
          this.welcome(m);
          resolve();
        }
        this.dispatch(m);
      };
      ws.onclose = (ev) => {
        if (!settled) {
          // The browser hides the upgrade's HTTP status: ask the API whether the token
          // is the reason, so a bad token fails at once instead of retrying forever.
          this.diagnose(token, ev.code).then(fail, () => fail(new SignallingError('NETWORK', `socket to ${url} closed (${ev.code})`)));
          return;
        }
        if (this.ws === ws) this.lost(ev.code);
      };
      ws.onerror = () => { /* onclose follows and decides */ };
    });
  }

  private async diagnose(token: string, code: number): Promise<SignallingError> {
    const f = this.opts.fetch ?? globalThis.fetch;
    const response = await f(`${httpBase(this.url)}/v1/me`, { headers: { authorization: `Bearer ${token}` } });
    if (response.status === 401) {
      const body = await response.json().catch(() => ({}));
      return new SignallingError('UNAUTHORIZED', body.message ?? 'token refused', { reason: 'token' });
    }
    return new SignallingError('NETWORK', `socket to ${this.url} closed (${code})`);
  }

  private welcome(m: Envelope): void {
    this.connectionId = m.payload?.connectionId ?? null;
    this.iceServers = Array.isArray(m.payload?.iceServers) ? m.payload.iceServers : [];
    this.setState('open');
    this.emit('welcome', m.payload);
  }

  /** The socket dropped after it was open: fail what waits on it, reconnect. */
  private lost(code: number): void {
    this.ws = null;
    for (const [id, p] of this.pending) {
      clearTimeout(p.timer);
      p.reject(new SignallingError('CLOSED', `signalling connection lost (${code})`));
      this.pending.delete(id);
    }
    // Code 4003: the token was revoked; 1008: the server refused us. No retry then.
    if (!this.opts.reconnect || this.state === 'closed' || code === 4003) {
      this.setState('closed');
      for (const s of this.sessions.values()) s.signallingLost();
      if (code === 4003) this.emit('error', new SignallingError('UNAUTHORIZED', 'token revoked', { reason: 'revoked' }));
      return;
    }
    this.setState('reconnecting');
    for (const s of this.sessions.values()) s.signallingLost();
    this.scheduleReconnect();
  }

  private scheduleReconnect(): void {
    const delay = backoffDelay(this.attempt++, this.opts.initialDelayMs, this.opts.maxDelayMs);
    this.reconnectTimer = setTimeout(async () => {
      this.reconnectTimer = null;
      if (this.state === 'closed') return;
      try {
        await this.open();
        for (const s of this.sessions.values()) s.signallingBack();
      } catch (e) {
        const err = e as SignallingError;
        this.emit('error', err);
        if (err.code === 'UNAUTHORIZED') {
          this.close();
          return;
        }
        this.urlIndex = (this.urlIndex + 1) % this.urls.length;
        this.scheduleReconnect();
      }
    }, delay);
  }

  private dispatch(m: Envelope): void {
    this.emit('message', m);
    if (m.correlationId) {
      const p = this.pending.get(m.correlationId);
      if (p) {
        this.pending.delete(m.correlationId);
        clearTimeout(p.timer);
        if (m.type === 'signalling.error') p.reject(SignallingError.from(m));
        else p.resolve(m);
        return;
      }
    }
    const sessionId = m.payload?.connectionId;
    const session = typeof sessionId === 'string' ? this.sessions.get(sessionId) : undefined;
    if (session) {
      session.signal(m);
    } else if (m.type === 'signalling.error') {
      this.emit('error', SignallingError.from(m));
    }
  }

  /** Sends one envelope on the socket; throws `CLOSED` when it is not open. */
  send(m: Outgoing): Envelope {
    const e = envelope(m);
    if (!this.ws || this.state !== 'open' || this.ws.readyState !== 1) {
      throw new SignallingError('CLOSED', 'signalling connection is not open');
    }
    this.ws.send(JSON.stringify(e));
    return e;
  }

  /**
   * Sends and waits for the server's message whose `correlationId` is its id (a
   * `signalling.error` rejects). Resolves `null` after `quietMs` when the message expects
   * no answer on success (an offer's answer arrives by session id, not correlation).
   */
  request(m: Outgoing, timeoutMs = this.opts.timeoutMs): Promise<Envelope> {
    return new Promise((resolve, reject) => {
      let e: Envelope;
      try {
        e = this.send(m);
      } catch (err) {
        reject(err);
        return;
      }
      const timer = setTimeout(() => {
        this.pending.delete(e.id);
        reject(new SignallingError('TIMEOUT', `no answer to ${m.type}`));
      }, timeoutMs);
      this.pending.set(e.id, { resolve, reject, timer });
    });
  }

  /** Watches for a `signalling.error` correlated with `id` (an offer's refusal). */
  watchError(id: string, onError: (e: SignallingError) => void): () => void {
    const timer = setTimeout(() => this.pending.delete(id), this.opts.timeoutMs);
    this.pending.set(id, { resolve: () => {}, reject: onError, timer });
    return () => {
      clearTimeout(timer);
      this.pending.delete(id);
    };
  }

  /** GET on the server's HTTP API with this client's token; HTTP errors become SignallingErrors. */
  private async http(path: string): Promise<any> {
    const f = this.opts.fetch ?? globalThis.fetch;
    const response = await f(`${httpBase(this.url)}${path}`, { headers: { authorization: `Bearer ${await this.token()}` } });
    const body = await response.json().catch(() => null);
    if (response.status >= 400) {
      throw new SignallingError(body?.error ?? 'HTTP_ERROR', body?.message ?? `HTTP ${response.status}`, { status: response.status });
    }
    return body;
  }

  /** Who the token names: `{subject, expiresAt}` (`GET /v1/me`). */
  async me(): Promise<{ subject: string; expiresAt: string | null }> {
    const me = await this.http('/v1/me');
    if (typeof me?.subject === 'string') this.subject = me.subject;
    return me;
  }

  /**
   * Opens an ARP session with a robot through this server's gateway
   * (`/v1/robots/{robotId}/arp`, this client's token) and initializes it. With
   * `onConfirmation`, the robot's confirmation requests come to this program, answered
   * with `confirmedBy` = this token's subject (asked of `GET /v1/me` if not known yet).
   * With `verifyRobot`, only frames the robot signed for this connection are taken (its key
   * from `robotKey(robotId)`).
   */
  async connectArp(robotId: string, options: ArpSessionOptions & { subject?: string } = {}): Promise<ArpSession> {
    // Fetched while the socket opens; ArpSession.connect reports a failure.
    const robotKey = options.verifyRobot ? this.robotKey(robotId) : undefined;
    robotKey?.catch(() => {});
    if (options.onConfirmation && !options.subject && !this.subject) await this.me().catch(() => null);
    return ArpSession.connect({
      robotKey,
      url: arpUrl(this.url, robotId),
      token: this.opts.token,
      WebSocket: this.opts.WebSocket,
      fetch: this.opts.fetch,
      connectTimeoutMs: this.opts.connectTimeoutMs,
      timeoutMs: this.opts.timeoutMs,
      ...options,
      subject: options.subject ?? this.subject ?? undefined,
    });
  }

  /**
   * The robots this subject holds grants on, with online state and role
   * (`GET /v1/me/robots`; the server pushes no presence events, so poll it).
   */
  robots(): Promise<MyRobot[]> {
    return this.http('/v1/me/robots');
  }

  /**
   * The robot's enrolled public key as a JWK (`GET /v1/robots/{robotId}/key`; the admin or
   * any holder of a grant on the robot): what `verifyRobot` checks its replies against.
   */
  robotKey(robotId: string): Promise<RobotKey> {
    return this.http(`/v1/robots/${encodeURIComponent(robotId)}/key`);
  }

  /** Round trip to the server in milliseconds (`signalling.ping`). */
  async ping(): Promise<number> {
    const t0 = performance.now();
    await this.request({ type: 'signalling.ping' });
    return performance.now() - t0;
  }

  /**
   * Opens a WebRTC session with a robot. Resolves when the data channel is open; rejects
   * with the server's refusal (`FORBIDDEN`/`no_grant`, `FORBIDDEN`/`robot_busy`,
   * `CONNECTION_FAILED`/`robot_offline`, …) or `TIMEOUT`.
   */
  async openSession(robotId: string, options: SessionOptions = {}): Promise<Session> {
    const PC = this.opts.RTCPeerConnection ?? globalThis.RTCPeerConnection;
    const session = new Session(this, robotId, options, PC);
    this.sessions.set(session.id, session);
    session.on('state', (s: SessionState) => {
      if (s === 'closed') this.sessions.delete(session.id);
    });
    try {
      await session.start(options.timeoutMs ?? this.opts.timeoutMs);
    } catch (e) {
      await session.close();
      throw e;
    }
    return session;
  }

  /** Ends every session and closes the socket for good. */
  async close(): Promise<void> {
    this.setState('closed');
    if (this.reconnectTimer) clearTimeout(this.reconnectTimer);
    await Promise.all([...this.sessions.values()].map((s) => s.close()));
    try { this.ws?.close(1000); } catch { /* already closed */ }
    this.ws = null;
  }
}

function parse(data: unknown): Envelope | null {
  if (typeof data !== 'string') return null;
  try {
    const m = JSON.parse(data);
    return m && typeof m === 'object' && typeof m.type === 'string' ? m : null;
  } catch {
    return null;
  }
}

export interface SessionOptions {
  /** Ask for the robot's video (adds a recvonly video transceiver). */
  video?: boolean;
  /** The session id; a fresh UUID by default. */
  connectionId?: string;
  timeoutMs?: number;
  /** ICE `disconnected` for this long triggers an ICE restart (default 3 s). */
  iceRestartAfterMs?: number;
  /**
   * Check that every message on the data channel comes from the robot itself: each must
   * carry the robot's signature (`meta.signature`, robot-agent's `sign_replies = true`),
   * checked against its enrolled key from the server (`robotKey`, fetched once when the
   * session opens). An unsigned or badly signed message is not delivered: the session
   * emits `error` with code `INVALID_SIGNATURE` (and a request it answers rejects with it).
   * Needs WebCrypto with Ed25519 or ECDSA P-256 (a secure context in browsers).
   */
  verifyRobot?: boolean;
}

export type SessionState = 'connecting' | 'open' | 'reconnecting' | 'closed';

export interface SessionStats {
  /** Round trip of the selected candidate pair, in milliseconds. */
  rttMs?: number;
  /** Received bits per second since the previous `stats()` call. */
  bitrateIn?: number;
  framesPerSecond?: number;
  frameWidth?: number;
  frameHeight?: number;
  /** `host`, `srflx`, `prflx` or `relay` (TURN): how the media flows. */
  localCandidateType?: string;
  remoteCandidateType?: string;
  bytesReceived?: number;
  bytesSent?: number;
}

/**
 * One WebRTC session with a robot. Events: `state` (SessionState, with the end reason on
 * `closed`), `message` (every envelope from the robot's data channel), `error`
 * (SignallingError), `video` (the MediaStream, when a track arrives).
 */
export class Session extends Emitter {
  readonly id: string;
  readonly robotId: string;
  state: SessionState = 'connecting';
  /** Why it closed: `closed` (by us), the server's `signalling.disconnected` reason, `failed`… */
  endReason: string | null = null;
  /** The robot's video, once a track arrived. */
  video: MediaStream | null = null;
  /** The robot's `agent.capabilities` payload, once it arrived. */
  capabilities: any = null;
  readonly pc: RTCPeerConnection;
  private dc: RTCDataChannel;
  private pending = new Map<string, Pending>();
  private estopped = false;
  private restartTimer: ReturnType<typeof setTimeout> | null = null;
  private restarting = false;
  private lastStats: { at: number; bytes: number } | null = null;
  private remoteSet = false;
  private earlyCandidates: RTCIceCandidateInit[] = [];
  private stopWatch: (() => void) | null = null;
  /** With `verifyRobot`: the robot's key, and the queue that keeps messages in order. */
  private robotKey: Promise<RobotVerifier> | null = null;
  private inbound: Promise<void> = Promise.resolve();

  constructor(private client: SignallingClient, robotId: string, private options: SessionOptions, PC: typeof RTCPeerConnection) {
    super();
    this.id = options.connectionId ?? uuid();
    this.robotId = robotId;
    this.pc = new PC({ iceServers: client.iceServers });
    this.dc = this.pc.createDataChannel('control');
    if (options.video) this.pc.addTransceiver('video', { direction: 'recvonly' });
    this.pc.ontrack = (ev) => {
      this.video = ev.streams[0] ?? new MediaStream([ev.track]);
      this.emit('video', this.video);
    };
    this.pc.onicecandidate = (ev) => {
      const c = ev.candidate;
      if (!c || !c.candidate) return;
      this.trySend({
        type: 'signalling.ice_candidate',
        payload: { connectionId: this.id, candidate: c.candidate, sdpMid: c.sdpMid ?? '0', sdpMLineIndex: c.sdpMLineIndex ?? 0 },
      });
    };
    this.pc.oniceconnectionstatechange = () => this.iceChanged();
    this.dc.onmessage = (ev) => this.fromRobot(ev.data);
    this.dc.onclose = () => this.end('closed');
  }

  /** Sends the offer; resolves when the data channel is open. */
  async start(timeoutMs: number): Promise<void> {
    const opened = new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new SignallingError('TIMEOUT', `session with ${this.robotId} did not open`)), timeoutMs);
      this.dc.onopen = () => {
        clearTimeout(timer);
        this.setState('open');
        resolve();
      };
      this.on('error', (e: SignallingError) => {
        if (this.state === 'connecting') {
          clearTimeout(timer);
          reject(e);
        }
      });
      this.on('state', (s: SessionState) => {
        if (s === 'closed') {
          clearTimeout(timer);
          reject(new SignallingError('CLOSED', `session ended: ${this.endReason}`, { reason: this.endReason ?? 'closed' }));
        }
      });
    });
    if (this.options.verifyRobot) {
      this.robotKey = this.client.robotKey(this.robotId).then((k) => robotVerifier(k, this.robotId));
      // Awaited below; marked handled so a failure before then is no unhandled rejection.
      this.robotKey.catch(() => {});
    }
    await this.offer(false);
    await Promise.all([opened, this.robotKey]);
  }

  private async offer(iceRestart: boolean): Promise<void> {
    const offer = await this.pc.createOffer(iceRestart ? { iceRestart: true } : undefined);
    await this.pc.setLocalDescription(offer);
    const sent = this.client.send({
      type: 'signalling.offer',
      payload: {
        robotId: this.robotId,
        connectionId: this.id,
        sdpType: 'offer',
        sdp: this.pc.localDescription?.sdp ?? offer.sdp,
        ...(iceRestart ? { iceRestart: true } : {}),
      },
    });
    // A refusal names the offer by correlationId; the answer names the session.
    this.stopWatch?.();
    this.stopWatch = this.client.watchError(sent.id, (e) => this.fail(e));
  }

  private fail(e: SignallingError): void {
    this.emit('error', e);
    // A refused offer opened no session: there is nothing to tell the server.
    if (this.state === 'connecting') this.end(e.reason ?? e.code, false);
  }

  /** A signalling message about this session (routed by `payload.connectionId`). */
  async signal(m: Envelope): Promise<void> {
    const p = m.payload ?? {};
    try {
      if (m.type === 'signalling.answer') {
        this.stopWatch?.();
        await this.pc.setRemoteDescription({ type: 'answer', sdp: p.sdp });
        this.remoteSet = true;
        for (const c of this.earlyCandidates.splice(0)) await this.pc.addIceCandidate(c);
        this.restarting = false;
      } else if (m.type === 'signalling.ice_candidate') {
        const c = { candidate: p.candidate, sdpMid: p.sdpMid, sdpMLineIndex: p.sdpMLineIndex };
        if (this.remoteSet) await this.pc.addIceCandidate(c);
        else this.earlyCandidates.push(c);
      } else if (m.type === 'signalling.disconnected') {
        this.end(p.details?.reason ?? p.reason ?? 'closed', false);
      } else if (m.type === 'signalling.error') {
        this.emit('error', SignallingError.from(m));
      }
    } catch (e) {
      this.emit('error', new SignallingError('CONNECTION_FAILED', String((e as Error).message ?? e)));
    }
  }

  private iceChanged(): void {
    const s = this.pc.iceConnectionState;
    if (s === 'connected' || s === 'completed') {
      if (this.restartTimer) clearTimeout(this.restartTimer);
      this.restartTimer = null;
      if (this.state === 'reconnecting') this.setState('open');
    } else if (s === 'disconnected') {
      if (this.state === 'open') this.setState('reconnecting');
      this.restartTimer ??= setTimeout(() => this.iceRestart(), this.options.iceRestartAfterMs ?? 3000);
    } else if (s === 'failed') {
      if (this.state === 'open') this.setState('reconnecting');
      this.iceRestart();
    }
  }

  /** Re-offers with fresh ICE credentials on the same session id. */
  private iceRestart(): void {
    this.restartTimer = null;
    if (this.state === 'closed' || this.restarting) return;
    if (this.client.state !== 'open') return; // retried when signalling is back
    this.restarting = true;
    this.remoteSet = false;
    this.offer(true).catch((e) => {
      this.restarting = false;
      this.emit('error', e instanceof SignallingError ? e : new SignallingError('CONNECTION_FAILED', String(e)));
    });
  }

  signallingLost(): void {
    this.restarting = false;
  }

  /** The socket is back: re-offer on the same session id. A server started with
   * `--session-resume-secs` hands the session to this new socket (the robot never noticed);
   * the restart also brings fresh candidates if the network moved meanwhile. */
  signallingBack(): void {
    this.iceRestart();
  }

  private fromRobot(data: unknown): void {
    if (this.robotKey) {
      const key = this.robotKey;
      // One at a time, in arrival order: verification is asynchronous.
      this.inbound = this.inbound.then(() => this.verified(key, data)).catch(() => {});
      return;
    }
    this.deliver(parse(data));
  }

  /** `verifyRobot`: delivers a message only if the robot's signature on it checks. */
  private async verified(key: Promise<RobotVerifier>, data: unknown): Promise<void> {
    if (typeof data !== 'string' || !parse(data)) return;
    let verifier: RobotVerifier;
    try {
      verifier = await key;
    } catch {
      return; // openSession fails with the reason; nothing can be checked
    }
    let m: Envelope;
    try {
      m = await verifier.verify(data);
    } catch (e) {
      const err = e instanceof SignallingError ? e : new SignallingError('INVALID_SIGNATURE', String(e));
      const p = err.correlationId ? this.pending.get(err.correlationId) : undefined;
      if (p && err.correlationId) {
        this.pending.delete(err.correlationId);
        clearTimeout(p.timer);
        p.reject(err);
      }
      this.emit('error', err);
      return;
    }
    if (this.state !== 'closed') this.deliver(m);
  }

  private deliver(m: Envelope | null): void {
    if (!m) return;
    if (m.type === 'agent.capabilities') this.capabilities = m.payload;
    if (m.correlationId) {
      const p = this.pending.get(m.correlationId);
      if (p) {
        this.pending.delete(m.correlationId);
        clearTimeout(p.timer);
        if (m.type === 'agent.error') p.reject(SignallingError.from(m));
        else p.resolve(m);
      }
    }
    if (m.type === 'agent.error' && !m.correlationId) this.emit('error', SignallingError.from(m));
    this.emit('message', m);
  }

  private trySend(m: Outgoing): void {
    try {
      this.client.send(m);
    } catch {
      // Signalling is down: the ICE restart after it returns brings fresh candidates.
    }
  }

  /** Sends one message on the data channel; returns the envelope sent. */
  send(m: Outgoing): Envelope {
    if (this.state === 'closed' || this.dc.readyState !== 'open') {
      throw new SignallingError('CLOSED', 'data channel is not open');
    }
    const e = envelope(m);
    this.dc.send(JSON.stringify(e));
    return e;
  }

  /** Sends and resolves with the robot's reply (`correlationId` = the message's id). */
  request(m: Outgoing, timeoutMs = this.client.opts.timeoutMs): Promise<Envelope> {
    return new Promise((resolve, reject) => {
      let e: Envelope;
      try {
        e = this.send(m);
      } catch (err) {
        reject(err);
        return;
      }
      const timer = setTimeout(() => {
        this.pending.delete(e.id);
        reject(new SignallingError('TIMEOUT', `no reply to ${m.type}`));
      }, timeoutMs);
      this.pending.set(e.id, { resolve, reject, timer });
    });
  }

  /**
   * One movement command (`agent.movement`), values clamped to [-1, 1]. Repeat it (about
   * 10 Hz) while driving: the robot stops on its own when commands stop coming. Ignored
   * after `emergencyStop()` until `resetEmergencyStop()`.
   */
  move(v: { forward: number; turn: number }): Envelope | null {
    if (this.estopped) return null;
    return this.send({ type: 'agent.movement', payload: { forward: clamp(v.forward), turn: clamp(v.turn) } });
  }

  /** A zero movement command: the robot stops now. */
  stop(): Envelope {
    return this.send({ type: 'agent.movement', payload: { forward: 0, turn: 0 } });
  }

  /**
   * Stops the robot and cancels any navigation, and refuses `move` from this session until
   * `resetEmergencyStop()`. Sent even if the SDK already latched.
   */
  emergencyStop(): void {
    this.estopped = true;
    this.stop();
    this.send({ type: 'agent.navigation.cancel', payload: {} });
  }

  get emergencyStopped(): boolean {
    return this.estopped;
  }

  /**
   * Lifts this session's latch; if the robot's own e-stop latched (a driver's emergency
   * stop), asks the robot to reset it (`safety.estop_reset`).
   */
  async resetEmergencyStop(robotLatch = false): Promise<void> {
    this.estopped = false;
    if (robotLatch) {
      await this.request({ type: 'agent.config.update', payload: { key: 'safety.estop_reset', value: true } });
    }
  }

  /** Figures from `getStats`: RTT, inbound bitrate, frames/s, candidate types. */
  async stats(): Promise<SessionStats> {
    const report = await this.pc.getStats();
    const out: SessionStats = {};
    const byId = new Map<string, any>();
    report.forEach((s: any) => byId.set(s.id, s));
    let bytesIn = 0;
    for (const s of byId.values()) {
      if (s.type === 'candidate-pair' && (s.nominated || s.selected) && s.state === 'succeeded') {
        if (typeof s.currentRoundTripTime === 'number') out.rttMs = s.currentRoundTripTime * 1000;
        out.localCandidateType = byId.get(s.localCandidateId)?.candidateType;
        out.remoteCandidateType = byId.get(s.remoteCandidateId)?.candidateType;
        out.bytesReceived = s.bytesReceived;
        out.bytesSent = s.bytesSent;
      } else if (s.type === 'inbound-rtp' && s.kind === 'video') {
        out.framesPerSecond = s.framesPerSecond;
        out.frameWidth = s.frameWidth;
        out.frameHeight = s.frameHeight;
      }
      if (s.type === 'transport' && typeof s.bytesReceived === 'number') bytesIn += s.bytesReceived;
    }
    if (!bytesIn && out.bytesReceived) bytesIn = out.bytesReceived;
    const now = performance.now();
    if (this.lastStats && now > this.lastStats.at) {
      out.bitrateIn = Math.max(0, ((bytesIn - this.lastStats.bytes) * 8 * 1000) / (now - this.lastStats.at));
    }
    this.lastStats = { at: now, bytes: bytesIn };
    return out;
  }

  private setState(s: SessionState): void {
    if (this.state === s) return;
    this.state = s;
    this.emit('state', s, this.endReason);
  }

  private end(reason: string, tellServer = true): void {
    if (this.state === 'closed') return;
    this.endReason = reason;
    if (this.restartTimer) clearTimeout(this.restartTimer);
    this.stopWatch?.();
    for (const [id, p] of this.pending) {
      clearTimeout(p.timer);
      p.reject(new SignallingError('CLOSED', `session ended: ${reason}`, { reason }));
      this.pending.delete(id);
    }
    if (tellServer) {
      this.trySend({ type: 'signalling.disconnected', payload: { connectionId: this.id, reason: reason === 'failed' ? 'failed' : 'closed' } });
    }
    try { this.pc.close(); } catch { /* already closed */ }
    this.setState('closed');
  }

  /** Ends the session: the robot is told through the server, the peer connection closes. */
  async close(): Promise<void> {
    this.end('closed');
  }
}

/** A robot's enrolled key, as `GET /v1/robots/{id}/key` serves it. */
export interface RobotKey {
  robotId: string;
  /** `ed25519`, `ecdsa-p256` or `x509` (the certificate's key). */
  credential: string;
  /** `{kty: 'OKP', crv: 'Ed25519', x}` or `{kty: 'EC', crv: 'P-256', x, y}`, with `alg`. */
  jwk: { kty: string; crv: string; x: string; y?: string; alg?: string };
}

/** Checks one robot's signed messages. */
export interface RobotVerifier {
  /** The message (parsed) if `text` carries a valid signature of the robot; else throws an `INVALID_SIGNATURE` SignallingError. */
  verify(text: string): Promise<Envelope>;
  /**
   * One ARP frame as the gateway passed it on a socket opened with `?signed=<nonce>`: the
   * frame (parsed, `signature` included) if its top-level `signature` is the robot's valid
   * signature for this `nonce`; else throws an `INVALID_SIGNATURE` SignallingError
   * (`reason`: `unsigned`, `malformed`, `wrong_algorithm`, `wrong_robot`, `wrong_nonce`,
   * `bad_signature`; `details.id`: the frame's JSON-RPC id when it has one).
   */
  verifyArpFrame(text: string, nonce: string): Promise<any>;
}

/** What the server accepts as `?signed=`: 16 to 128 base64url characters. */
const ARP_NONCE = /^[A-Za-z0-9_-]{16,128}$/;

/**
 * A verifier of the robot's signed messages (robot-agent's `sign_replies`): `meta.signature`
 * is a detached compact JWS (RFC 7515 Appendix F), `BASE64URL(header) '..'
 * BASE64URL(signature)` with header `{alg, kid: robotId}`, over the message without that
 * field (and without `meta` if nothing else is in it) in canonical JSON: keys sorted at
 * every depth, no whitespace, numbers exactly as they were sent. ARP frames
 * (`verifyArpFrame`) carry the same JWS as a top-level `signature`, over the frame without
 * it, with `nonce` in the header as well.
 */
export async function robotVerifier(key: RobotKey, robotId = key.robotId): Promise<RobotVerifier> {
  const subtle = globalThis.crypto?.subtle;
  if (!subtle) throw new SignallingError('NOT_SUPPORTED', 'verifyRobot needs WebCrypto (crypto.subtle: a secure context)');
  const { kty, crv, x, y } = key.jwk ?? ({} as RobotKey['jwk']);
  let alg: string;
  let params: { name: string; namedCurve?: string; hash?: string };
  let imported: CryptoKey;
  try {
    if (kty === 'OKP' && crv === 'Ed25519') {
      alg = 'EdDSA';
      params = { name: 'Ed25519' };
      imported = await subtle.importKey('jwk', { kty, crv, x }, params, false, ['verify']);
    } else if (kty === 'EC' && crv === 'P-256') {
      alg = 'ES256';
      imported = await subtle.importKey('jwk', { kty, crv, x, y }, { name: 'ECDSA', namedCurve: 'P-256' }, false, ['verify']);
      params = { name: 'ECDSA', hash: 'SHA-256' };
    } else {
      throw new Error(`${kty}/${crv}`);
    }
  } catch (e) {
    throw new SignallingError('NOT_SUPPORTED', `cannot use robot ${robotId}'s key for verifyRobot: ${(e as Error).message ?? e}`);
  }

  /**
   * Checks the detached JWS `sigNode` over `content`; `where` names the field in messages.
   * With `nonce`, the header must carry exactly that nonce.
   */
  const check = async (
    sigNode: JsonNode,
    content: JsonNode,
    refuse: (reason: string, why: string) => SignallingError,
    where: string,
    nonce?: string,
  ): Promise<void> => {
    const jws = sigNode.t === 'v' && sigNode.raw.startsWith('"') ? (JSON.parse(sigNode.raw) as string) : '';
    const parts = jws.split('.');
    if (parts.length !== 3 || parts[1] !== '') throw refuse('malformed', `${where} is not a detached JWS`);
    let header: { alg?: unknown; kid?: unknown; nonce?: unknown };
    let signature: Uint8Array<ArrayBuffer>;
    try {
      header = JSON.parse(new TextDecoder().decode(fromBase64url(parts[0])));
      signature = fromBase64url(parts[2]);
    } catch {
      throw refuse('malformed', `${where} is not base64url`);
    }
    if (!header || typeof header !== 'object') throw refuse('malformed', `${where} has no JWS header`);
    if (header.alg !== alg) throw refuse('wrong_algorithm', `signed with ${String(header.alg)}, the robot's key is ${alg}`);
    if (header.kid !== robotId) throw refuse('wrong_robot', `signed as ${String(header.kid)}, not ${robotId}`);
    if (nonce !== undefined && header.nonce !== nonce) {
      throw refuse('wrong_nonce', `signed for ${header.nonce === undefined ? 'no connection' : 'another connection'} (nonce ${String(header.nonce)}, not ${nonce})`);
    }
    // The header's bytes as received: re-encoding it could change what was signed.
    const input = new TextEncoder().encode(`${parts[0]}.${toBase64url(new TextEncoder().encode(canonical(content)))}`);
    let ok = false;
    try {
      ok = await subtle.verify(params, imported, signature, input);
    } catch {
      ok = false;
    }
    if (!ok) throw refuse('bad_signature', `the signature of robot ${robotId} does not verify`);
  };

  return {
    async verify(text: string): Promise<Envelope> {
      let correlationId: string | undefined;
      const refuse = (reason: string, why: string) =>
        new SignallingError('INVALID_SIGNATURE', `message refused: ${why}`, { reason, robotId }, correlationId);
      let tree: JsonNode;
      try {
        tree = parseJsonKeepingNumbers(text);
      } catch (e) {
        throw refuse('malformed', `not JSON: ${(e as Error).message}`);
      }
      if (tree.t !== 'o') throw refuse('malformed', 'not a JSON object');
      const correlation = tree.entries.find(([k]) => k === 'correlationId')?.[1];
      if (correlation?.t === 'v' && correlation.raw.startsWith('"')) correlationId = JSON.parse(correlation.raw);
      const metaAt = tree.entries.findIndex(([k]) => k === 'meta');
      const meta = metaAt >= 0 ? tree.entries[metaAt][1] : undefined;
      const sigAt = meta?.t === 'o' ? meta.entries.findIndex(([k]) => k === 'signature') : -1;
      if (!meta || meta.t !== 'o' || sigAt < 0) throw refuse('unsigned', 'the robot did not sign it');
      // The signed content: the message without meta.signature (and without an empty meta).
      const rest = meta.entries.filter((_, i) => i !== sigAt);
      const content: JsonNode = {
        t: 'o',
        entries: tree.entries.flatMap(([k, v], i): [string, JsonNode][] =>
          i !== metaAt ? [[k, v]] : rest.length ? [[k, { t: 'o', entries: rest }]] : []),
      };
      await check(meta.entries[sigAt][1], content, refuse, 'meta.signature');
      return JSON.parse(text);
    },

    async verifyArpFrame(text: string, nonce: string): Promise<any> {
      if (typeof nonce !== 'string' || !ARP_NONCE.test(nonce)) {
        throw new SignallingError('BAD_REQUEST', 'verifyArpFrame needs the connection\'s nonce (16-128 base64url characters)');
      }
      const details: Record<string, unknown> = { robotId };
      const refuse = (reason: string, why: string) =>
        new SignallingError('INVALID_SIGNATURE', `ARP frame refused: ${why}`, { reason, ...details });
      let tree: JsonNode;
      try {
        tree = parseJsonKeepingNumbers(text);
      } catch (e) {
        throw refuse('malformed', `not JSON: ${(e as Error).message}`);
      }
      if (tree.t !== 'o') throw refuse('malformed', 'not a JSON object');
      const id = tree.entries.find(([k]) => k === 'id')?.[1];
      if (id?.t === 'v' && id.raw !== 'null' && id.raw !== 'true' && id.raw !== 'false') details.id = JSON.parse(id.raw);
      const sigAt = tree.entries.findIndex(([k]) => k === 'signature');
      if (sigAt < 0) throw refuse('unsigned', 'the robot did not sign it');
      const content: JsonNode = { t: 'o', entries: tree.entries.filter((_, i) => i !== sigAt) };
      await check(tree.entries[sigAt][1], content, refuse, 'signature', nonce);
      return JSON.parse(text);
    },
  };
}

/** A JSON value with every number kept as written (`v`: the raw token of a scalar). */
type JsonNode = { t: 'o'; entries: [string, JsonNode][] } | { t: 'a'; items: JsonNode[] } | { t: 'v'; raw: string };

/**
 * Parses JSON keeping each number's text: JavaScript would print `1.0` as `1` and `1e+21`
 * as `1e21`, while the robot signed them as it sent them. Refuses duplicate keys.
 */
function parseJsonKeepingNumbers(text: string): JsonNode {
  let i = 0;
  const ws = () => { while (i < text.length && ' \t\n\r'.includes(text[i])) i++; };
  const fail = (what: string): never => { throw new Error(`${what} at ${i}`); };
  const token = (re: RegExp): string => {
    re.lastIndex = i;
    const m = re.exec(text);
    if (!m) fail('unexpected token');
    i += m![0].length;
    return m![0];
  };
  const STRING = /"(?:[^"\\\u0000-\u001f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"/y;
  const SCALAR = /-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false|null/y;
  const value = (depth: number): JsonNode => {
    if (depth > 64) fail('nested too deep');
    ws();
    const c = text[i];
    if (c === '{') {
      i++;
      const entries: [string, JsonNode][] = [];
      const seen = new Set<string>();
      ws();
      if (text[i] === '}') { i++; return { t: 'o', entries }; }
      for (;;) {
        ws();
        const key = JSON.parse(token(STRING)) as string;
        if (seen.has(key)) fail(`duplicate key ${JSON.stringify(key)}`);
        seen.add(key);
        ws();
        if (text[i++] !== ':') fail('expected :');
        entries.push([key, value(depth + 1)]);
        ws();
        const next = text[i++];
        if (next === '}') return { t: 'o', entries };
        if (next !== ',') fail('expected , or }');
      }
    }
    if (c === '[') {
      i++;
      const items: JsonNode[] = [];
      ws();
      if (text[i] === ']') { i++; return { t: 'a', items }; }
      for (;;) {
        items.push(value(depth + 1));
        ws();
        const next = text[i++];
        if (next === ']') return { t: 'a', items };
        if (next !== ',') fail('expected , or ]');
      }
    }
    // Strings in the form JSON.stringify (and serde_json) write them.
    if (c === '"') return { t: 'v', raw: JSON.stringify(JSON.parse(token(STRING))) };
    return { t: 'v', raw: token(SCALAR) };
  };
  const root = value(0);
  ws();
  if (i !== text.length) fail('trailing characters');
  return root;
}

/** Canonical JSON: keys sorted by code point (as the robot's UTF-8 byte order) at every depth, no whitespace. */
function canonical(node: JsonNode): string {
  if (node.t === 'v') return node.raw;
  if (node.t === 'a') return `[${node.items.map(canonical).join(',')}]`;
  const sorted = [...node.entries].sort(([a], [b]) => compareCodePoints(a, b));
  return `{${sorted.map(([k, v]) => `${JSON.stringify(k)}:${canonical(v)}`).join(',')}}`;
}

function compareCodePoints(a: string, b: string): number {
  const x = Array.from(a, (c) => c.codePointAt(0)!);
  const y = Array.from(b, (c) => c.codePointAt(0)!);
  for (let i = 0; i < Math.min(x.length, y.length); i++) if (x[i] !== y[i]) return x[i] - y[i];
  return x.length - y.length;
}

function toBase64url(bytes: Uint8Array): string {
  let s = '';
  for (const b of bytes) s += String.fromCharCode(b);
  return btoa(s).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}

function fromBase64url(text: string): Uint8Array<ArrayBuffer> {
  if (!/^[A-Za-z0-9_-]*$/.test(text)) throw new Error('not base64url');
  const s = atob(text.replace(/-/g, '+').replace(/_/g, '/') + '='.repeat((4 - (text.length % 4)) % 4));
  return Uint8Array.from(s, (c) => c.charCodeAt(0));
}

function clamp(x: number): number {
  return Number.isFinite(x) ? Math.max(-1, Math.min(1, x)) : 0;
}

// ---------------------------------------------------------------------------------------
// ARP: a program's session with a robot through the server's gateway
// (`/v1/robots/{robotId}/arp`), JSON-RPC 2.0 frames of ARP 0.1.0 as the robot serves them.
// ---------------------------------------------------------------------------------------

export const ARP_PROTOCOL_VERSION = '0.1.0';
/** The SDK's name and version in `arp.initialize`'s `clientInfo`. */
export const SDK_INFO = { name: '@signalling/client', version: '0.1.0' } as const;
/** The largest frame the gateway accepts (64 KiB); a larger one is refused before sending. */
export const ARP_MAX_FRAME_BYTES = 64 * 1024;

/** The error codes of ARP 0.1.0 (JSON-RPC's and the spec's own). */
export const ArpErrorCode = {
  ParseError: -32700,
  InvalidRequest: -32600,
  MethodNotFound: -32601,
  InvalidParams: -32602,
  InternalError: -32603,
  SafetyViolation: -40001,
  PreconditionFailed: -40002,
  ToolNotFound: -40003,
  ToolBusy: -40004,
  ConfirmationTimeout: -40005,
  ConfirmationDenied: -40006,
  EmergencyStopped: -40007,
  ContextNotFound: -40008,
  NotInitialized: -40009,
} as const;

/**
 * Every failure of an ARP session: a JSON-RPC error from the robot or the gateway, or one
 * of the SDK's own. `reason` is `data.reason` when there is one: the gateway's
 * `forbidden`, `robot_busy` (owners see `data.lockedBy`), `robot_offline`, `rate_limited`,
 * `session_ended` (`data.cause` says why); the SDK's `closed`, `timeout`, `aborted`,
 * `unauthorized`, `no_grant`, `connect_failed`, `too_large`, and with `verifyRobot`
 * `invalid_signature` (a frame refused: `data.signatureReason` says why) and
 * `not_supported` (the robot's key could not be had or used: `data.cause`) (all `-32603`
 * but `too_large`, `-32600`, and a full pending map, `-40001` `rate_limited`). A failed
 * tool call has `data: {callId, state: "failed", …}`.
 */
export class ArpError extends Error {
  readonly code: number;
  readonly data?: any;
  readonly reason?: string;
  /**
   * With `verifyRobot` only: `true` when the robot signed the error frame (checked),
   * `false` for an unsigned error the gateway itself sent (`robot_busy`, `robot_offline`,
   * `forbidden`, `rate_limited`, …). Undefined without `verifyRobot` and for the SDK's own
   * errors.
   */
  readonly signedByRobot?: boolean;
  constructor(code: number, message: string, data?: any, signedByRobot?: boolean) {
    super(message);
    this.name = 'ArpError';
    this.code = code;
    this.data = data;
    this.reason = typeof data?.reason === 'string' ? data.reason : undefined;
    if (signedByRobot !== undefined) this.signedByRobot = signedByRobot;
  }
  /** The call a failed `arp.callTool` names. */
  get callId(): string | undefined {
    return typeof this.data?.callId === 'string' ? this.data.callId : undefined;
  }
  /** From a JSON-RPC `error` object (`signedByRobot`: see the property). */
  static from(error: any, signedByRobot?: boolean): ArpError {
    const code = Number.isInteger(error?.code) ? error.code : ArpErrorCode.InternalError;
    return new ArpError(code, String(error?.message ?? 'ARP error'), error?.data, signedByRobot);
  }
  /** One of the SDK's own failures (`closed`, `timeout`, …). */
  static local(reason: string, message: string, extra: Record<string, unknown> = {}, code: number = ArpErrorCode.InternalError): ArpError {
    return new ArpError(code, message, { reason, ...extra });
  }
}

export type ArpSafetyLevel = 'normal' | 'elevated' | 'critical';

export interface ArpSafety {
  level: ArpSafetyLevel;
  requiresConfirmation: boolean;
  reversible: boolean;
  description: string;
}

/** A Physical Tool (`arp.listTools`). */
export interface ArpTool {
  name: string;
  description: string;
  /** JSON Schema of the arguments. */
  parameters: Record<string, any>;
  safety: ArpSafety;
  preconditions?: any[];
  effects?: any[];
  /** Seconds. */
  estimatedDuration?: number;
}

export interface ArpContextSource {
  name: string;
  description: string;
  dataType: 'pose' | 'joints' | 'pointcloud' | 'image' | 'imu' | 'custom' | string;
  coordinateFrame?: string;
  updateRate?: number;
  schema?: Record<string, any>;
}

export interface ArpConstraint {
  name: string;
  type: string;
  enabled: boolean;
  priority: number;
  parameters: Record<string, any>;
  violation_action: 'reject' | 'clamp' | 'emergency_stop' | string;
}

export interface ArpInitializeParams {
  protocolVersion?: string;
  clientInfo?: { name: string; version: string };
  capabilities?: Record<string, unknown>;
}

export interface ArpInitializeResult {
  protocolVersion: string;
  serverInfo: { name: string; version: string; robotModel?: string; robotType?: string };
  capabilities: { tools: boolean; context: boolean; constraints: boolean; planning: boolean; confirmation: boolean };
}

/** How a tool call ended well: `completed` (with the tool's `result`) or `cancelled`. */
export interface ArpCallResult {
  callId: string;
  state: 'completed' | 'cancelled';
  result?: Record<string, any>;
}

/** `arp.toolProgress`: a running call's progress (0..1). */
export interface ArpToolProgress {
  callId: string;
  progress: number;
  message: string;
  state: 'running';
}

/** `arp.contextUpdate`. */
export interface ArpContextUpdate {
  name: string;
  timestamp: string;
  data: any;
}

/** The robot's `arp.requestConfirmation`: a person should approve `action`. */
export interface ArpConfirmationRequest {
  action: string;
  safetyLevel: ArpSafetyLevel;
  details: { tool: string; arguments: Record<string, any> };
  /** Seconds the robot waits before it refuses on its own. */
  timeout: number;
}

/** What `onConfirmation` resolves to; `confirmedBy` defaults to the token's subject. */
export interface ArpConfirmationAnswer {
  confirmed: boolean;
  confirmedBy?: string;
}

export interface CallToolOptions {
  /** 1–128 characters: a retry with the same key never runs the tool twice. */
  idempotencyKey?: string;
  /** This call's progress (also emitted as the session's `progress` event). */
  onProgress?: (p: ArpToolProgress) => void;
  /**
   * Aborting sends `arp.cancelTool` for this call as soon as its `callId` is known (from
   * its first progress); the promise then settles with the robot's answer (`cancelled`).
   * Aborted before it was sent, the call is not sent and rejects (`aborted`).
   */
  signal?: AbortSignal;
  /** Give up waiting after this long (default: wait for the call to end). */
  timeoutMs?: number;
}

export interface ArpSessionOptions {
  /** Send `arp.initialize` on connect (default true); else call `initialize()` yourself. */
  initialize?: boolean;
  /** Extra `arp.initialize` params (`clientInfo`, `capabilities`). */
  initializeParams?: ArpInitializeParams;
  /**
   * Answers the robot's `arp.requestConfirmation`. Given, the session declares
   * `capabilities.confirmation: true` and the robot asks this program; absent, it does not,
   * and people approve in the console. A throw or a rejection answers `confirmed: false`.
   */
  onConfirmation?: (request: ArpConfirmationRequest) => Promise<ArpConfirmationAnswer> | ArpConfirmationAnswer;
  /** Default timeout of requests other than `callTool` (default 15 s). */
  timeoutMs?: number;
  /** How long the socket may take to open (default 10 s). */
  connectTimeoutMs?: number;
  /** Requests that may wait for an answer at once (default 256, as the gateway). */
  maxPending?: number;
  /**
   * Accept only frames the robot signed for this connection: the socket opens with
   * `?signed=<nonce>` (16 fresh random bytes, base64url), and each frame the robot sends
   * must carry a `signature` (a detached JWS by the robot's enrolled key, with this nonce)
   * that checks. Unsigned error frames are taken as the gateway's own
   * (`ArpError.signedByRobot === false`); any other unsigned or badly signed frame is not
   * delivered: the session emits `error` (reason `invalid_signature`) and the request it
   * answers rejects with it. The robot's key is fetched while the socket opens; connecting
   * fails (`not_supported`) if it cannot be had or used. Needs WebCrypto with Ed25519 or
   * ECDSA P-256.
   */
  verifyRobot?: boolean;
}

export interface ArpConnectOptions extends ArpSessionOptions {
  /** The gateway's URL, `wss://host/v1/robots/{robotId}/arp` (see `arpUrl`). */
  url: string;
  /** A client token or a JWT (as for `/ws`). */
  token: string | (() => string | Promise<string>);
  /** Who approves confirmations (`confirmedBy`); default `"sdk"`. */
  subject?: string;
  WebSocket?: typeof WebSocket;
  /**
   * To tell a refused token or a missing grant from a network failure, and with
   * `verifyRobot` to get the robot's key.
   */
  fetch?: typeof fetch;
  /**
   * With `verifyRobot`: the robot's key (or its promise); fetched from the server
   * (`GET /v1/robots/{robotId}/key` with the token) when absent.
   */
  robotKey?: RobotKey | Promise<RobotKey>;
}

/** `wss://host/ws` (or `https://host`) → `wss://host/v1/robots/{robotId}/arp`. */
export function arpUrl(serverUrl: string, robotId: string): string {
  const u = new URL(serverUrl);
  const scheme = u.protocol === 'wss:' || u.protocol === 'https:' ? 'wss:' : 'ws:';
  return `${scheme}//${u.host}/v1/robots/${encodeURIComponent(robotId)}/arp`;
}

interface ArpPending {
  method: string;
  resolve: (result: any) => void;
  reject: (e: ArpError) => void;
  timer: ReturnType<typeof setTimeout> | null;
}

interface ArpCall {
  requestId: number;
  callId?: string;
  onProgress?: (p: ArpToolProgress) => void;
  cancelWanted: boolean;
}

export type ArpSessionState = 'connecting' | 'open' | 'closed';

/**
 * A program's ARP session with one robot through the server's gateway: the robot's tools,
 * context and constraints, with the same grant, role, control lock and record as a person.
 *
 * Events: `progress` (ArpToolProgress, every call's), `context` (ArpContextUpdate),
 * `emergencyStop` (the robot's `arp.emergencyStop` notification params), `notification`
 * (method, params: every notification), `error` (ArpError the gateway sent without an id,
 * e.g. frames dropped as `rate_limited`; with `verifyRobot`, every refused frame:
 * `invalid_signature`), `close` ({code, reason}).
 */
export class ArpSession extends Emitter {
  state: ArpSessionState = 'connecting';
  readonly url: string;
  /** The robot's `arp.initialize` answer, once initialized. */
  server: ArpInitializeResult | null = null;
  /** The close code and reason of the socket, once closed. */
  closeCode: number | null = null;
  closeReason = '';
  private ws: WebSocket;
  private nextId = 1;
  private pending = new Map<string, ArpPending>();
  private calls: ArpCall[] = [];
  private subscriptions = new Map<string, (u: ArpContextUpdate) => void>();
  private readonly opts: ArpSessionOptions & { timeoutMs: number; maxPending: number };
  private readonly confirmedBy: string;

  /** With `verifyRobot`: this connection's nonce (`?signed=`); else null. */
  readonly nonce: string | null;
  /** With `verifyRobot`: the robot whose signature frames must carry; else null. */
  readonly robotId: string | null;
  /** With `verifyRobot`: the robot's key, and the queue that keeps frames in order. */
  private verifier: Promise<RobotVerifier> | null;
  private inbound: Promise<void> = Promise.resolve();

  private constructor(url: string, ws: WebSocket, opts: ArpSessionOptions, subject?: string, signed?: ArpSigned) {
    super();
    this.url = url;
    this.ws = ws;
    this.opts = { timeoutMs: 15_000, maxPending: 256, ...opts };
    this.confirmedBy = subject || 'sdk';
    this.nonce = signed?.nonce ?? null;
    this.robotId = signed?.robotId ?? null;
    this.verifier = signed?.verifier ?? null;
    ws.onmessage = (ev) => this.frame(ev.data);
  }

  /**
   * Opens the gateway's socket (the token as a `bearer.` subprotocol, else `?token=`) and,
   * unless `initialize: false`, initializes. Rejects with an ArpError: `unauthorized`,
   * `no_grant` (the server answers 403 before the upgrade), `connect_failed`, `timeout`, or
   * the robot's or gateway's refusal of `arp.initialize` (`robot_offline`, `robot_busy`);
   * with `verifyRobot`, `not_supported` when the robot's key cannot be had or used
   * (`data.cause`: the API's code such as `FORBIDDEN` or `NOT_FOUND`, or `NOT_SUPPORTED`).
   */
  static async connect(options: ArpConnectOptions): Promise<ArpSession> {
    const token = typeof options.token === 'function' ? await options.token() : options.token;
    const WS = options.WebSocket ?? globalThis.WebSocket;
    const url = options.url;
    let signed: ArpSigned | undefined;
    let target = url;
    if (options.verifyRobot) {
      const robotId = arpRobotId(url);
      const nonce = toBase64url(crypto.getRandomValues(new Uint8Array(16)));
      const verifier = (async () => {
        if (!robotId) throw new SignallingError('NOT_SUPPORTED', `no robot id in ${url}`);
        const key = await (options.robotKey ?? fetchRobotKey(url, robotId, token, options.fetch));
        return robotVerifier(key, robotId);
      })().catch((e) => {
        const cause = e instanceof SignallingError ? e : new SignallingError('NETWORK', String((e as Error)?.message ?? e));
        throw ArpError.local('not_supported', `verifyRobot: cannot check robot ${robotId}'s signatures: ${cause.message}`,
          { cause: cause.code, ...(cause.details?.status !== undefined ? { status: cause.details.status } : {}), robotId });
      });
      // Awaited below; marked handled so a failure before then is no unhandled rejection.
      verifier.catch(() => {});
      signed = { nonce, robotId, verifier };
      target = `${url}${url.includes('?') ? '&' : '?'}signed=${nonce}`;
    }
    const ws = tokenSafeForProtocol(token)
      ? new WS(target, [`bearer.${token}`])
      : new WS(`${target}${target.includes('?') ? '&' : '?'}token=${encodeURIComponent(token)}`);
    const session = new ArpSession(url, ws, options, options.subject, signed);
    await new Promise<void>((resolve, reject) => {
      let settled = false;
      const fail = (e: ArpError) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        ws.onopen = null;
        ws.onclose = null;
        try { ws.close(); } catch { /* not open */ }
        session.state = 'closed';
        reject(e);
      };
      const timer = setTimeout(() => fail(ArpError.local('timeout', `the ARP gateway at ${url} did not open`)), options.connectTimeoutMs ?? 10_000);
      ws.onopen = () => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        session.state = 'open';
        ws.onclose = (ev) => session.socketClosed(ev.code, ev.reason ?? '');
        resolve();
      };
      ws.onclose = (ev) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        session.state = 'closed';
        // The browser hides the upgrade's status (401, 403): ask the HTTP API.
        diagnoseArp(url, token, options.fetch, ev.code).then(reject, () =>
          reject(ArpError.local('connect_failed', `the ARP gateway at ${url} closed (${ev.code})`, { code: ev.code })));
      };
      ws.onerror = () => { /* onclose follows and decides */ };
      // Without the robot's key nothing can be checked: no need to wait for the socket.
      signed?.verifier.catch(fail);
    });
    if (signed) {
      try {
        await signed.verifier;
      } catch (e) {
        session.close();
        throw e;
      }
    }
    if (options.initialize !== false) {
      try {
        await session.initialize(options.initializeParams);
      } catch (e) {
        session.close();
        throw e;
      }
    }
    return session;
  }

  /**
   * `arp.initialize`: opens the session on the gateway (the control lock for an operator
   * or owner). `capabilities.confirmation` is true exactly when `onConfirmation` is given.
   */
  async initialize(params: ArpInitializeParams = this.opts.initializeParams ?? {}): Promise<ArpInitializeResult> {
    const result: ArpInitializeResult = await this.request('arp.initialize', {
      protocolVersion: params.protocolVersion ?? ARP_PROTOCOL_VERSION,
      clientInfo: params.clientInfo ?? { ...SDK_INFO },
      capabilities: { planning: false, ...params.capabilities, confirmation: !!this.opts.onConfirmation },
    });
    this.server = result;
    return result;
  }

  /**
   * Sends one JSON-RPC request and resolves with its `result`; an `error` rejects as an
   * ArpError. Ids are unique in the session (1, 2, …).
   */
  request(method: string, params: Record<string, unknown> = {}, timeoutMs: number | null = this.opts.timeoutMs): Promise<any> {
    return this.start(method, params, timeoutMs).promise;
  }

  /** Sends a request; its id (null if it was not sent) and the promise of its result. */
  private start(method: string, params: Record<string, unknown>, timeoutMs: number | null): { id: number | null; promise: Promise<any> } {
    let sentId: number | null = null;
    const promise = new Promise((resolve, reject) => {
      // An e-stop is never held back by the pending limit.
      if (this.pending.size >= this.opts.maxPending && method !== 'arp.emergencyStop') {
        reject(ArpError.local('rate_limited', `${this.pending.size} requests already wait for an answer`, { limit: this.opts.maxPending }, ArpErrorCode.SafetyViolation));
        return;
      }
      const id = this.nextId++;
      const key = String(id);
      try {
        this.sendFrame({ jsonrpc: '2.0', id, method, params });
      } catch (e) {
        reject(e);
        return;
      }
      const timer = timeoutMs == null ? null : setTimeout(() => {
        this.pending.delete(key);
        this.calls = this.calls.filter((c) => c.requestId !== id);
        reject(ArpError.local('timeout', `no answer to ${method} within ${timeoutMs} ms`));
      }, timeoutMs);
      this.pending.set(key, { method, resolve, reject, timer });
      sentId = id;
    });
    return { id: sentId, promise };
  }

  /** The robot's tools. */
  async listTools(): Promise<ArpTool[]> {
    return (await this.request('arp.listTools')).tools ?? [];
  }

  /**
   * Calls a tool and resolves when the call ends: `{callId, state: "completed" |
   * "cancelled", result?}`. A failed call rejects with an ArpError whose `data` is
   * `{callId, state: "failed", …}`. Progress goes to `onProgress` and the `progress` event.
   *
   * The robot names a call's `callId` only in its progress and its answer, so a progress
   * with a new `callId` is taken as the oldest running call's that has none yet
   * (robot-agent runs one motion call at a time).
   */
  callTool(name: string, args: Record<string, unknown> = {}, options: CallToolOptions = {}): Promise<ArpCallResult> {
    const { signal } = options;
    if (signal?.aborted) return Promise.reject(ArpError.local('aborted', `${name} was aborted before it was sent`));
    const params: Record<string, unknown> = { name, arguments: args };
    if (options.idempotencyKey !== undefined) params.idempotencyKey = options.idempotencyKey;
    const { id, promise } = this.start('arp.callTool', params, options.timeoutMs ?? null);
    if (id === null) return promise;
    const call: ArpCall = { requestId: id, onProgress: options.onProgress, cancelWanted: false };
    this.calls.push(call);
    const onAbort = () => {
      call.cancelWanted = true;
      if (call.callId) this.cancelSoon(call.callId);
    };
    signal?.addEventListener('abort', onAbort, { once: true });
    const done = () => {
      signal?.removeEventListener('abort', onAbort);
      this.calls = this.calls.filter((c) => c !== call);
    };
    return promise.then(
      (r) => { done(); return r as ArpCallResult; },
      (e) => { done(); throw e; },
    );
  }

  /** `arp.cancelTool`: the call itself then answers `state: "cancelled"`. */
  cancelTool(callId: string): Promise<{ callId: string; cancelled: boolean }> {
    return this.request('arp.cancelTool', { callId });
  }

  /** The robot's context sources. */
  async listContext(): Promise<ArpContextSource[]> {
    return (await this.request('arp.listContext')).sources ?? [];
  }

  /**
   * Subscribes to a context source; `onUpdate` gets every `arp.contextUpdate` of it (at
   * most `maxRate` per second). Subscribing again to `name` replaces the earlier handler.
   */
  async subscribeContext(name: string, options: { maxRate?: number } = {}, onUpdate?: (u: ArpContextUpdate) => void): Promise<{ name: string; subscribed: boolean }> {
    const before = this.subscriptions.get(name);
    if (onUpdate) this.subscriptions.set(name, onUpdate);
    const params: Record<string, unknown> = { name };
    if (options.maxRate !== undefined) params.maxRate = options.maxRate;
    try {
      return await this.request('arp.subscribeContext', params);
    } catch (e) {
      if (before) this.subscriptions.set(name, before);
      else this.subscriptions.delete(name);
      throw e;
    }
  }

  async unsubscribeContext(name: string): Promise<{ name: string; subscribed: boolean }> {
    this.subscriptions.delete(name);
    return this.request('arp.unsubscribeContext', { name });
  }

  async listConstraints(): Promise<ArpConstraint[]> {
    return (await this.request('arp.listConstraints')).constraints ?? [];
  }

  getConstraint(name: string): Promise<ArpConstraint> {
    return this.request('arp.getConstraint', { name });
  }

  /** `arp.setWorkspace` (operator or owner): `{name, bounds: {type: "box", min, max, frame?}}`. */
  setWorkspace(params: { name: string; bounds: Record<string, unknown>; objects?: unknown[] }): Promise<{ name: string; applied: boolean }> {
    return this.request('arp.setWorkspace', params);
  }

  /**
   * Stops the robot and latches its e-stop (anyone may, viewers too); every running call
   * ends failed `-40007`. Never held back by the pending limit.
   */
  emergencyStop(reason = 'emergency stop from @signalling/client'): Promise<{ stopped: boolean }> {
    return this.request('arp.emergencyStop', { reason });
  }

  /** `arp.shutdown` (calls cancelled, control released), then `close()`. */
  async shutdown(): Promise<void> {
    try {
      await this.request('arp.shutdown');
    } finally {
      this.close();
    }
  }

  /**
   * Closes the socket (code 1000): the gateway ends the session, the robot cancels its
   * calls and releases control. Whatever still waits rejects with `closed`.
   */
  close(): void {
    if (this.state === 'closed') return;
    try { this.ws.close(1000); } catch { /* already closed */ }
    this.closed(1000, 'closed by the client');
  }

  private sendFrame(frame: Record<string, unknown>): void {
    if (this.state !== 'open' || this.ws.readyState !== 1) {
      throw ArpError.local('closed', 'the ARP session is not open', { code: this.closeCode });
    }
    const text = JSON.stringify(frame);
    // Characters are at most 3 bytes per UTF-16 unit: check the exact size only when near.
    if (text.length * 3 > ARP_MAX_FRAME_BYTES && new TextEncoder().encode(text).length > ARP_MAX_FRAME_BYTES) {
      throw ArpError.local('too_large', `the frame is over ${ARP_MAX_FRAME_BYTES} bytes`, { limit: ARP_MAX_FRAME_BYTES }, ArpErrorCode.InvalidRequest);
    }
    this.ws.send(text);
  }

  private trySend(frame: Record<string, unknown>): void {
    try {
      this.sendFrame(frame);
    } catch {
      // Closed meanwhile: the robot stops waiting on its own.
    }
  }

  private cancelSoon(callId: string): void {
    this.cancelTool(callId).catch((e) => this.emit('error', e));
  }

  private frame(data: unknown): void {
    if (this.verifier) {
      const verifier = this.verifier;
      // One at a time, in arrival order: verification is asynchronous.
      this.inbound = this.inbound.then(() => this.verified(verifier, data)).catch(() => {});
      return;
    }
    const m = parseFrame(data);
    if (m) this.handle(m);
  }

  /** `verifyRobot`: handles a frame only if the robot signed it for this connection. */
  private async verified(key: Promise<RobotVerifier>, data: unknown): Promise<void> {
    const m = parseFrame(data);
    if (!m || this.closeCode !== null) return;
    let verifier: RobotVerifier;
    try {
      verifier = await key;
    } catch {
      return; // connect fails with the reason; nothing can be checked
    }
    let signed = false;
    // The gateway's own errors (robot_busy, robot_offline, forbidden, …) are not signed.
    if (!isGatewayError(m)) {
      try {
        await verifier.verifyArpFrame(data as string, this.nonce!);
        signed = true;
      } catch (e) {
        if (this.closeCode === null) this.refused(m, e);
        return;
      }
    }
    if (this.closeCode === null) this.handle(m, signed);
  }

  /** A frame that failed `verifyRobot`: not handled; what it answers rejects, `error` is emitted. */
  private refused(m: any, e: unknown): void {
    const sig = e instanceof SignallingError ? e : new SignallingError('INVALID_SIGNATURE', String(e), { reason: 'bad_signature' });
    const id = m.id === undefined || m.id === null ? undefined : m.id;
    const err = ArpError.local('invalid_signature', sig.message, {
      signatureReason: sig.reason ?? 'bad_signature',
      robotId: this.robotId,
      ...(id !== undefined ? { id } : {}),
      ...(typeof m.method === 'string' ? { method: m.method } : {}),
    });
    const p = typeof m.method !== 'string' && id !== undefined ? this.pending.get(String(id)) : undefined;
    if (p) {
      this.pending.delete(String(id));
      if (p.timer) clearTimeout(p.timer);
      p.reject(err);
    }
    this.emit('error', err);
  }

  /** One frame, checked if need be: `signed` tells whether the robot's signature was on it. */
  private handle(m: any, signed?: boolean): void {
    if (typeof m.method === 'string') {
      if (m.id !== undefined && m.id !== null) void this.robotRequest(m.id, m.method, m.params ?? {});
      else this.notification(m.method, m.params ?? {});
      return;
    }
    const p = m.id === undefined || m.id === null ? undefined : this.pending.get(String(m.id));
    if (!p) {
      if (m.error) this.emit('error', ArpError.from(m.error, signed));
      return;
    }
    this.pending.delete(String(m.id));
    if (p.timer) clearTimeout(p.timer);
    if (m.error) p.reject(ArpError.from(m.error, signed));
    else p.resolve(m.result);
  }

  private notification(method: string, params: any): void {
    if (method === 'arp.toolProgress') {
      const progress = params as ArpToolProgress;
      let call = this.calls.find((c) => c.callId === progress.callId);
      if (!call) {
        call = this.calls.find((c) => c.callId === undefined);
        if (call) {
          call.callId = progress.callId;
          if (call.cancelWanted) this.cancelSoon(progress.callId);
        }
      }
      if (call?.onProgress) callSafely(call.onProgress, progress);
      this.emit('progress', progress);
    } else if (method === 'arp.contextUpdate') {
      const update = params as ArpContextUpdate;
      const handler = this.subscriptions.get(update.name);
      if (handler) callSafely(handler, update);
      this.emit('context', update);
    } else if (method === 'arp.emergencyStop') {
      this.emit('emergencyStop', params);
    }
    this.emit('notification', method, params);
  }

  /** A request of the robot: confirmations go to `onConfirmation`; nothing else is served. */
  private async robotRequest(id: unknown, method: string, params: any): Promise<void> {
    if (method !== 'arp.requestConfirmation') {
      this.trySend({ jsonrpc: '2.0', id, error: { code: ArpErrorCode.MethodNotFound, message: `${method} is not served by this client` } });
      return;
    }
    let confirmed = false;
    let confirmedBy = this.confirmedBy;
    const handler = this.opts.onConfirmation;
    if (handler) {
      try {
        const answer = await handler(params as ArpConfirmationRequest);
        confirmed = answer?.confirmed === true;
        if (typeof answer?.confirmedBy === 'string' && answer.confirmedBy) confirmedBy = answer.confirmedBy;
      } catch {
        confirmed = false;
      }
    } else {
      confirmedBy = `${this.confirmedBy} (no confirmation handler; refused)`;
    }
    this.trySend({ jsonrpc: '2.0', id, result: { confirmed, confirmedBy, timestamp: new Date().toISOString() } });
  }

  /** The gateway closed the socket: with `verifyRobot`, after the frames still being checked. */
  private socketClosed(code: number, reason: string): void {
    if (this.verifier) this.inbound = this.inbound.then(() => this.closed(code, reason));
    else this.closed(code, reason);
  }

  /** The socket closed: everything waiting rejects with `closed`. */
  private closed(code: number, reason: string): void {
    if (this.closeCode !== null) return;
    this.state = 'closed';
    this.closeCode = code;
    this.closeReason = reason;
    for (const [key, p] of this.pending) {
      if (p.timer) clearTimeout(p.timer);
      this.pending.delete(key);
      p.reject(ArpError.local('closed', `the ARP session closed before ${p.method} was answered (${code}${reason ? `: ${reason}` : ''})`, { code, closeReason: reason }));
    }
    this.calls = [];
    this.subscriptions.clear();
    this.emit('close', { code, reason });
  }
}

function callSafely<T>(fn: (v: T) => void, v: T): void {
  try {
    fn(v);
  } catch (e) {
    setTimeout(() => { throw e; });
  }
}

/** `verifyRobot`'s state of one ARP connection. */
interface ArpSigned {
  nonce: string;
  robotId: string;
  verifier: Promise<RobotVerifier>;
}

/** A frame as a JSON object, or null. */
function parseFrame(data: unknown): any {
  if (typeof data !== 'string') return null;
  let m: any;
  try {
    m = JSON.parse(data);
  } catch {
    return null;
  }
  return m && typeof m === 'object' && !Array.isArray(m) ? m : null;
}

/** An error response as the gateway itself sends it: `{jsonrpc, id, error}` and nothing else. */
function isGatewayError(m: any): boolean {
  return !!m.error && typeof m.error === 'object' && Object.keys(m).every((k) => k === 'jsonrpc' || k === 'id' || k === 'error');
}

/** The robot id in a gateway URL, `…/v1/robots/{robotId}/arp`. */
function arpRobotId(url: string): string {
  const path = new URL(url).pathname.split('/');
  return path[1] === 'v1' && path[2] === 'robots' && path[4] === 'arp' ? decodeURIComponent(path[3] ?? '') : '';
}

/** `GET /v1/robots/{robotId}/key` on the gateway's server with the token. */
async function fetchRobotKey(url: string, robotId: string, token: string, f: typeof fetch | undefined): Promise<RobotKey> {
  f ??= globalThis.fetch;
  if (!f) throw new SignallingError('NOT_SUPPORTED', 'no fetch to get the robot key with');
  const response = await f(`${httpBase(url)}/v1/robots/${encodeURIComponent(robotId)}/key`, { headers: { authorization: `Bearer ${token}` } });
  const body = await response.json().catch(() => null);
  if (response.status >= 400) {
    throw new SignallingError(body?.error ?? 'HTTP_ERROR', body?.message ?? `HTTP ${response.status}`, { status: response.status });
  }
  return body;
}

/** Why the gateway's socket did not open: a refused token, no grant, or the network. */
async function diagnoseArp(url: string, token: string, f: typeof fetch | undefined, code: number): Promise<ArpError> {
  const failed = ArpError.local('connect_failed', `the ARP gateway at ${url} closed (${code})`, { code });
  f ??= globalThis.fetch;
  if (!f) return failed;
  const base = httpBase(url);
  const robotId = decodeURIComponent(new URL(url).pathname.split('/')[3] ?? '');
  const headers = { authorization: `Bearer ${token}` };
  const robots = await f(`${base}/v1/me/robots`, { headers });
  if (robots.status === 401) return ArpError.local('unauthorized', 'the token was refused', { status: 401 });
  if (robots.status === 200) {
    const list = await robots.json().catch(() => null);
    if (Array.isArray(list) && !list.some((r: any) => r?.robotId === robotId)) {
      return ArpError.local('no_grant', `no grant for robot ${robotId}`, { status: 403, robotId });
    }
  }
  return failed;
}
