// @jobbroker/client/testing: the FakeClient records enqueues (after the producer middleware), no
// broker involved.
import assert from "node:assert/strict";
import { test } from "node:test";
import { JobBrokerError, Status, type Producer } from "../src";
import { FakeClient } from "../src/testing";

// Code under test: typed with Producer, so a Client or a FakeClient will do.
async function signUp(producer: Producer, email: string): Promise<string> {
  const { jobId } = await producer.enqueue("emails", { to: email }, { dedupKey: `welcome:${email}`, priority: 5 });
  await producer.enqueueBatch([
    { queue: "crm", payload: "new-user" },
    { queue: "audit", payload: Buffer.from([1, 2]), dependsOnIndex: [0] },
  ]);
  return jobId;
}

test("a FakeClient records each enqueue, batches included, with its options", async () => {
  const fake = new FakeClient();
  const id = await signUp(fake, "ada@example.com");
  assert.equal(id, "fake-1");
  assert.deepEqual(fake.jobs.map((j) => [j.jobId, j.queue]), [["fake-1", "emails"], ["fake-2", "crm"], ["fake-3", "audit"]]);
  const [email] = fake.jobsIn("emails");
  assert.deepEqual(email.json(), { to: "ada@example.com" });
  assert.equal(email.request.priority, 5);
  assert.equal(email.request.dedupKey, "welcome:ada@example.com");
  assert.equal(fake.jobsIn("crm")[0].text(), "new-user");
  assert.deepEqual([...fake.jobsIn("audit")[0].payload], [1, 2]);
  assert.deepEqual(fake.jobsIn("audit")[0].request.dependsOnIndex, [0]);
});

test("a dedup key seen before on the queue is deduplicated; clear() forgets", async () => {
  const fake = new FakeClient();
  const first = await fake.enqueue("emails", "x", { dedupKey: "k" });
  const again = await fake.enqueue("emails", "x", { dedupKey: "k" });
  const other = await fake.enqueue("sms", "x", { dedupKey: "k" });
  assert.deepEqual(again, { jobId: first.jobId, deduplicated: true });
  assert.equal(other.deduplicated, false);
  assert.equal(fake.jobs.length, 2);
  fake.clear();
  assert.equal((await fake.enqueue("emails", "x", { dedupKey: "k" })).deduplicated, false);
});

test("producer middleware runs before recording; fail() makes enqueues reject", async () => {
  const fake = new FakeClient().use(async (request, next) => {
    request.headers["tenant"] = "t1";
    return next(request);
  });
  await fake.enqueue("emails", "x");
  await fake.enqueueBatch([{ queue: "emails", payload: "y" }]);
  assert.deepEqual(fake.jobs.map((j) => j.headers["tenant"]), ["t1", "t1"]);
  fake.fail(new JobBrokerError(Status.UNAVAILABLE, "down"));
  await assert.rejects(fake.enqueue("emails", "z"), (e) => e instanceof JobBrokerError && e.code === Status.UNAVAILABLE);
  await assert.rejects(fake.enqueueBatch([{ queue: "emails", payload: "z" }]));
  fake.fail(undefined);
  await fake.enqueue("emails", "z");
  assert.equal(fake.jobs.length, 3);
});
