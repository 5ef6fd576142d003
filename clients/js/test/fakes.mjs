// Fakes of the browser APIs the SDK uses: a WebSocket the test plays the server on, and a
// peer connection whose data channel the test opens. They record what the SDK sends.

export class FakeSocket {
  static instances = [];
  constructor(url, protocols) {
    this.url = url;
    this.protocols = protocols;
    this.readyState = 0;
    this.sent = [];
    FakeSocket.instances.push(this);
    // Opens on the next tick, like a browser socket.
    queueMicrotask(() => {
      if (this.readyState === 0) this.readyState = 1;
    });
  }
  static reset() { FakeSocket.instances = []; }
  static last() { return FakeSocket.instances[FakeSocket.instances.length - 1]; }
  send(data) {
    if (this.readyState !== 1) throw new Error('send on a closed socket');
    this.sent.push(JSON.parse(data));
  }
  close(code = 1000) { this.drop(code); }
  /** The server sends one envelope. */
  deliver(m) {
    this.readyState = 1;
    this.onmessage?.({ data: JSON.stringify({ version: '0.5', id: `srv-${Math.random()}`, timestamp: new Date().toISOString(), ...m }) });
  }
  welcome(connectionId = 'conn-1') {
    this.deliver({ type: 'signalling.welcome', payload: { connectionId, iceServers: [{ urls: ['stun:127.0.0.1:3478'] }] } });
  }
  /** The connection ends (server side or network). */
  drop(code = 1006) {
    if (this.readyState === 3) return;
    this.readyState = 3;
    this.onclose?.({ code });
  }
  sentOf(type) { return this.sent.filter((m) => m.type === type); }
}

export class FakeChannel {
  constructor(label) {
    this.label = label;
    this.readyState = 'connecting';
    this.sent = [];
  }
  send(data) {
    if (this.readyState !== 'open') throw new Error('channel not open');
    this.sent.push(JSON.parse(data));
  }
  open() { this.readyState = 'open'; this.onopen?.(); }
  /** The robot sends one envelope. */
  deliver(m) {
    this.onmessage?.({ data: JSON.stringify({ version: '0.5', id: `rbt-${Math.random()}`, timestamp: new Date().toISOString(), ...m }) });
  }
  sentOf(type) { return this.sent.filter((m) => m.type === type); }
}

export class FakePeer {
  static instances = [];
  constructor(config) {
    this.config = config;
    this.transceivers = [];
    this.offers = [];
    this.remote = [];
    this.candidates = [];
    this.iceConnectionState = 'new';
    this.closed = false;
    FakePeer.instances.push(this);
  }
  static reset() { FakePeer.instances = []; }
  static last() { return FakePeer.instances[FakePeer.instances.length - 1]; }
  createDataChannel(label) { this.dc = new FakeChannel(label); return this.dc; }
  addTransceiver(kind, init) { this.transceivers.push({ kind, ...init }); }
  async createOffer(options) {
    this.offers.push(options ?? {});
    return { type: 'offer', sdp: `v=0 fake offer ${this.offers.length}` };
  }
  async setLocalDescription(d) { this.localDescription = d; }
  async setRemoteDescription(d) { this.remote.push(d); }
  async addIceCandidate(c) { this.candidates.push(c); }
  async getStats() {
    return new Map([
      ['p', { id: 'p', type: 'candidate-pair', nominated: true, state: 'succeeded', currentRoundTripTime: 0.012, localCandidateId: 'l', remoteCandidateId: 'r', bytesReceived: 1000, bytesSent: 500 }],
      ['l', { id: 'l', type: 'local-candidate', candidateType: 'host' }],
      ['r', { id: 'r', type: 'remote-candidate', candidateType: 'relay' }],
      ['v', { id: 'v', type: 'inbound-rtp', kind: 'video', framesPerSecond: 30, frameWidth: 640, frameHeight: 480 }],
    ]);
  }
  setIce(state) { this.iceConnectionState = state; this.oniceconnectionstatechange?.(); }
  close() { this.closed = true; }
}

/** A fetch answering `GET /v1/me` with the given status. */
export function fakeFetch(status) {
  const calls = [];
  const f = async (url, init) => {
    calls.push({ url, init });
    return { status, json: async () => ({ error: status === 401 ? 'UNAUTHORIZED' : 'OK', message: 'invalid token' }) };
  };
  f.calls = calls;
  return f;
}

/** Polls `fn` until it returns a truthy value (bounded), without fixed sleeps. */
export async function until(what, fn, timeoutMs = 2000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 2));
  }
}

/**
 * The ARP gateway's socket, the test playing the gateway and the robot behind it: frames
 * are bare JSON-RPC 2.0 objects both ways. Opens on the next tick unless refused first.
 */
export class FakeArpSocket {
  static instances = [];
  /** When set, the socket closes with this code instead of opening (a refused upgrade). */
  static refuseWith = null;
  constructor(url, protocols) {
    this.url = url;
    this.protocols = protocols;
    this.readyState = 0;
    this.sent = [];
    this.closedWith = null;
    FakeArpSocket.instances.push(this);
    const refuse = FakeArpSocket.refuseWith;
    queueMicrotask(() => {
      if (this.readyState !== 0) return;
      if (refuse !== null) return this.end(refuse, '');
      this.readyState = 1;
      this.onopen?.();
    });
  }
  static reset() { FakeArpSocket.instances = []; FakeArpSocket.refuseWith = null; }
  static last() { return FakeArpSocket.instances[FakeArpSocket.instances.length - 1]; }
  send(data) {
    if (this.readyState !== 1) throw new Error('send on a closed socket');
    this.sent.push(JSON.parse(data));
  }
  /** The client closes: no close event comes back in a browser until the handshake ends; here, at once. */
  close(code = 1000) { this.closedWith = code; this.end(code, ''); }
  /** One frame from the gateway. */
  frame(f) { this.onmessage?.({ data: JSON.stringify(f) }); }
  notify(method, params) { this.frame({ jsonrpc: '2.0', method, params }); }
  answer(request, result) { this.frame({ jsonrpc: '2.0', id: request.id, result }); }
  fail(request, code, message, data) {
    this.frame({ jsonrpc: '2.0', id: request.id, error: { code, message, ...(data ? { data } : {}) } });
  }
  /** The gateway closes the socket. */
  end(code = 1000, reason = '') {
    if (this.readyState === 3) return;
    this.readyState = 3;
    this.onclose?.({ code, reason });
  }
  requests(method) { return this.sent.filter((m) => m.method === method && m.id !== undefined); }
  /** Waits for the client's next request of `method` not yet seen by the test. */
  async next(method) {
    this.seen ??= new Set();
    return until(method, () => {
      const r = this.sent.find((m) => m.method === method && !this.seen.has(m));
      if (r) this.seen.add(r);
      return r;
    });
  }
  /** Answers the client's initialize as robot-agent does. */
  async initialized(capabilities = {}) {
    const req = await this.next('arp.initialize');
    this.answer(req, {
      protocolVersion: '0.1.0',
      serverInfo: { name: 'robot-agent', version: '0.1.0', robotType: 'mobile_base' },
      capabilities: { tools: true, context: true, constraints: true, planning: false, confirmation: true, ...capabilities },
    });
    return req;
  }
}
