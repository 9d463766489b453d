// gRPC clients of the broker (Broker and Admin services, from the repo's proto/ files) and the
// few job-shaping helpers the tests seed their queues with.

import path from 'node:path';
import grpc from '@grpc/grpc-js';
import protoLoader from '@grpc/proto-loader';
import { repoRoot } from './broker.mjs';

const protoDir = path.join(repoRoot, 'proto');
const definition = protoLoader.loadSync(
  [path.join(protoDir, 'jobbroker/v1/broker.proto'), path.join(protoDir, 'jobbroker/v1/admin.proto')],
  // Field names in lowerCamelCase, int64 as strings and enums as names: the same shapes as the
  // HTTP API's JSON, so a test compares them directly.
  { includeDirs: [protoDir], keepCase: false, longs: String, enums: String, defaults: true, oneofs: true },
);
const v1 = grpc.loadPackageDefinition(definition).jobbroker.v1;

// Promise-returning clients: client.broker.enqueue({...}), client.admin.getJob({jobId}), ...
// With `token`, every call carries it as a bearer token.
export function connect(address, token = '') {
  const make = (Service) => {
    const raw = new Service(address, grpc.credentials.createInsecure());
    const wrapped = {};
    for (const method of Object.keys(Service.service)) {
      const name = method.charAt(0).toLowerCase() + method.slice(1);
      wrapped[name] = (request) =>
        new Promise((resolve, reject) => {
          const metadata = new grpc.Metadata();
          if (token) metadata.set('authorization', `Bearer ${token}`);
          raw[method](request, metadata, { deadline: Date.now() + 15_000 }, (err, reply) => (err ? reject(err) : resolve(reply)));
        });
    }
    wrapped.close = () => raw.close();
    return wrapped;
  };
  const broker = make(v1.Broker);
  const admin = make(v1.Admin);
  return {
    broker,
    admin,
    close() {
      broker.close();
      admin.close();
    },
  };
}

const asBytes = (payload) => (typeof payload === 'string' ? Buffer.from(payload) : payload ?? Buffer.alloc(0));

// Enqueues one job; resolves with its id.
export async function enqueue(c, queue, payload = '', fields = {}) {
  const reply = await c.broker.enqueue({ queue, payload: asBytes(payload), ...fields });
  return reply.jobId;
}

// Leases exactly job `id` of `queue` as `workerId`: leases what is ready and gives the other
// jobs back unstarted (a release counts no attempt). Resolves with the LeasedJob.
export async function leaseJob(c, queue, id, workerId) {
  const { jobs } = await c.broker.lease({ queue, workerId, maxJobs: 1000 });
  const mine = jobs.find((j) => j.jobId === id);
  for (const j of jobs) {
    if (j !== mine) await c.broker.release({ jobId: j.jobId, leaseId: j.leaseId });
  }
  if (!mine) throw new Error(`job ${id} of ${queue} was not leased (is the queue paused?)`);
  return mine;
}

// A dead job (JOB_STATE_FAILED): enqueued with one attempt, leased and failed permanently with
// `error`. Resolves with its id.
export async function deadJob(c, queue, error, { payload = '{}', workerId = 'ui-test-worker' } = {}) {
  const id = await enqueue(c, queue, payload, { maxAttempts: 1 });
  const leased = await leaseJob(c, queue, id, workerId);
  await c.broker.fail({ jobId: id, leaseId: leased.leaseId, error, permanent: true });
  return id;
}

// `n` jobs enqueued, leased and acked (COMPLETED).
export async function completedJobs(c, queue, n, workerId = 'ui-test-worker') {
  for (let i = 0; i < n; i++) {
    const id = await enqueue(c, queue, JSON.stringify({ n: i }));
    const leased = await leaseJob(c, queue, id, workerId);
    await c.broker.ack({ jobId: id, leaseId: leased.leaseId });
  }
}
