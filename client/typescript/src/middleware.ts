// Producer middleware: the chain that wraps every enqueue (docs/worker-contract.md §9). The
// worker's chain is in worker.ts, next to the JobContext it passes along.
import type { EnqueueRequest } from "./gen/jobbroker/v1/broker.js";

/** What an enqueue resolves with. */
export interface EnqueueResult {
  jobId: string;
  /** True when dedupKey matched an existing job: jobId is that job and nothing was created. */
  deduplicated: boolean;
}

/** The rest of the chain: the next middleware, and at the end the call to the broker. */
export type EnqueueNext = (request: EnqueueRequest) => Promise<EnqueueResult>;

/**
 * Wraps an enqueue: it may change the request (add headers: trace context, a tenant), observe
 * or time the call, or answer without calling `next` (then nothing is sent). Added with
 * `Client.use()`; the first added is the outermost. In an `enqueueBatch`, each job goes through
 * the chain on its own and `next` resolves once the whole batch was answered.
 */
export type ProducerMiddleware = (request: EnqueueRequest, next: EnqueueNext) => Promise<EnqueueResult>;

/** `send` wrapped by `middleware`, the first outermost. */
export function composeProducer(middleware: readonly ProducerMiddleware[], send: EnqueueNext): EnqueueNext {
  return middleware.reduceRight<EnqueueNext>((next, m) => (request) => m(request, next), send);
}

interface Deferred<T> {
  promise: Promise<T>;
  resolve: (value: T) => void;
  reject: (reason: unknown) => void;
}

function deferred<T>(): Deferred<T> {
  let resolve!: (value: T) => void;
  let reject!: (reason: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

/**
 * A batch `send` wrapped so that each job passes through `middleware` on its own: the batch
 * leaves once every job's chain has reached its end, and each chain's `next` resolves with its
 * job's result. A chain that ends without calling `next` (or throws) refuses the whole batch,
 * which is all or nothing on the broker too.
 */
export function composeProducerBatch(
  middleware: readonly ProducerMiddleware[],
  send: (requests: EnqueueRequest[]) => Promise<EnqueueResult[]>,
): (requests: EnqueueRequest[]) => Promise<EnqueueResult[]> {
  if (middleware.length === 0) return send;
  return async (requests) => {
    const arrived = requests.map(() => deferred<EnqueueRequest>());
    const answered = deferred<EnqueueResult[]>();
    answered.promise.catch(() => {}); // seen by the chains that reached it; none may have
    const chains = requests.map((request, i) =>
      composeProducer(middleware, (r) => {
        arrived[i].resolve(r);
        return answered.promise.then((results) => results[i]);
      })(request),
    );
    chains.forEach((chain, i) =>
      chain.then(
        () => arrived[i].reject(new Error(`producer middleware answered job ${i} of the batch without calling next`)),
        (e: unknown) => arrived[i].reject(e),
      ),
    );
    try {
      answered.resolve(await send(await Promise.all(arrived.map((a) => a.promise))));
    } catch (e) {
      answered.reject(e);
    }
    return Promise.all(chains);
  };
}
