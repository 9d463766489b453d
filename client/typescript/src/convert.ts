import { Duration } from "./gen/google/protobuf/duration.js";

/** Milliseconds as a google.protobuf.Duration; undefined stays unset. */
export function durationFromMs(ms: number | undefined): Duration | undefined {
  if (ms === undefined) return undefined;
  if (!Number.isFinite(ms)) throw new RangeError(`duration must be a finite number of ms, got ${ms}`);
  const sign = ms < 0 ? -1 : 1;
  const abs = Math.abs(ms);
  const seconds = Math.floor(abs / 1000);
  const nanos = Math.round((abs - seconds * 1000) * 1e6);
  return { seconds: sign * seconds, nanos: sign * nanos };
}

/** A google.protobuf.Duration in milliseconds (0 when unset). */
export function durationToMs(d: Duration | undefined): number {
  if (!d) return 0;
  return d.seconds * 1000 + d.nanos / 1e6;
}

/** Job payloads and results: bytes as they are, strings as UTF-8, anything else as JSON. */
export type Payload = Uint8Array | string | unknown;

export function encodePayload(value: Payload): Buffer {
  if (value === undefined || value === null) return Buffer.alloc(0);
  if (value instanceof Uint8Array) return asBuffer(value);
  if (typeof value === "string") return Buffer.from(value, "utf8");
  return Buffer.from(JSON.stringify(value), "utf8");
}

export function asBuffer(bytes: Uint8Array): Buffer {
  return Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
}
