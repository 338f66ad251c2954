//! The lease service: ensures the bucket, registers the `dagnats-api` micro
//! service, and runs each request's call machine, all of them polled by one
//! serving future that spawns nothing and keeps time on a [`Runtime`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::Client;
use async_nats::service::ServiceExt;
use std::collections::HashMap;

use dagnats_leases_core::admit::{Admission, Admit};
use dagnats_leases_core::call::{Call, CallConfig, DEFAULT_KV_TIMEOUT};
use dagnats_leases_core::coalesce::{self, Coalescer, CoalescerConfig, CoalescerEvent, WriteId};
use dagnats_leases_core::io::{EffectId, Mode, Transmit};
use dagnats_leases_core::replicas::{ReplicasCheck, ReplicasEvent};
use dagnats_leases_core::startup::{BucketOptions, REPLICAS_RECHECK, Startup, StartupEvent};
use dagnats_leases_core::subjects::{API_PREFIX, QUEUE_GROUP, SERVICE_NAME};
use dagnats_leases_core::wire::{Endpoint, ErrorKind, ErrorReply, Response};
use dagnats_leases_core::{NatsRequest, RequestOutcome};
use futures::future::AbortHandle;
use futures::stream::FuturesUnordered;
use futures::{FutureExt as _, StreamExt};
use time::OffsetDateTime;
use tokio::sync::{mpsc, oneshot, watch};

use crate::exec;
use crate::known::KnownCache;
use crate::runtime::{self, Runtime, TokioRuntime};
use crate::telemetry::{self, JsOp};
use crate::{Error, ErrorKind as ServiceErrorKind};

/// The default bound on calls running at once: far above what one service needs to
/// keep JetStream busy (a call is a few round trips), far below what a burst of
/// tens of thousands of requests would cost in memory.
pub const DEFAULT_MAX_CALLS_IN_FLIGHT: usize = 1024;

/// How the service runs.
#[derive(Debug, Clone)]
pub struct ServiceOptions {
    /// Stream replicas of the bucket; `None` creates with 1 and leaves an existing one's.
    pub replicas: Option<usize>,
    /// Bound on each JetStream request.
    pub kv_timeout: Duration,
    /// How long shutdown waits for calls in flight.
    pub shutdown_timeout: Duration,
    /// How often the stream's replicas are asked again while serving: read
    /// confirmation turns on when they go above 1 and off when they come back.
    pub replicas_recheck: Duration,
    /// At most this many calls run at once; further requests wait, up to
    /// `max_calls_waiting`, and past that are answered `unavailable` at once
    /// ([`dagnats_leases_core::admit`]): the service's memory stays flat whatever
    /// the burst, and no call is answered long after its caller gave up.
    pub max_calls_in_flight: usize,
    /// At most this many requests wait for a call to end (half of them kept for
    /// renew and release).
    pub max_calls_waiting: usize,
    /// Whether the calls' writes go through one write coalescer
    /// ([`dagnats_leases_core::coalesce`]): past `batch_after` single writes in
    /// flight they gather into atomic batches when the stream allows it
    /// (nats-server 2.12+). Off by default: `scripts/bench` measured no gain in
    /// throughput on one server and a loss on a three-node cluster (see
    /// docs/benchmarks.md).
    pub coalesce_writes: bool,
    /// Single writes in flight before writes gather into batches.
    pub batch_after: usize,
    /// The smallest batch the coalescer sends; fewer gathered writes wait for a
    /// single write to come back and go single.
    pub min_batch: usize,
    /// How many keys' last revisions the service remembers
    /// ([`dagnats_leases_core::known`]), learnt from its own calls and from the
    /// change events it subscribes to: a renew or release of a revision it knows is
    /// one conditional write and no read. 0: nothing remembered, no subscription,
    /// every renew and release reads first.
    pub known_capacity: usize,
    /// Test only: answer from unconfirmed reads even on a replicated bucket, to
    /// show what the fault tests catch without read confirmation.
    #[cfg(feature = "__test")]
    pub unconfirmed_reads_for_tests: bool,
}

impl ServiceOptions {
    /// The call config for a bucket of `replicas`.
    fn call_config(&self, base: CallConfig, replicas: usize) -> CallConfig {
        let config = base.for_replicas(replicas);
        #[cfg(feature = "__test")]
        if self.unconfirmed_reads_for_tests {
            return CallConfig {
                confirm_reads: false,
                ..config
            };
        }
        config
    }
}

impl Default for ServiceOptions {
    fn default() -> Self {
        Self {
            replicas: None,
            kv_timeout: DEFAULT_KV_TIMEOUT,
            shutdown_timeout: Duration::from_secs(10),
            replicas_recheck: REPLICAS_RECHECK,
            max_calls_in_flight: DEFAULT_MAX_CALLS_IN_FLIGHT,
            max_calls_waiting: DEFAULT_MAX_CALLS_IN_FLIGHT,
            coalesce_writes: false,
            batch_after: coalesce::DEFAULT_SINGLE_WINDOW,
            min_batch: coalesce::DEFAULT_MIN_BATCH,
            known_capacity: dagnats_leases_core::known::DEFAULT_KNOWN_CAPACITY,
            #[cfg(feature = "__test")]
            unconfirmed_reads_for_tests: false,
        }
    }
}

/// A running service, on whichever [`Runtime`] it was started. Dropping it without
/// [`ServiceHandle::shutdown`] aborts it.
#[derive(Debug)]
pub struct ServiceHandle {
    mode: Mode,
    stop: watch::Sender<bool>,
    /// Fires when the serving task ends; `None` once awaited.
    done: Option<oneshot::Receiver<()>>,
    abort: AbortHandle,
}

impl ServiceHandle {
    /// `Ready`, or `Unsupported` on a server without per-message TTL.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Stops taking requests, lets calls in flight finish within the bound, and returns.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(done) = self.done.take() {
            let _ = done.await;
        }
    }
}

impl Drop for ServiceHandle {
    fn drop(&mut self) {
        if self.done.is_some() {
            self.abort.abort();
        }
    }
}

/// Ensures the bucket (waiting while JetStream is not ready, and answering every
/// call `unavailable` meanwhile), then serves on tokio.
pub async fn start(client: Client, options: ServiceOptions) -> Result<ServiceHandle, Error> {
    start_on(TokioRuntime::shared(), client, options).await
}

/// [`start`] on `runtime`: the serving future is spawned there and keeps time with
/// its timer.
pub async fn start_on(
    runtime: Arc<dyn Runtime>,
    client: Client,
    options: ServiceOptions,
) -> Result<ServiceHandle, Error> {
    let prepared = prepare(runtime.clone(), client, options).await?;
    let (serve, abort) = futures::future::abortable(prepared.serve);
    let (finished, done) = oneshot::channel();
    runtime.spawn(Box::pin(async move {
        let _ = serve.await;
        let _ = finished.send(());
    }));
    Ok(ServiceHandle {
        mode: prepared.mode,
        stop: prepared.stop,
        done: Some(done),
        abort,
    })
}

/// A service ready to serve: its mode, its stop switch, and the one future that
/// serves every request until the switch is thrown. The future spawns nothing and
/// keeps time on the [`Runtime`] it was prepared with, so that runtime's executor
/// (or any other) can poll it.
pub struct Prepared {
    /// `Ready`, or `Unsupported` on a server without per-message TTL.
    pub mode: Mode,
    /// Send `true` to stop taking requests and drain the calls in flight.
    pub stop: watch::Sender<bool>,
    /// Serves until stopped.
    pub serve: futures::future::BoxFuture<'static, ()>,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("mode", &self.mode)
            .finish()
    }
}

/// Registers the endpoints and ensures the bucket; returns the serving future.
///
/// The endpoints answer from the start: while the bucket is being ensured (and
/// JetStream may not be there yet) every call replies `unavailable`
/// ([`Mode::Starting`]), so callers retry instead of seeing no responders. This
/// future answers those itself, until it returns with the mode startup settled on.
///
/// async-nats' micro service spawns a task of its own (`$SRV.PING`, `INFO`,
/// `STATS`) with `tokio::spawn` here: poll this future in a tokio context (on smol,
/// under `async_compat::Compat`). The serving future needs none.
pub async fn prepare(
    runtime: Arc<dyn Runtime>,
    client: Client,
    options: ServiceOptions,
) -> Result<Prepared, Error> {
    let info = client.server_info();
    if info.version.is_empty() {
        // Judging support from an empty INFO would wrongly settle on `unsupported`.
        return Err(Error::new(
            ServiceErrorKind::Config,
            "the client has not received the server's INFO yet: connect without \
             retry_on_initial_connect, or wait for the connection first",
        ));
    }
    telemetry::set_mode(Mode::Starting);
    let service = client
        .service_builder()
        .description("dagnats leases: leader election and shard ownership over NATS")
        .queue_group(QUEUE_GROUP)
        .start(SERVICE_NAME, env!("CARGO_PKG_VERSION"))
        .await
        .map_err(|e| Error::new(ServiceErrorKind::Nats, e))?;
    let group = service.group(API_PREFIX);
    let mut endpoints = Vec::new();
    for endpoint in Endpoint::ALL {
        let e = group
            .endpoint_builder()
            .name(endpoint.name())
            .add(endpoint.name())
            .await
            .map_err(|e| Error::new(ServiceErrorKind::Nats, e))?;
        endpoints.push((endpoint, e));
    }
    // The server has the subscriptions once it answers a PING sent after them.
    client
        .flush()
        .await
        .map_err(|e| Error::new(ServiceErrorKind::Nats, e))?;
    let mut requests: Requests = futures::stream::select_all(
        endpoints
            .into_iter()
            .map(|(endpoint, stream)| stream.map(move |r| (endpoint, r)).boxed()),
    );
    let starting = CallConfig {
        mode: Mode::Starting,
        max_payload: info.max_payload,
        kv_timeout: options.kv_timeout,
        confirm_reads: false,
    };
    let (mode, replicas, atomic) = {
        let ensure = ensure_bucket(&*runtime, &client, &options, &info.version);
        tokio::pin!(ensure);
        loop {
            tokio::select! {
                settled = &mut ensure => break settled,
                Some((endpoint, request)) = requests.next() => {
                    // No effects in `Starting` mode: the reply is at hand.
                    let body = run_call(&*runtime, &client, starting, endpoint, &request.message.payload).await;
                    if let Err(e) = request.respond(Ok(body.into())).await {
                        tracing::warn!(endpoint = endpoint.name(), "reply not sent: {e}");
                    }
                }
            }
        }
    };
    telemetry::set_mode(mode);
    let atomic = atomic && options.coalesce_writes;
    let base = CallConfig { mode, ..starting };
    let config = options.call_config(base, replicas);
    tracing::info!(
        ?mode,
        replicas,
        confirm_reads = config.confirm_reads,
        atomic_batches = atomic,
        max_payload = info.max_payload,
        server = %info.version,
        "serving api.leases.* in queue group {QUEUE_GROUP}"
    );
    let (stop, stopped) = watch::channel(false);
    let writer = Writer::new(&client, atomic, &options, runtime.now());
    // The replicas are asked again now and then: read confirmation follows them.
    let check = (mode == Mode::Ready).then(|| {
        ReplicasCheck::new(
            options.replicas_recheck,
            options.kv_timeout,
            replicas,
            runtime.now(),
        )
    });
    let known = (options.known_capacity > 0).then(|| KnownCache::new(options.known_capacity));
    let watch = known.clone().map(|k| k.watch(client.clone()));
    let serve = serve(
        runtime, client, service, requests, config, options, stopped, writer, check, known,
    );
    Ok(Prepared {
        mode,
        stop,
        serve: Box::pin(watching(serve, watch)),
    })
}

/// Runs `serve` to its end while `watch` (which never ends) feeds the known map.
/// The watch is polled first: a change event the connection delivered before a
/// request is learnt before that request's call starts.
async fn watching(
    serve: impl std::future::Future<Output = ()>,
    watch: Option<impl std::future::Future<Output = ()>>,
) {
    let Some(watch) = watch else {
        return serve.await;
    };
    let (serve, watch) = (std::pin::pin!(serve), std::pin::pin!(watch));
    futures::future::select(watch, serve).await;
}

/// Every endpoint's requests, tagged with the endpoint.
type Requests = futures::stream::SelectAll<
    futures::stream::BoxStream<'static, (Endpoint, async_nats::service::Request)>,
>;

/// The mode to serve in, the stream's replicas, and whether it takes atomic batches.
async fn ensure_bucket(
    runtime: &dyn Runtime,
    client: &Client,
    options: &ServiceOptions,
    version: &str,
) -> (Mode, usize, bool) {
    let bucket = BucketOptions {
        replicas: options.replicas,
    };
    let mut startup = Startup::new(bucket, version, options.kv_timeout, runtime.now());
    loop {
        while let Some(event) = startup.poll_event() {
            match event {
                StartupEvent::Log(line) => tracing::warn!("{line}"),
                StartupEvent::Done(mode) => {
                    return (mode, startup.replicas(), startup.atomic());
                }
            }
        }
        if let Some(t) = startup.poll_transmit() {
            let outcome = exec::send(runtime, client, t.request).await;
            startup.handle_outcome(runtime.now(), t.id, outcome);
            continue;
        }
        if let Some(at) = startup.poll_timeout() {
            runtime.sleep_until(at).await;
            startup.handle_timeout(runtime.now());
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn serve(
    runtime: Arc<dyn Runtime>,
    client: Client,
    service: async_nats::service::Service,
    mut requests: Requests,
    mut config: CallConfig,
    options: ServiceOptions,
    mut stopped: watch::Receiver<bool>,
    mut writer: Writer,
    mut check: Option<ReplicasCheck>,
    known: Option<KnownCache>,
) {
    let writes = options.coalesce_writes.then(|| writer.sink.clone());
    let shutdown_timeout = options.shutdown_timeout;
    let mut check_at = check.as_ref().and_then(ReplicasCheck::poll_timeout);
    let mut recheck = sleep_until(&*runtime, check_at);
    let mut asking: Option<(
        EffectId,
        futures::future::BoxFuture<'static, RequestOutcome>,
    )> = None;
    // Thrown when shutdown stops waiting: every call still running then ends
    // `internal` through the core (`Call::abort`), and is answered.
    let (cut, cut_off) = watch::channel(false);
    // Every call in flight is polled by this one future: calls run concurrently
    // without spawning, so the same loop serves on any executor.
    let mut calls = FuturesUnordered::new();
    let take = |calls: &mut FuturesUnordered<_>, endpoint: Endpoint, request, config| {
        calls.push(answer(
            runtime.clone(),
            client.clone(),
            config,
            endpoint,
            request,
            cut_off.clone(),
            writes.clone(),
            known.clone(),
        ));
    };
    let mut admission = Admission::new(
        options.max_calls_in_flight,
        options.max_calls_waiting,
        runtime.now(),
    );
    // Starts what admission starts; returns what it refuses, to be answered one at
    // a time (a refusal held in memory per request would undo the bound).
    let admit = |admission: &mut Admission<_>, calls: &mut FuturesUnordered<_>, config| {
        let mut refused = Vec::new();
        while let Some(event) = admission.poll_event() {
            match event {
                Admit::Start(endpoint, request) => take(calls, endpoint, request, config),
                Admit::Refuse(endpoint, request, response) => {
                    refused.push((endpoint, request, response))
                }
            }
        }
        refused
    };
    loop {
        tokio::select! {
            next = requests.next() => {
                let Some((endpoint, request)) = next else { break };
                admission.handle_request(runtime.now(), endpoint, request);
                for (endpoint, request, response) in admit(&mut admission, &mut calls, config) {
                    refuse(endpoint, request, response).await;
                }
            }
            Some(()) = calls.next(), if !calls.is_empty() => {
                admission.handle_finished(runtime.now());
                let refused = admit(&mut admission, &mut calls, config);
                debug_assert!(refused.is_empty(), "a call ending refuses nothing");
            }
            () = writer.step(&runtime, &client) => {}
            () = &mut recheck => {
                if let Some(c) = &mut check {
                    c.handle_timeout(runtime.now());
                }
            }
            outcome = async { asking.as_mut().expect("guarded").1.as_mut().await }, if asking.is_some() => {
                let (id, _) = asking.take().expect("guarded");
                if let Some(c) = &mut check {
                    c.handle_outcome(runtime.now(), id, outcome);
                }
            }
            _ = stopped.changed() => break,
        }
        let Some(c) = &mut check else { continue };
        while let Some(t) = c.poll_transmit() {
            let (client, runtime) = (client.clone(), runtime.clone());
            let send = async move { exec::send(&*runtime, &client, t.request).await };
            asking = Some((t.id, Box::pin(send)));
        }
        while let Some(ReplicasEvent::ConfirmReads { replicas, on }) = c.poll_event() {
            tracing::info!(
                replicas,
                confirm_reads = on,
                "the leases stream's replicas changed"
            );
            config = options.call_config(config, replicas);
        }
        if c.poll_timeout() != check_at {
            check_at = c.poll_timeout();
            recheck = sleep_until(&*runtime, check_at);
        }
    }
    // Unsubscribe every endpoint (each does so on its next poll), then keep reading
    // them: the requests already delivered to this client are in their buffers, and
    // each stream ends once those are read. Every one of them is answered.
    let _ = service.stop().await;
    admission.handle_stop(runtime.now());
    let refused = admit(&mut admission, &mut calls, config);
    debug_assert!(refused.is_empty(), "stopping refuses nothing");
    let in_flight = calls.len();
    if in_flight > 0 {
        tracing::info!("stopping: waiting up to {shutdown_timeout:?} for {in_flight} calls");
    }
    let mut bound = runtime.sleep_until(runtime.now() + shutdown_timeout);
    let mut open = true;
    let mut late = 0usize;
    while open || !calls.is_empty() {
        tokio::select! {
            next = requests.next(), if open => match next {
                Some((endpoint, request)) => {
                    late += 1;
                    take(&mut calls, endpoint, request, config);
                }
                None => open = false,
            },
            Some(()) = calls.next(), if !calls.is_empty() => {}
            () = writer.step(&runtime, &client) => {}
            _ = &mut bound => break,
        }
    }
    if late > 0 {
        tracing::info!("stopping: took {late} requests delivered before the unsubscribe");
    }
    // Past the bound: what still runs is cut off and answered `internal`, as is any
    // request still buffered (its call is cut off at once).
    let _ = cut.send(true);
    if open {
        while let Some(Some((endpoint, request))) = requests.next().now_or_never() {
            take(&mut calls, endpoint, request, config);
        }
    }
    if !calls.is_empty() {
        tracing::warn!(
            "stopping: {} calls did not finish in time; they are answered `internal`",
            calls.len()
        );
        // Each cut-off call replies at once; the bound only guards a stuck publish.
        let replies = async {
            loop {
                tokio::select! {
                    next = calls.next() => if next.is_none() { break },
                    () = writer.step(&runtime, &client) => {}
                }
            }
        };
        let _ = runtime::until(&*runtime, runtime.now() + REPLY_BOUND, replies).await;
    }
    drop(calls);
    drop(requests);
    let _ = client.flush().await;
}

/// How long a stopping service gives the replies of cut-off calls to go out.
const REPLY_BOUND: Duration = Duration::from_secs(1);

/// Runs one request's call and sends its reply.
#[allow(clippy::too_many_arguments)]
async fn answer(
    runtime: Arc<dyn Runtime>,
    client: Client,
    config: CallConfig,
    endpoint: Endpoint,
    request: async_nats::service::Request,
    mut cut_off: watch::Receiver<bool>,
    writes: Option<WriteSink>,
    known: Option<KnownCache>,
) {
    let cut = async move {
        if cut_off.wait_for(|cut| *cut).await.is_err() {
            // The service is gone without cutting anything off: nothing to wait for.
            std::future::pending::<()>().await;
        }
    };
    let started = runtime.now();
    let response = drive_call(
        &*runtime,
        &client,
        config,
        endpoint,
        &request.message.payload,
        cut,
        writes.as_ref(),
        known.as_ref(),
    )
    .await;
    telemetry::call_answered(endpoint, &response, runtime.now() - started);
    let body = response.to_json();
    if let Err(e) = request.respond(Ok(body.into())).await {
        tracing::warn!(endpoint = endpoint.name(), "reply not sent: {e}");
    }
}

/// Answers a request admission refused, at once.
async fn refuse(endpoint: Endpoint, request: async_nats::service::Request, response: Response) {
    telemetry::refused(endpoint);
    if let Err(e) = request.respond(Ok(response.to_json().into())).await {
        tracing::warn!("refusal not sent: {e}");
    }
}

/// Sleeps until `at`, or for ever without one.
fn sleep_until(runtime: &dyn Runtime, at: Option<Instant>) -> runtime::Sleep {
    match at {
        Some(at) => runtime.sleep_until(at),
        None => Box::pin(std::future::pending()),
    }
}

/// Runs one call to its reply and returns the reply body.
pub async fn run_call(
    runtime: &dyn Runtime,
    client: &Client,
    config: CallConfig,
    endpoint: Endpoint,
    body: &[u8],
) -> Vec<u8> {
    run_call_until(
        runtime,
        client,
        config,
        endpoint,
        body,
        std::future::pending(),
    )
    .await
}

/// Runs one call to its reply, or until `cut` completes: the call is then cut off
/// ([`Call::abort`]) and replies `internal`. Returns the reply body.
pub async fn run_call_until(
    runtime: &dyn Runtime,
    client: &Client,
    config: CallConfig,
    endpoint: Endpoint,
    body: &[u8],
    cut: impl std::future::Future<Output = ()>,
) -> Vec<u8> {
    let started = runtime.now();
    let response = drive_call(runtime, client, config, endpoint, body, cut, None, None).await;
    telemetry::call_answered(endpoint, &response, runtime.now() - started);
    response.to_json()
}

/// Carries out one call's effects until it replies (or `cut` completes), starting
/// it with what `known` knows of its key and teaching `known` what it learns.
#[allow(clippy::too_many_arguments)]
async fn drive_call(
    runtime: &dyn Runtime,
    client: &Client,
    config: CallConfig,
    endpoint: Endpoint,
    body: &[u8],
    cut: impl std::future::Future<Output = ()>,
    writes: Option<&WriteSink>,
    known: Option<&KnownCache>,
) -> Response {
    let cut = cut.fuse();
    tokio::pin!(cut);
    let (now, wall) = (runtime.now(), OffsetDateTime::now_utc());
    let mut call = match known {
        Some(known) => known.start_call(config, now, wall, endpoint, body),
        None => Call::new(config, now, wall, endpoint, body),
    };
    loop {
        if let Some(known) = known {
            known.learn_from(&mut call);
        }
        if let Some(response) = call.poll_event() {
            return response;
        }
        let Some(transmit) = call.poll_transmit() else {
            // Waiting with nothing to do can only be a forward's deadline.
            match call.poll_timeout() {
                Some(at) => {
                    tokio::select! {
                        () = runtime.sleep_until(at) => call.handle_timeout(runtime.now()),
                        _ = &mut cut => call.abort(runtime.now()),
                    }
                    continue;
                }
                None => {
                    return Response::Error(ErrorReply::new(
                        ErrorKind::Internal,
                        "the call stopped without a reply",
                    ));
                }
            }
        };
        let op = JsOp::of(transmit.kind);
        let coalesced = writes.filter(|_| transmit.kind.is_stream_write());
        let Transmit { id, request, .. } = transmit;
        let deadline = call.poll_timeout();
        let expired = async {
            match deadline {
                Some(at) => runtime.sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            outcome = send_effect(client, coalesced, request) => {
                if let Some(op) = op {
                    op.outcome(&outcome);
                }
                call.handle_outcome(runtime.now(), id, outcome)
            }
            _ = expired => {
                if let Some(op) = op {
                    op.timed_out();
                }
                call.handle_timeout(runtime.now())
            }
            _ = &mut cut => call.abort(runtime.now()),
        }
    }
}

/// Sends one effect's request: a write through the serve loop's coalescer when
/// there is one, anything else (and every write without one) straight.
async fn send_effect(
    client: &Client,
    writes: Option<&WriteSink>,
    request: NatsRequest,
) -> RequestOutcome {
    let Some(writes) = writes else {
        return exec::send_untimed(client, request).await;
    };
    let (tx, rx) = oneshot::channel();
    if writes.send((request, tx)).is_err() {
        return RequestOutcome::Failed("the service is stopping".to_string());
    }
    rx.await
        .unwrap_or_else(|_| RequestOutcome::Failed("the write was dropped".to_string()))
}

/// A write for the coalescer and where its outcome goes.
type WriteSink = mpsc::UnboundedSender<(NatsRequest, oneshot::Sender<RequestOutcome>)>;

/// The serve loop's one [`Coalescer`]: calls hand it their writes through
/// [`WriteSink`]; the loop sends only what it says and feeds the outcomes back.
struct Writer {
    coalescer: Coalescer,
    sink: WriteSink,
    incoming: mpsc::UnboundedReceiver<(NatsRequest, oneshot::Sender<RequestOutcome>)>,
    waiting: HashMap<WriteId, oneshot::Sender<RequestOutcome>>,
    next_write: u64,
    sends: FuturesUnordered<futures::future::BoxFuture<'static, (EffectId, RequestOutcome)>>,
}

impl Writer {
    fn new(client: &Client, atomic: bool, options: &ServiceOptions, now: Instant) -> Self {
        let config = if atomic {
            // Unique per process: the server keys open batches by id.
            let inbox = client.new_inbox();
            let nuid = inbox.rsplit('.').next().unwrap_or_default();
            CoalescerConfig {
                single_window: options.batch_after,
                min_batch: options.min_batch,
                ..CoalescerConfig::atomic(format!("{nuid}-"))
            }
        } else {
            CoalescerConfig::single()
        };
        let (sink, incoming) = mpsc::unbounded_channel();
        Self {
            coalescer: Coalescer::new(config, now),
            sink,
            incoming,
            waiting: HashMap::new(),
            next_write: 0,
            sends: FuturesUnordered::new(),
        }
    }

    /// Waits for a write or a send's outcome and handles it. Never completes
    /// while there is neither (cancel-safe: for `select!`).
    async fn step(&mut self, runtime: &Arc<dyn Runtime>, client: &Client) {
        tokio::select! {
            Some((request, tx)) = self.incoming.recv() => {
                self.next_write += 1;
                let id = WriteId(self.next_write);
                self.waiting.insert(id, tx);
                self.coalescer.handle_write(runtime.now(), id, request);
            }
            Some((id, outcome)) = self.sends.next(), if !self.sends.is_empty() => {
                // Writes still queued whose call gave up (timed out, cut off)
                // are not sent late.
                if self.coalescer.pending().0 > 0 {
                    let (now, coalescer) = (runtime.now(), &mut self.coalescer);
                    self.waiting
                        .retain(|w, tx| !(tx.is_closed() && coalescer.handle_cancel(now, *w)));
                }
                self.coalescer.handle_outcome(runtime.now(), id, outcome);
            }
        }
        while let Some(CoalescerEvent::Done { write, outcome }) = self.coalescer.poll_event() {
            if let Some(tx) = self.waiting.remove(&write) {
                // The call may have given up: nobody to tell then.
                let _ = tx.send(outcome);
            }
        }
        while let Some(send) = self.coalescer.poll_transmit() {
            let client = client.clone();
            let runtime = runtime.clone();
            self.sends.push(Box::pin(async move {
                for m in send.publish {
                    let mut headers = async_nats::HeaderMap::new();
                    for (name, value) in &m.headers {
                        headers.insert(*name, value.as_str());
                    }
                    // A message lost here leaves a gap: the commit is
                    // answered `incomplete` and the writes go single.
                    let _ = client
                        .publish_with_headers(m.subject, headers, m.payload.into())
                        .await;
                }
                let outcome = exec::send(&*runtime, &client, send.request).await;
                (send.id, outcome)
            }));
        }
    }
}
