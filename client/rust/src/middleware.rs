//! Middleware on both sides (`docs/worker-contract.md` §9): producer middleware wraps
//! [`Client::enqueue`], worker middleware wraps each handler call. In both chains the first
//! registered is the outermost; each one calls `next` (or does not, and its own result is the
//! call's).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use crate::worker::Handler;
use crate::{Client, Job, Output, Status, WorkerError, v1};

/// A boxed future, as middleware return them.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// One producer middleware, as [`Client::with_producer_middleware`] stores it.
pub(crate) type ProducerMiddleware = Arc<
    dyn Fn(v1::EnqueueRequest, EnqueueNext) -> BoxFuture<Result<v1::EnqueueResponse, Status>>
        + Send
        + Sync,
>;

/// Where the end of the producer chain goes.
#[derive(Clone)]
enum Terminal {
    /// Send the enqueue.
    Send(Client),
    /// Keep the request (a job of a batch, which is sent whole afterwards).
    Capture(Arc<Mutex<Option<v1::EnqueueRequest>>>),
}

/// The rest of the producer chain, handed to each producer middleware: [`EnqueueNext::run`]
/// calls the next middleware, or sends the enqueue after the last one.
#[derive(Clone)]
pub struct EnqueueNext {
    chain: Arc<[ProducerMiddleware]>,
    index: usize,
    terminal: Terminal,
}

impl std::fmt::Debug for EnqueueNext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnqueueNext")
            .field("remaining", &(self.chain.len() - self.index))
            .finish()
    }
}

impl EnqueueNext {
    pub(crate) fn start(client: Client, chain: Arc<[ProducerMiddleware]>) -> Self {
        Self {
            chain,
            index: 0,
            terminal: Terminal::Send(client),
        }
    }

    /// Passes `request` on: to the next middleware, or to the broker.
    pub fn run(
        self,
        request: v1::EnqueueRequest,
    ) -> BoxFuture<Result<v1::EnqueueResponse, Status>> {
        Box::pin(async move {
            match self.chain.get(self.index).cloned() {
                Some(middleware) => {
                    let next = Self {
                        index: self.index + 1,
                        ..self
                    };
                    middleware(request, next).await
                }
                None => match self.terminal {
                    Terminal::Send(client) => client.send_enqueue(request).await,
                    Terminal::Capture(slot) => {
                        *slot.lock().unwrap() = Some(request);
                        // The job goes out with its batch; there is no answer of its own yet.
                        Ok(v1::EnqueueResponse::default())
                    }
                },
            }
        })
    }
}

/// A job of a batch through the producer chain: the request as the last middleware passed it
/// on. A middleware that answers the job itself cannot take it out of the batch (the batch is
/// all or nothing): that is `FAILED_PRECONDITION`.
pub(crate) async fn prepare(
    chain: &Arc<[ProducerMiddleware]>,
    request: v1::EnqueueRequest,
) -> Result<v1::EnqueueRequest, Status> {
    if chain.is_empty() {
        return Ok(request);
    }
    let slot = Arc::new(Mutex::new(None));
    let next = EnqueueNext {
        chain: chain.clone(),
        index: 0,
        terminal: Terminal::Capture(slot.clone()),
    };
    next.run(request).await?;
    let prepared = slot.lock().unwrap().take();
    prepared.ok_or_else(|| {
        Status::failed_precondition(
            "a producer middleware did not pass a job of a batch on: a batch is sent whole",
        )
    })
}

/// One worker middleware, as [`Worker::use_middleware`](crate::Worker::use_middleware) stores
/// it.
pub(crate) type WorkerMiddleware =
    Arc<dyn Fn(Job, HandlerNext) -> BoxFuture<Result<Output, WorkerError>> + Send + Sync>;

/// The rest of the worker chain, handed to each worker middleware: [`HandlerNext::run`] calls
/// the next middleware, or the queue's handler after the last one.
#[derive(Clone)]
pub struct HandlerNext {
    chain: Arc<[WorkerMiddleware]>,
    index: usize,
    handler: Handler,
}

impl std::fmt::Debug for HandlerNext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandlerNext")
            .field("remaining", &(self.chain.len() - self.index))
            .finish()
    }
}

impl HandlerNext {
    /// Passes `job` on: to the next middleware, or to the handler.
    pub fn run(self, job: Job) -> BoxFuture<Result<Output, WorkerError>> {
        match self.chain.get(self.index).cloned() {
            Some(middleware) => {
                let next = Self {
                    index: self.index + 1,
                    ..self
                };
                middleware(job, next)
            }
            None => (self.handler)(job),
        }
    }
}

/// `handler` inside `chain` (the first is the outermost).
pub(crate) fn wrap(chain: &Arc<[WorkerMiddleware]>, handler: Handler) -> Handler {
    if chain.is_empty() {
        return handler;
    }
    let chain = chain.clone();
    Arc::new(move |job| {
        HandlerNext {
            chain: chain.clone(),
            index: 0,
            handler: handler.clone(),
        }
        .run(job)
    })
}
