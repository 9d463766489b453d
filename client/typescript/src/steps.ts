import { CompletedStep, StepCheckpoint } from "./gen/jobbroker/v1/steps.js";

/**
 * The durable steps of one attempt: those the job arrived with (from its checkpoint) plus those
 * finished in this attempt. The checkpoint is a serialized jobbroker.v1.StepCheckpoint whose
 * results are UTF-8 JSON, the same encoding every jobbroker worker helper uses.
 */
export class StepLog {
  private readonly steps: CompletedStep[];
  private readonly byName = new Map<string, Uint8Array>();
  private readonly usedThisAttempt = new Set<string>();

  private constructor(steps: CompletedStep[]) {
    this.steps = steps;
    for (const s of steps) this.byName.set(s.name, s.result);
  }

  /** Reads a job's checkpoint; throws a clear error if it is not a StepCheckpoint. */
  static parse(checkpoint: Uint8Array): StepLog {
    if (checkpoint.length === 0) return new StepLog([]);
    const notOurs = (why: string) =>
      new Error(
        `the job's checkpoint (${checkpoint.length} bytes) is not a jobbroker.v1.StepCheckpoint (${why}); ` +
          "durable steps cannot resume a job whose checkpoint something else wrote",
      );
    let decoded: StepCheckpoint;
    try {
      decoded = StepCheckpoint.decode(checkpoint);
    } catch (e) {
      throw notOurs(e instanceof Error ? e.message : String(e));
    }
    // Bytes that decode to no step at all held only fields StepCheckpoint does not have.
    if (decoded.steps.length === 0) throw notOurs("it holds no step");
    const seen = new Set<string>();
    for (const s of decoded.steps) {
      if (s.name === "" || seen.has(s.name)) throw notOurs(`bad or repeated step name "${s.name}"`);
      seen.add(s.name);
      try {
        JSON.parse(Buffer.from(s.result).toString("utf8"));
      } catch {
        throw notOurs(`step "${s.name}" has a result that is not JSON`);
      }
    }
    return new StepLog(decoded.steps);
  }

  /** Marks `name` as used in this attempt; a second use is a programming error. */
  claim(name: string): void {
    if (typeof name !== "string" || name === "") throw new TypeError("a step needs a non-empty name");
    if (this.usedThisAttempt.has(name)) {
      throw new Error(`step "${name}" was used twice in one attempt: step names must be unique within a job`);
    }
    this.usedThisAttempt.add(name);
  }

  /** The JSON-decoded result of a finished step, or `found: false`. */
  lookup(name: string): { found: true; value: unknown } | { found: false } {
    const r = this.byName.get(name);
    if (r === undefined) return { found: false };
    return { found: true, value: JSON.parse(Buffer.from(r).toString("utf8")) };
  }

  /** Records a finished step; returns the JSON text kept and the whole serialized checkpoint. */
  record(name: string, value: unknown): { json: string; checkpoint: Uint8Array } {
    const json = JSON.stringify(value) ?? "null";
    const result = Buffer.from(json, "utf8");
    this.steps.push({ name, result });
    this.byName.set(name, result);
    return { json, checkpoint: StepCheckpoint.encode({ steps: this.steps }).finish() };
  }

  /** Names of the finished steps, in order. */
  names(): string[] {
    return this.steps.map((s) => s.name);
  }
}
