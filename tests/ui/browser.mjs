// Headless Chromium through playwright-core, using Debian's /usr/bin/chromium (Playwright's own
// browser downloads are not used), plus the small waiting helpers the tests share.

import assert from 'node:assert/strict';
import { mkdirSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

export const chromiumBin = process.env.CHROMIUM_BIN || '/usr/bin/chromium';
export const screenshotDir = path.join(path.dirname(fileURLToPath(import.meta.url)), 'screenshots');

// Every wait is generous: the machine is small and shared with builds.
export const TIMEOUT_MS = 15_000;

export function launch() {
  return chromium.launch({ executablePath: chromiumBin, args: ['--disable-dev-shm-usage'] });
}

// A fresh context (own sessionStorage) and page at the dashboard's `url`. Browser errors and
// failed requests are collected in page.problems so a test can assert there were none.
// `beforeLoad(page)` runs before the dashboard loads (to install a fake clock, say).
export async function openPage(
  browser,
  url,
  { viewport = { width: 1280, height: 800 }, colorScheme = 'light', hash = '#/', beforeLoad = null } = {},
) {
  const context = await browser.newContext({ viewport, colorScheme, reducedMotion: 'reduce' });
  context.setDefaultTimeout(TIMEOUT_MS);
  const page = await context.newPage();
  page.problems = [];
  page.on('pageerror', (err) => page.problems.push(`page error: ${err.message}`));
  page.on('console', (msg) => {
    if (msg.type() === 'error') page.problems.push(`console error: ${msg.text()}`);
  });
  await beforeLoad?.(page);
  await page.goto(`${url}/${hash}`);
  return page;
}

export async function screenshot(page, name, options = {}) {
  mkdirSync(screenshotDir, { recursive: true });
  const file = path.join(screenshotDir, `${name}.png`);
  await page.screenshot({ path: file, ...options });
  return file;
}

// Polls `fn` (async, in the test process) until it returns a truthy value; fails with `what`.
export async function eventually(what, fn, timeoutMs = TIMEOUT_MS) {
  const deadline = Date.now() + timeoutMs;
  let last;
  for (;;) {
    try {
      last = await fn();
      if (last) return last;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what} (last: ${last})`);
    await new Promise((r) => setTimeout(r, 200));
  }
}
