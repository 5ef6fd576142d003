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
 * SDK's own (`TIMEOUT`, `CLOSED`, `NETWORK`, `INVALID_SIGNATURE` for a robot message
 * refused by `verifyRobot`); `reason` is `details.reason` when the
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
    /** The token's subject, once `me()` told it. */
    subject: string | null;
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
     * Opens an ARP session with a robot through this server's gateway
     * (`/v1/robots/{robotId}/arp`, this client's token) and initializes it. With
     * `onConfirmation`, the robot's confirmation requests come to this program, answered
     * with `confirmedBy` = this token's subject (asked of `GET /v1/me` if not known yet).
     * With `verifyRobot`, only frames the robot signed for this connection are taken (its key
     * from `robotKey(robotId)`).
     */
    connectArp(robotId: string, options?: ArpSessionOptions & {
        subject?: string;
    }): Promise<ArpSession>;
    /**
     * The robots this subject holds grants on, with online state and role
     * (`GET /v1/me/robots`; the server pushes no presence events, so poll it).
     */
    robots(): Promise<MyRobot[]>;
    /**
     * The robot's enrolled public key as a JWK (`GET /v1/robots/{robotId}/key`; the admin or
     * any holder of a grant on the robot): what `verifyRobot` checks its replies against.
     */
    robotKey(robotId: string): Promise<RobotKey>;
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
    /** With `verifyRobot`: the robot's key, and the queue that keeps messages in order. */
    private robotKey;
    private inbound;
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
    /** `verifyRobot`: delivers a message only if the robot's signature on it checks. */
    private verified;
    private deliver;
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
/** A robot's enrolled key, as `GET /v1/robots/{id}/key` serves it. */
export interface RobotKey {
    robotId: string;
    /** `ed25519`, `ecdsa-p256` or `x509` (the certificate's key). */
    credential: string;
    /** `{kty: 'OKP', crv: 'Ed25519', x}` or `{kty: 'EC', crv: 'P-256', x, y}`, with `alg`. */
    jwk: {
        kty: string;
        crv: string;
        x: string;
        y?: string;
        alg?: string;
    };
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
/**
 * A verifier of the robot's signed messages (robot-agent's `sign_replies`): `meta.signature`
 * is a detached compact JWS (RFC 7515 Appendix F), `BASE64URL(header) '..'
 * BASE64URL(signature)` with header `{alg, kid: robotId}`, over the message without that
 * field (and without `meta` if nothing else is in it) in canonical JSON: keys sorted at
 * every depth, no whitespace, numbers exactly as they were sent. ARP frames
 * (`verifyArpFrame`) carry the same JWS as a top-level `signature`, over the frame without
 * it, with `nonce` in the header as well.
 */
export declare function robotVerifier(key: RobotKey, robotId?: string): Promise<RobotVerifier>;
export declare const ARP_PROTOCOL_VERSION = "0.1.0";
/** The SDK's name and version in `arp.initialize`'s `clientInfo`. */
export declare const SDK_INFO: {
    readonly name: "@signalling/client";
    readonly version: "0.1.0";
};
/** The largest frame the gateway accepts (64 KiB); a larger one is refused before sending. */
export declare const ARP_MAX_FRAME_BYTES: number;
/** The error codes of ARP 0.1.0 (JSON-RPC's and the spec's own). */
export declare const ArpErrorCode: {
    readonly ParseError: -32700;
    readonly InvalidRequest: -32600;
    readonly MethodNotFound: -32601;
    readonly InvalidParams: -32602;
    readonly InternalError: -32603;
    readonly SafetyViolation: -40001;
    readonly PreconditionFailed: -40002;
    readonly ToolNotFound: -40003;
    readonly ToolBusy: -40004;
    readonly ConfirmationTimeout: -40005;
    readonly ConfirmationDenied: -40006;
    readonly EmergencyStopped: -40007;
    readonly ContextNotFound: -40008;
    readonly NotInitialized: -40009;
};
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
export declare class ArpError extends Error {
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
    constructor(code: number, message: string, data?: any, signedByRobot?: boolean);
    /** The call a failed `arp.callTool` names. */
    get callId(): string | undefined;
    /** From a JSON-RPC `error` object (`signedByRobot`: see the property). */
    static from(error: any, signedByRobot?: boolean): ArpError;
    /** One of the SDK's own failures (`closed`, `timeout`, …). */
    static local(reason: string, message: string, extra?: Record<string, unknown>, code?: number): ArpError;
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
    clientInfo?: {
        name: string;
        version: string;
    };
    capabilities?: Record<string, unknown>;
}
export interface ArpInitializeResult {
    protocolVersion: string;
    serverInfo: {
        name: string;
        version: string;
        robotModel?: string;
        robotType?: string;
    };
    capabilities: {
        tools: boolean;
        context: boolean;
        constraints: boolean;
        planning: boolean;
        confirmation: boolean;
    };
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
    details: {
        tool: string;
        arguments: Record<string, any>;
    };
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
export declare function arpUrl(serverUrl: string, robotId: string): string;
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
export declare class ArpSession extends Emitter {
    state: ArpSessionState;
    readonly url: string;
    /** The robot's `arp.initialize` answer, once initialized. */
    server: ArpInitializeResult | null;
    /** The close code and reason of the socket, once closed. */
    closeCode: number | null;
    closeReason: string;
    private ws;
    private nextId;
    private pending;
    private calls;
    private subscriptions;
    private readonly opts;
    private readonly confirmedBy;
    /** With `verifyRobot`: this connection's nonce (`?signed=`); else null. */
    readonly nonce: string | null;
    /** With `verifyRobot`: the robot whose signature frames must carry; else null. */
    readonly robotId: string | null;
    /** With `verifyRobot`: the robot's key, and the queue that keeps frames in order. */
    private verifier;
    private inbound;
    private constructor();
    /**
     * Opens the gateway's socket (the token as a `bearer.` subprotocol, else `?token=`) and,
     * unless `initialize: false`, initializes. Rejects with an ArpError: `unauthorized`,
     * `no_grant` (the server answers 403 before the upgrade), `connect_failed`, `timeout`, or
     * the robot's or gateway's refusal of `arp.initialize` (`robot_offline`, `robot_busy`);
     * with `verifyRobot`, `not_supported` when the robot's key cannot be had or used
     * (`data.cause`: the API's code such as `FORBIDDEN` or `NOT_FOUND`, or `NOT_SUPPORTED`).
     */
    static connect(options: ArpConnectOptions): Promise<ArpSession>;
    /**
     * `arp.initialize`: opens the session on the gateway (the control lock for an operator
     * or owner). `capabilities.confirmation` is true exactly when `onConfirmation` is given.
     */
    initialize(params?: ArpInitializeParams): Promise<ArpInitializeResult>;
    /**
     * Sends one JSON-RPC request and resolves with its `result`; an `error` rejects as an
     * ArpError. Ids are unique in the session (1, 2, …).
     */
    request(method: string, params?: Record<string, unknown>, timeoutMs?: number | null): Promise<any>;
    /** Sends a request; its id (null if it was not sent) and the promise of its result. */
    private start;
    /** The robot's tools. */
    listTools(): Promise<ArpTool[]>;
    /**
     * Calls a tool and resolves when the call ends: `{callId, state: "completed" |
     * "cancelled", result?}`. A failed call rejects with an ArpError whose `data` is
     * `{callId, state: "failed", …}`. Progress goes to `onProgress` and the `progress` event.
     *
     * The robot names a call's `callId` only in its progress and its answer, so a progress
     * with a new `callId` is taken as the oldest running call's that has none yet
     * (robot-agent runs one motion call at a time).
     */
    callTool(name: string, args?: Record<string, unknown>, options?: CallToolOptions): Promise<ArpCallResult>;
    /** `arp.cancelTool`: the call itself then answers `state: "cancelled"`. */
    cancelTool(callId: string): Promise<{
        callId: string;
        cancelled: boolean;
    }>;
    /** The robot's context sources. */
    listContext(): Promise<ArpContextSource[]>;
    /**
     * Subscribes to a context source; `onUpdate` gets every `arp.contextUpdate` of it (at
     * most `maxRate` per second). Subscribing again to `name` replaces the earlier handler.
     */
    subscribeContext(name: string, options?: {
        maxRate?: number;
    }, onUpdate?: (u: ArpContextUpdate) => void): Promise<{
        name: string;
        subscribed: boolean;
    }>;
    unsubscribeContext(name: string): Promise<{
        name: string;
        subscribed: boolean;
    }>;
    listConstraints(): Promise<ArpConstraint[]>;
    getConstraint(name: string): Promise<ArpConstraint>;
    /** `arp.setWorkspace` (operator or owner): `{name, bounds: {type: "box", min, max, frame?}}`. */
    setWorkspace(params: {
        name: string;
        bounds: Record<string, unknown>;
        objects?: unknown[];
    }): Promise<{
        name: string;
        applied: boolean;
    }>;
    /**
     * Stops the robot and latches its e-stop (anyone may, viewers too); every running call
     * ends failed `-40007`. Never held back by the pending limit.
     */
    emergencyStop(reason?: string): Promise<{
        stopped: boolean;
    }>;
    /** `arp.shutdown` (calls cancelled, control released), then `close()`. */
    shutdown(): Promise<void>;
    /**
     * Closes the socket (code 1000): the gateway ends the session, the robot cancels its
     * calls and releases control. Whatever still waits rejects with `closed`.
     */
    close(): void;
    private sendFrame;
    private trySend;
    private cancelSoon;
    private frame;
    /** `verifyRobot`: handles a frame only if the robot signed it for this connection. */
    private verified;
    /** A frame that failed `verifyRobot`: not handled; what it answers rejects, `error` is emitted. */
    private refused;
    /** One frame, checked if need be: `signed` tells whether the robot's signature was on it. */
    private handle;
    private notification;
    /** A request of the robot: confirmations go to `onConfirmation`; nothing else is served. */
    private robotRequest;
    /** The gateway closed the socket: with `verifyRobot`, after the frames still being checked. */
    private socketClosed;
    /** The socket closed: everything waiting rejects with `closed`. */
    private closed;
}
export {};
