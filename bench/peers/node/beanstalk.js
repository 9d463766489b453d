'use strict';
// A small beanstalkd client over one TCP connection: use, watch, ignore, put, reserve, delete.
//
// beanstalkd answers the commands of a connection strictly in order, so requests are pipelined:
// each call writes its command at once and queues a waiter, and every reply line settles the
// oldest waiter. Writes made in the same tick are corked into one send, so 64 puts in flight
// become a few large writes rather than 64 small ones. A `reserve` blocks the connection until a
// job comes, so a consumer keeps its own connection.

const net = require('node:net');

const kCrlf = Buffer.from('\r\n');

class Connection {
  // Use Connect(); the constructor takes an already connected socket.
  constructor(socket) {
    this.socket = socket;
    this.waiters = []; // {resolve, reject, what}, oldest first
    this.buf = null; // bytes received and not yet parsed
    this.corked = false;
    this.error = null;
    socket.setNoDelay(true);
    socket.on('data', (chunk) => this.OnData(chunk));
    socket.on('error', (err) => this.Fail(err));
    socket.on('close', () => this.Fail(new Error('beanstalkd connection closed')));
  }

  static Connect(host, port, timeoutMs = 5000) {
    return new Promise((resolve, reject) => {
      const socket = net.connect({ host, port });
      const timer = setTimeout(() => {
        socket.destroy();
        reject(new Error(`connect to ${host}:${port} timed out`));
      }, timeoutMs);
      socket.once('error', (err) => {
        clearTimeout(timer);
        reject(err);
      });
      socket.once('connect', () => {
        clearTimeout(timer);
        socket.removeAllListeners('error');
        resolve(new Connection(socket));
      });
    });
  }

  // Resolves to the tube name.
  async Use(tube) {
    const line = await this.Command(`use ${tube}\r\n`, 'use');
    Expect(line, 'USING');
    return tube;
  }

  async Watch(tube) {
    Expect(await this.Command(`watch ${tube}\r\n`, 'watch'), 'WATCHING');
  }

  async Ignore(tube) {
    Expect(await this.Command(`ignore ${tube}\r\n`, 'ignore'), 'WATCHING');
  }

  // Resolves to the new job's id. `body` is a Buffer or a latin1 string.
  async Put(body, { priority = 1024, delay = 0, ttr = 60 } = {}) {
    const data = typeof body === 'string' ? Buffer.from(body, 'latin1') : body;
    const line = await this.Command(
      [`put ${priority} ${delay} ${ttr} ${data.length}\r\n`, data, kCrlf],
      'put',
    );
    return Number(Expect(line, 'INSERTED')[1]);
  }

  // Resolves to {id, body} once a job is reserved for this connection.
  async Reserve() {
    const reply = await this.Command('reserve\r\n', 'reserve');
    const parts = Expect(reply.line, 'RESERVED');
    return { id: Number(parts[1]), body: reply.body };
  }

  async Delete(id) {
    Expect(await this.Command(`delete ${id}\r\n`, 'delete'), 'DELETED');
  }

  Close() {
    this.socket.destroy();
  }

  // Writes `parts` (strings and Buffers) and resolves to the reply: its first line, or
  // {line, body} for a reply that carries a body.
  Command(parts, what) {
    if (this.error) return Promise.reject(this.error);
    if (!this.corked) {
      this.corked = true;
      this.socket.cork();
      process.nextTick(() => {
        this.corked = false;
        this.socket.uncork();
      });
    }
    for (const p of Array.isArray(parts) ? parts : [parts]) this.socket.write(p);
    return new Promise((resolve, reject) => this.waiters.push({ resolve, reject, what }));
  }

  OnData(chunk) {
    this.buf = this.buf && this.buf.length ? Buffer.concat([this.buf, chunk]) : chunk;
    let at = 0;
    while (at < this.buf.length) {
      const eol = this.buf.indexOf(kCrlf, at);
      if (eol < 0) break;
      const line = this.buf.toString('latin1', at, eol);
      let next = eol + 2;
      let reply = line;
      // Replies with a body end their first line with its length: RESERVED <id> <bytes>.
      if (line.startsWith('RESERVED ') || line.startsWith('FOUND ') || line.startsWith('OK ')) {
        const bytes = Number(line.slice(line.lastIndexOf(' ') + 1));
        if (next + bytes + 2 > this.buf.length) break; // body not all here yet
        reply = { line, body: this.buf.subarray(next, next + bytes) };
        next += bytes + 2;
      }
      at = next;
      const waiter = this.waiters.shift();
      if (!waiter) {
        this.Fail(new Error(`unexpected reply from beanstalkd: ${line}`));
        return;
      }
      waiter.resolve(reply);
    }
    // Keep only the unparsed tail; copy it so a small tail does not pin a large chunk.
    this.buf = at >= this.buf.length ? null : Buffer.from(this.buf.subarray(at));
  }

  Fail(err) {
    if (!this.error) this.error = err;
    const waiters = this.waiters;
    this.waiters = [];
    for (const w of waiters) w.reject(new Error(`${w.what}: ${err.message}`));
  }
}

// Splits a reply line and checks its first word; throws with the server's answer otherwise
// (e.g. JOB_TOO_BIG, DRAINING, OUT_OF_MEMORY, NOT_FOUND).
function Expect(line, word) {
  const text = typeof line === 'string' ? line : line.line;
  const parts = text.split(' ');
  if (parts[0] !== word) throw new Error(`beanstalkd answered "${text}", expected ${word}`);
  return parts;
}

module.exports = { Connection };
