// The dashboard under test: the real broker, and the URL to open it at.
//
// By default the browser talks to the broker directly, so the tests check the files embedded in
// the binary. With JOBBROKER_UI_DIR=<repo>/ui the files are served from that folder instead and
// every other request is passed to the broker: for working on ui/ without relinking the broker.

import { existsSync, readFileSync } from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { startBroker } from './broker.mjs';

const TYPES = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.ico': 'image/x-icon',
  '.json': 'application/json',
};

// Starts a broker (options as startBroker's); resolves with the broker's fields plus `url`,
// the dashboard's address, and a `stop()` that ends both.
export async function startDashboard(options) {
  const broker = await startBroker(options);
  const uiDir = process.env.JOBBROKER_UI_DIR;
  if (!uiDir) return broker;
  let proxy;
  try {
    proxy = await serveFolder(path.resolve(uiDir), broker.http);
  } catch (err) {
    await broker.stop();
    throw err;
  }
  return {
    ...broker,
    url: proxy.url,
    async stop() {
      proxy.server.closeAllConnections();
      await new Promise((resolve) => proxy.server.close(resolve));
      await broker.stop();
    },
  };
}

function serveFolder(dir, brokerAddress) {
  const colon = brokerAddress.lastIndexOf(':');
  const host = brokerAddress.slice(0, colon);
  const port = Number(brokerAddress.slice(colon + 1));
  const server = http.createServer((req, res) => {
    const pathname = new URL(req.url, 'http://x').pathname;
    const name = pathname === '/' ? 'index.html' : pathname.slice(1);
    const file = path.join(dir, name);
    if (req.method === 'GET' && /^[\w.-]+$/.test(name) && existsSync(file)) {
      res.writeHead(200, { 'Content-Type': TYPES[path.extname(name)] ?? 'application/octet-stream', 'Cache-Control': 'no-store' });
      res.end(readFileSync(file));
      return;
    }
    const upstream = http.request({ host, port, method: req.method, path: req.url, headers: req.headers }, (up) => {
      res.writeHead(up.statusCode, up.headers);
      up.pipe(res);
    });
    upstream.on('error', (err) => {
      res.writeHead(502);
      res.end(String(err));
    });
    req.pipe(upstream);
  });
  server.keepAliveTimeout = 1000;
  return new Promise((resolve) => {
    server.listen(0, '127.0.0.1', () => resolve({ server, url: `http://127.0.0.1:${server.address().port}` }));
  });
}
