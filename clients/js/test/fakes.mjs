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
