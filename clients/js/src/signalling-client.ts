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
 * SDK's own (`TIMEOUT`, `CLOSED`, `NETWORK`); `reason` is `details.reason` when the
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
  me(): Promise<{ subject: string; expiresAt: string | null }> {
    return this.http('/v1/me');
  }

  /**
   * The robots this subject holds grants on, with online state and role
   * (`GET /v1/me/robots`; the server pushes no presence events, so poll it).
   */
  robots(): Promise<MyRobot[]> {
    return this.http('/v1/me/robots');
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
    await this.offer(false);
    await opened;
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
    const m = parse(data);
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

function clamp(x: number): number {
  return Number.isFinite(x) ? Math.max(-1, Math.min(1, x)) : 0;
}
