// A Node.js `ws` relay that routes {"to": id} messages by id: what many teams write first.
// Usage: node node-relay.js PORT. Connect as ws://127.0.0.1:PORT/?id=ID; acks {"welcome": ID}.
'use strict';
const { WebSocketServer } = require('ws');

const port = Number(process.argv[2] || 9002);
const peers = new Map();
const server = new WebSocketServer({ host: '127.0.0.1', port, maxPayload: 64 * 1024 });

server.on('connection', (socket, request) => {
  const id = new URL(request.url, 'http://relay').searchParams.get('id') || '';
  peers.set(id, socket);
  socket.send(JSON.stringify({ welcome: id }));
  socket.on('message', (data) => {
    let to;
    try {
      to = JSON.parse(data).to;
    } catch {
      return;
    }
    const peer = peers.get(to);
    if (peer) peer.send(data, { binary: false });
  });
  socket.on('close', () => {
    if (peers.get(id) === socket) peers.delete(id);
  });
});
server.on('listening', () => console.log(`listening 127.0.0.1:${port}`));
