export declare const PROTOCOL_VERSION = "0.5";
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
export type Outgoing = {
    type: string;
    payload?: any;
    id?: string;
    correlationId?: string;
    version?: string;
};
/**
 * Every failure the SDK reports. `code` is the server's or the robot's code
 * (`FORBIDDEN`, `UNAUTHORIZED`, `CONNECTION_FAILED`, `MOVEMENT_FAILED`, …) or one of the
 * SDK's own (`TIMEOUT`, `CLOSED`, `NETWORK`); `reason` is `details.reason` when the
 * server gave one (`no_grant`, `robot_busy`, `robot_offline`, …).
 */
export declare class SignallingError extends Error {
    readonly code: string;
    readonly reason?: string;
    readonly details?: Record<string, unknown>;
    readonly correlationId?: string;
    constructor(code: string, message: string, details?: Record<string, unknown>, correlationId?: string);
    /** From a `signalling.error` or `agent.error` envelope. */
    static from(m: Envelope): SignallingError;
}
type Listener = (...args: any[]) => void;
/** A minimal event emitter: `on` returns a function that removes the listener. */
declare class Emitter {
    private listeners;
    on(event: string, fn: Listener): () => void;
    off(event: string, fn: Listener): void;
    protected emit(event: string, ...args: unknown[]): void;
}
/**
 * A random v4 UUID. `crypto.randomUUID` needs a secure context; a console served over
 * plain http from a private address is not one, `getRandomValues` works everywhere.
 */
export declare function uuid(): string;
export declare function envelope(m: Outgoing): Envelope;
/** Full jitter: a random delay up to the exponential backoff for this attempt. */
export declare function backoffDelay(attempt: number, initialMs: number, maxMs: number, random?: () => number): number;
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
/** `wss://host:1/ws` → `https://host:1`: where the HTTP API of that server lives. */
export declare function httpBase(wsUrl: string): string;
/**
 * The connection to the signalling server. `SignallingClient.connect` resolves once the
 * server's welcome arrived; afterwards the socket reconnects on its own (backoff with
 * jitter, every URL in turn), and open sessions keep their peer connections meanwhile.
 *
 * Events: `state` (ClientState), `error` (SignallingError), `message` (every envelope
 * from the server), `welcome` (the welcome's payload, after each (re)connect).
 */
export declare class SignallingClient extends Emitter {
    state: ClientState;
    /** This socket's id from the latest welcome. */
    connectionId: string | null;
    iceServers: RTCIceServer[];
    private ws;
    private urls;
    private urlIndex;
    private attempt;
    private pending;
    private sessions;
    private reconnectTimer;
    readonly opts: Required<Pick<ConnectOptions, 'reconnect' | 'initialDelayMs' | 'maxDelayMs' | 'connectTimeoutMs' | 'timeoutMs'>> & ConnectOptions;
    private constructor();
    /**
     * Connects and resolves after the server's welcome. Each URL is tried once, in turn; if
     * none answers, rejects with the last error (`UNAUTHORIZED` when the server refused the
     * token).
     */
    static connect(opts: ConnectOptions): Promise<SignallingClient>;
    get url(): string;
    private setState;
    private token;
    /** One connection attempt to the current URL: resolves on the welcome. */
    private open;
    private diagnose;
    private welcome;
    /** The socket dropped after it was open: fail what waits on it, reconnect. */
    private lost;
    private scheduleReconnect;
    private dispatch;
    /** Sends one envelope on the socket; throws `CLOSED` when it is not open. */
    send(m: Outgoing): Envelope;
    /**
     * Sends and waits for the server's message whose `correlationId` is its id (a
     * `signalling.error` rejects). Resolves `null` after `quietMs` when the message expects
     * no answer on success (an offer's answer arrives by session id, not correlation).
     */
    request(m: Outgoing, timeoutMs?: number): Promise<Envelope>;
    /** Watches for a `signalling.error` correlated with `id` (an offer's refusal). */
    watchError(id: string, onError: (e: SignallingError) => void): () => void;
    /** GET on the server's HTTP API with this client's token; HTTP errors become SignallingErrors. */
    private http;
    /** Who the token names: `{subject, expiresAt}` (`GET /v1/me`). */
    me(): Promise<{
        subject: string;
        expiresAt: string | null;
    }>;
    /**
     * The robots this subject holds grants on, with online state and role
     * (`GET /v1/me/robots`; the server pushes no presence events, so poll it).
     */
    robots(): Promise<MyRobot[]>;
    /** Round trip to the server in milliseconds (`signalling.ping`). */
    ping(): Promise<number>;
    /**
     * Opens a WebRTC session with a robot. Resolves when the data channel is open; rejects
     * with the server's refusal (`FORBIDDEN`/`no_grant`, `FORBIDDEN`/`robot_busy`,
     * `CONNECTION_FAILED`/`robot_offline`, …) or `TIMEOUT`.
     */
    openSession(robotId: string, options?: SessionOptions): Promise<Session>;
    /** Ends every session and closes the socket for good. */
    close(): Promise<void>;
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
export declare class Session extends Emitter {
    private client;
    private options;
    readonly id: string;
    readonly robotId: string;
    state: SessionState;
    /** Why it closed: `closed` (by us), the server's `signalling.disconnected` reason, `failed`… */
    endReason: string | null;
    /** The robot's video, once a track arrived. */
    video: MediaStream | null;
    /** The robot's `agent.capabilities` payload, once it arrived. */
    capabilities: any;
    readonly pc: RTCPeerConnection;
    private dc;
    private pending;
    private estopped;
    private restartTimer;
    private restarting;
    private lastStats;
    private remoteSet;
    private earlyCandidates;
    private stopWatch;
    constructor(client: SignallingClient, robotId: string, options: SessionOptions, PC: typeof RTCPeerConnection);
    /** Sends the offer; resolves when the data channel is open. */
    start(timeoutMs: number): Promise<void>;
    private offer;
    private fail;
    /** A signalling message about this session (routed by `payload.connectionId`). */
    signal(m: Envelope): Promise<void>;
    private iceChanged;
    /** Re-offers with fresh ICE credentials on the same session id. */
    private iceRestart;
    signallingLost(): void;
    /** The socket is back: re-offer on the same session id. A server started with
     * `--session-resume-secs` hands the session to this new socket (the robot never noticed);
     * the restart also brings fresh candidates if the network moved meanwhile. */
    signallingBack(): void;
    private fromRobot;
    private trySend;
    /** Sends one message on the data channel; returns the envelope sent. */
    send(m: Outgoing): Envelope;
    /** Sends and resolves with the robot's reply (`correlationId` = the message's id). */
    request(m: Outgoing, timeoutMs?: number): Promise<Envelope>;
    /**
     * One movement command (`agent.movement`), values clamped to [-1, 1]. Repeat it (about
     * 10 Hz) while driving: the robot stops on its own when commands stop coming. Ignored
     * after `emergencyStop()` until `resetEmergencyStop()`.
     */
    move(v: {
        forward: number;
        turn: number;
    }): Envelope | null;
    /** A zero movement command: the robot stops now. */
    stop(): Envelope;
    /**
     * Stops the robot and cancels any navigation, and refuses `move` from this session until
     * `resetEmergencyStop()`. Sent even if the SDK already latched.
     */
    emergencyStop(): void;
    get emergencyStopped(): boolean;
    /**
     * Lifts this session's latch; if the robot's own e-stop latched (a driver's emergency
     * stop), asks the robot to reset it (`safety.estop_reset`).
     */
    resetEmergencyStop(robotLatch?: boolean): Promise<void>;
    /** Figures from `getStats`: RTT, inbound bitrate, frames/s, candidate types. */
    stats(): Promise<SessionStats>;
    private setState;
    private end;
    /** Ends the session: the robot is told through the server, the peer connection closes. */
    close(): Promise<void>;
}
export {};
