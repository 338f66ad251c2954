//! The peer: etcd (Debian's `etcd-server`) on loopback with its own data directory,
//! driven through the `etcd-client` crate, doing what a lease user would do there:
//! acquire = a lease grant plus a put-if-absent transaction, renew = one keepalive,
//! release = a revoke, owner = a get. etcd has no forward. With `--r3` also a
//! three-member cluster on loopback (`etcd-r3`), the peer of the three-node NATS
//! cluster.

use std::ops::Range;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, LeaseKeepAliveStream, LeaseKeeper, PutOptions, Txn, TxnOp,
};
use futures::StreamExt;
use futures::future::BoxFuture;

use crate::load::{self, Op};
use crate::servers::free_port;

/// The lease TTL etcd's leases get, in seconds.
const TTL_S: i64 = 120;

/// A running etcd, one member or a cluster of three; killed (and its data
/// removed) when dropped.
pub struct Etcd {
    children: Vec<Child>,
    /// Every member's client URL.
    urls: Vec<String>,
    _dir: tempfile::TempDir,
}

/// The members of [`Etcd::start_cluster`].
pub const CLUSTER_MEMBERS: usize = 3;

/// Starts one member `name` of the cluster `initial_cluster`, its data under `dir`.
fn launch(
    name: &str,
    url: &str,
    peer: &str,
    initial_cluster: &str,
    dir: &Path,
    log: &Path,
) -> Child {
    let log = std::fs::File::create(log).expect("log");
    Command::new("etcd")
        .arg(format!("--name={name}"))
        .arg(format!("--data-dir={}", dir.join(name).display()))
        .arg(format!("--listen-client-urls={url}"))
        .arg(format!("--advertise-client-urls={url}"))
        .arg(format!("--listen-peer-urls={peer}"))
        .arg(format!("--initial-advertise-peer-urls={peer}"))
        .arg(format!("--initial-cluster={initial_cluster}"))
        .arg("--initial-cluster-token=dagnats-bench")
        .arg("--initial-cluster-state=new")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("cannot run etcd: install Debian's etcd-server (scripts/bench does)")
}

impl Etcd {
    /// Starts one `etcd` from the PATH on two free loopback ports.
    pub fn start(log_dir: &Path) -> Etcd {
        Etcd::start_members(log_dir, 1, "bench", "etcd")
    }

    /// Starts a three-member cluster (`e1`, `e2`, `e3`) on loopback, each member
    /// with its own data directory, fsync as shipped; logs `etcd-r3-e<i>.log`.
    pub fn start_cluster(log_dir: &Path) -> Etcd {
        Etcd::start_members(log_dir, CLUSTER_MEMBERS, "e", "etcd-r3")
    }

    fn start_members(log_dir: &Path, members: usize, prefix: &str, log: &str) -> Etcd {
        let dir = tempfile::Builder::new()
            .prefix("dagnats-bench-etcd-")
            .tempdir()
            .expect("temp dir");
        let name = |i: usize| {
            if members == 1 {
                prefix.to_string()
            } else {
                format!("{prefix}{}", i + 1)
            }
        };
        let ports: Vec<(u16, u16)> = (0..members).map(|_| (free_port(), free_port())).collect();
        let urls: Vec<String> = ports
            .iter()
            .map(|(c, _)| format!("http://127.0.0.1:{c}"))
            .collect();
        let peers: Vec<String> = ports
            .iter()
            .map(|(_, p)| format!("http://127.0.0.1:{p}"))
            .collect();
        let initial_cluster = (0..members)
            .map(|i| format!("{}={}", name(i), peers[i]))
            .collect::<Vec<_>>()
            .join(",");
        let children = (0..members)
            .map(|i| {
                let log = if members == 1 {
                    log_dir.join(format!("{log}.log"))
                } else {
                    log_dir.join(format!("{log}-{}.log", name(i)))
                };
                launch(
                    &name(i),
                    &urls[i],
                    &peers[i],
                    &initial_cluster,
                    dir.path(),
                    &log,
                )
            })
            .collect();
        Etcd {
            children,
            urls,
            _dir: dir,
        }
    }

    /// The client URL of the member that leads (the only one for a single member),
    /// once the members agree on a leader.
    pub async fn leader_url(&self) -> String {
        if self.urls.len() == 1 {
            return self.urls[0].clone();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            for url in &self.urls {
                if let Ok(mut c) = Client::connect([url.as_str()], None).await
                    && let Ok(status) = c.status().await
                    && status.leader() != 0
                    && status.header().map(|h| h.member_id()) == Some(status.leader())
                {
                    return url.clone();
                }
            }
            assert!(Instant::now() < deadline, "the etcd cluster has no leader");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A connected client of the leader (see [`Etcd::leader_url`]), once it
    /// answers: as on the NATS cluster, everything talks to the leader.
    pub async fn client(&self) -> Client {
        let deadline = Instant::now() + Duration::from_secs(30);
        let url = self.leader_url().await;
        loop {
            if let Ok(mut c) = Client::connect([url.as_str()], None).await
                && c.get("ready-probe", None).await.is_ok()
            {
                return c;
            }
            assert!(Instant::now() < deadline, "etcd did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The process ids of the members.
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }

    /// What `etcd --version` says.
    pub fn version(&self) -> String {
        let out = Command::new("etcd").arg("--version").output();
        out.ok()
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .next()
                    .and_then(|l| l.strip_prefix("etcd Version: "))
                    .map(str::to_string)
            })
            .unwrap_or_else(|| "?".to_string())
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A key held under a lease of its own; returns the lease id.
async fn hold(client: &Client, key: String) -> i64 {
    hold_for(client, key, TTL_S).await
}

/// A key held under a lease of its own of `ttl_s` seconds; returns the lease id.
pub async fn hold_for(client: &Client, key: String, ttl_s: i64) -> i64 {
    let mut c = client.clone();
    let lease = c.lease_grant(ttl_s, None).await.expect("grant").id();
    c.put(key, load::HOLDER, Some(PutOptions::new().with_lease(lease)))
        .await
        .expect("put");
    lease
}

async fn hold_many(client: &Client, keys: Vec<String>) -> Vec<i64> {
    futures::stream::iter(keys)
        .map(|k| hold(client, k))
        .buffered(64)
        .collect()
        .await
}

/// One operation against etcd, ready to run (see [`load::Target`]).
pub struct EtcdTarget {
    client: Client,
    plan: load::Plan,
    /// Release: one lease per call.
    leases: Vec<i64>,
    /// Owner: one key per worker.
    keys: Vec<String>,
    /// Renew: one keepalive stream per worker.
    keepers: Vec<tokio::sync::Mutex<(LeaseKeeper, LeaseKeepAliveStream)>>,
}

impl EtcdTarget {
    /// Sets up the calls of `plan`.
    pub async fn prepare(client: &Client, plan: &load::Plan) -> Arc<EtcdTarget> {
        let (concurrency, calls) = (plan.concurrency, plan.calls);
        let (mut leases, mut keys, mut keepers) = (Vec::new(), Vec::new(), Vec::new());
        match plan.op {
            Op::Acquire => {}
            Op::Release => {
                leases = hold_many(client, plan.keys(calls)).await;
            }
            Op::Renew => {
                for lease in hold_many(client, plan.keys(concurrency)).await {
                    let pair = client
                        .clone()
                        .lease_keep_alive(lease)
                        .await
                        .expect("keepalive stream");
                    keepers.push(tokio::sync::Mutex::new(pair));
                }
            }
            Op::Owner | Op::Forward => {
                keys = plan.keys(concurrency);
                hold_many(client, keys.clone()).await;
            }
        }
        Arc::new(EtcdTarget {
            client: client.clone(),
            plan: plan.clone(),
            leases,
            keys,
            keepers,
        })
    }
}

impl load::Target for EtcdTarget {
    fn work(self: Arc<Self>, w: usize, range: Range<usize>) -> BoxFuture<'static, Vec<Duration>> {
        Box::pin(async move {
            let mut c = self.client.clone();
            let mut lat = Vec::with_capacity(range.len());
            match self.plan.op {
                Op::Acquire => {
                    for i in range {
                        let key = self.plan.key(i);
                        let start = Instant::now();
                        let lease = c.lease_grant(TTL_S, None).await.expect("grant").id();
                        let txn = Txn::new()
                            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                            .and_then([TxnOp::put(
                                key.clone(),
                                load::HOLDER,
                                Some(PutOptions::new().with_lease(lease)),
                            )])
                            .or_else([TxnOp::get(key, None)]);
                        let reply = c.txn(txn).await.expect("txn");
                        lat.push(start.elapsed());
                        assert!(reply.succeeded(), "a fresh key is granted");
                    }
                }
                Op::Renew => {
                    let mut pair = self.keepers[w].lock().await;
                    let (keeper, stream) = &mut *pair;
                    for _ in range {
                        let start = Instant::now();
                        keeper.keep_alive().await.expect("keepalive");
                        let reply = stream.message().await.expect("keepalive reply");
                        lat.push(start.elapsed());
                        assert!(reply.is_some_and(|r| r.ttl() > 0), "the lease lives");
                    }
                }
                Op::Release => {
                    for i in range {
                        let start = Instant::now();
                        c.lease_revoke(self.leases[i]).await.expect("revoke");
                        lat.push(start.elapsed());
                    }
                }
                Op::Owner | Op::Forward => {
                    let key = self.keys[w].as_str();
                    for _ in range {
                        let start = Instant::now();
                        let reply = c.get(key, None).await.expect("get");
                        lat.push(start.elapsed());
                        assert_eq!(reply.kvs().len(), 1, "the key is held");
                    }
                }
            }
            lat
        })
    }
}

/// `etcdserverpb.LeaseKeepAliveRequest`: the lease to keep alive.
#[derive(Clone, PartialEq, prost::Message)]
struct KeepAliveRequest {
    /// The lease id.
    #[prost(int64, tag = "1")]
    id: i64,
}

/// `etcdserverpb.LeaseKeepAliveResponse`, without its header.
#[derive(Clone, PartialEq, prost::Message)]
struct KeepAliveResponse {
    /// The lease id.
    #[prost(int64, tag = "2")]
    id: i64,
    /// Its new TTL, seconds; 0 or less when etcd no longer has the lease.
    #[prost(int64, tag = "3")]
    ttl: i64,
}

/// What the keepalive streams counted.
#[derive(Default)]
pub struct KeepAliveCounts {
    /// Leases etcd answered with a TTL of 0 (expired or unknown): lost, each
    /// counted once.
    pub expired: AtomicU64,
    /// Keepalive replies received.
    pub replies: AtomicU64,
    /// Streams that ended or failed.
    pub broken: AtomicU64,
    /// Microseconds from each keepalive sent to its reply, since last taken.
    latencies_us: std::sync::Mutex<Vec<u32>>,
}

impl KeepAliveCounts {
    /// The latencies recorded since the last call, microseconds.
    pub fn take_latencies(&self) -> Vec<u32> {
        std::mem::take(&mut *self.latencies_us.lock().expect("latencies"))
    }
}

/// Keeps many etcd leases alive, each every `every`, over a few `LeaseKeepAlive`
/// streams that each carry many lease ids, as etcd's Go client keeps all of a
/// client's leases on one stream. (etcd-client's `lease_keep_alive` opens one
/// stream per lease and its keeper sends only that lease's id, so the streams are
/// opened here over tonic with the two messages declared above.)
pub struct KeepAlives {
    adders: Vec<futures::channel::mpsc::UnboundedSender<i64>>,
    next: usize,
    /// What the streams counted.
    pub counts: Arc<KeepAliveCounts>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl KeepAlives {
    /// `streams` streams to `url`, each on a connection of its own.
    pub async fn open(url: &str, streams: usize, every: Duration) -> KeepAlives {
        let counts = Arc::new(KeepAliveCounts::default());
        let (mut adders, mut tasks) = (Vec::new(), Vec::new());
        for _ in 0..streams.max(1) {
            let channel = tonic::transport::Endpoint::from_shared(url.to_string())
                .expect("etcd url")
                .connect()
                .await
                .expect("connect to etcd");
            let (tx, rx) = futures::channel::mpsc::unbounded();
            adders.push(tx);
            tasks.push(tokio::spawn(keep(channel, rx, every, counts.clone())));
        }
        KeepAlives {
            adders,
            next: 0,
            counts,
            tasks,
        }
    }

    /// Keeps `lease` alive from now on (its first keepalive in `every`), on the
    /// streams in turn.
    pub fn add(&mut self, lease: i64) {
        let i = self.next % self.adders.len();
        self.next += 1;
        let _ = self.adders[i].unbounded_send(lease);
    }

    /// Stops every stream.
    pub fn stop(self) {
        for t in self.tasks {
            t.abort();
        }
    }
}

/// One stream: each lease it was given is sent again `every` after its last send,
/// in the order they fell due; a reply with a TTL of 0 marks its lease lost (and
/// no longer sent).
async fn keep(
    channel: tonic::transport::Channel,
    mut add: futures::channel::mpsc::UnboundedReceiver<i64>,
    every: Duration,
    counts: Arc<KeepAliveCounts>,
) {
    use std::collections::{HashMap, HashSet, VecDeque};
    use std::sync::atomic::Ordering;
    // etcd answers the call once it has a reply to send: the stream opens with
    // its first lease's keepalive already queued.
    let Some(first) = add.next().await else {
        return;
    };
    let (tx, rx) = futures::channel::mpsc::unbounded::<KeepAliveRequest>();
    let mut due: VecDeque<(Instant, i64)> = VecDeque::new();
    let mut sent: HashMap<i64, Instant> = HashMap::new();
    let mut dead: HashSet<i64> = HashSet::new();
    let now = Instant::now();
    let _ = tx.unbounded_send(KeepAliveRequest { id: first });
    sent.insert(first, now);
    due.push_back((now + every, first));
    let mut grpc = tonic::client::Grpc::new(channel);
    let broken = || {
        counts.broken.fetch_add(1, Ordering::Relaxed);
    };
    if grpc.ready().await.is_err() {
        return broken();
    }
    let path =
        tonic::codegen::http::uri::PathAndQuery::from_static("/etcdserverpb.Lease/LeaseKeepAlive");
    let codec = tonic_prost::ProstCodec::<KeepAliveRequest, KeepAliveResponse>::default();
    let mut inbound = match grpc.streaming(tonic::Request::new(rx), path, codec).await {
        Ok(r) => r.into_inner(),
        Err(_) => return broken(),
    };
    loop {
        let next_due = due
            .front()
            .map_or_else(|| Instant::now() + Duration::from_secs(3600), |d| d.0);
        tokio::select! {
            lease = add.next() => match lease {
                // Due after every lease already here: the queue stays in order.
                Some(lease) => due.push_back((Instant::now() + every, lease)),
                None => return,
            },
            reply = inbound.message() => match reply {
                Ok(Some(r)) => {
                    counts.replies.fetch_add(1, Ordering::Relaxed);
                    if let Some(t) = sent.remove(&r.id) {
                        let us = t.elapsed().as_micros().min(u32::MAX as u128) as u32;
                        counts.latencies_us.lock().expect("latencies").push(us);
                    }
                    if r.ttl <= 0 && dead.insert(r.id) {
                        counts.expired.fetch_add(1, Ordering::Relaxed);
                    }
                }
                _ => return broken(),
            },
            _ = tokio::time::sleep_until(next_due.into()) => {
                let now = Instant::now();
                while let Some(&(t, id)) = due.front()
                    && t <= now
                {
                    due.pop_front();
                    if dead.contains(&id) {
                        continue;
                    }
                    let _ = tx.unbounded_send(KeepAliveRequest { id });
                    sent.insert(id, now);
                    due.push_back((now + every, id));
                }
            }
        }
    }
}
