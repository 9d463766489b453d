// The fake email provider: one line per email sent, "<user> key=<key>", appended to an outbox
// file. Node has no flock(2), so an exclusive lock file (created with O_EXCL, holding the
// owner's pid, broken when that process is dead) keeps two worker processes from interleaving,
// as a real provider's own consistency would.
import { closeSync, openSync, readFileSync, unlinkSync, writeFileSync, appendFileSync, existsSync } from "node:fs";

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
}

async function withLock<T>(file: string, fn: () => T): Promise<T> {
  const lock = `${file}.lock`;
  for (;;) {
    try {
      const fd = openSync(lock, "wx");
      writeFileSync(fd, String(process.pid));
      closeSync(fd);
      break;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== "EEXIST") throw e;
      const owner = Number(readFileSync(lock, { encoding: "utf8", flag: "r" }) || "0");
      if (owner > 0 && !alive(owner)) {
        try {
          unlinkSync(lock); // its owner died holding it
        } catch {
          /* another process broke it first */
        }
        continue;
      }
      await new Promise((r) => setTimeout(r, 5));
    }
  }
  try {
    return fn();
  } finally {
    unlinkSync(lock);
  }
}

/**
 * "Sends" a welcome email to `user`. With `dedup`, the provider skips a key it has already
 * seen (like an email API's Idempotency-Key header); returns whether it sent.
 */
export function sendWelcomeEmail(outbox: string, user: string, key: string, dedup: boolean): Promise<boolean> {
  return withLock(outbox, () => {
    const tag = ` key=${key}\n`;
    if (dedup && existsSync(outbox) && readFileSync(outbox, "utf8").includes(tag)) return false;
    appendFileSync(outbox, `${user}${tag}`);
    return true;
  });
}

/** Emails per user, from the outbox. */
export function emailsPerUser(outbox: string): Map<string, number> {
  const per = new Map<string, number>();
  if (!existsSync(outbox)) return per;
  for (const line of readFileSync(outbox, "utf8").split("\n")) {
    if (line === "") continue;
    const user = line.split(" ")[0];
    per.set(user, (per.get(user) ?? 0) + 1);
  }
  return per;
}
