//! The peer: etcd (Debian's `etcd-server`) on loopback with its own data directory,
//! driven through the `etcd-client` crate, doing what a lease user would do there:
//! acquire = a lease grant plus a put-if-absent transaction, renew = one keepalive,
//! release = a revoke, owner = a get. etcd has no forward.

use std::ops::Range;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
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

/// A running etcd; killed (and its data removed) when dropped.
pub struct Etcd {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Etcd {
    /// Starts `etcd` from the PATH on two free loopback ports.
    pub fn start(log_dir: &Path) -> Etcd {
        let dir = tempfile::Builder::new()
            .prefix("dagnats-bench-etcd-")
            .tempdir()
            .expect("temp dir");
        let (client_port, peer_port) = (free_port(), free_port());
        let url = format!("http://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let log = std::fs::File::create(log_dir.join("etcd.log")).expect("log");
        let child = Command::new("etcd")
            .arg("--name=bench")
            .arg(format!("--data-dir={}", dir.path().join("data").display()))
            .arg(format!("--listen-client-urls={url}"))
            .arg(format!("--advertise-client-urls={url}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=bench={peer}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("cannot run etcd: install Debian's etcd-server (scripts/bench does)");
        Etcd {
            child,
            url,
            _dir: dir,
        }
    }

    /// A connected client, once etcd answers.
    pub async fn client(&self) -> Client {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(mut c) = Client::connect([self.url.as_str()], None).await
                && c.get("ready-probe", None).await.is_ok()
            {
                return c;
            }
            assert!(Instant::now() < deadline, "etcd did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
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
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A key held under a lease of its own; returns the lease id.
async fn hold(client: &Client, key: String) -> i64 {
    let mut c = client.clone();
    let lease = c.lease_grant(TTL_S, None).await.expect("grant").id();
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
    op: Op,
    tag: String,
    concurrency: usize,
    /// Release: one lease per call.
    leases: Vec<i64>,
    /// Owner: one key per worker.
    keys: Vec<String>,
    /// Renew: one keepalive stream per worker.
    keepers: Vec<tokio::sync::Mutex<(LeaseKeeper, LeaseKeepAliveStream)>>,
}

impl EtcdTarget {
    /// Sets up `calls` calls of `op` at `concurrency`.
    pub async fn prepare(
        client: &Client,
        op: Op,
        tag: &str,
        concurrency: usize,
        calls: usize,
    ) -> Arc<EtcdTarget> {
        let name = op.name();
        let (mut leases, mut keys, mut keepers) = (Vec::new(), Vec::new(), Vec::new());
        match op {
            Op::Acquire => {}
            Op::Release => {
                let keys = (0..calls)
                    .map(|i| format!("{name}-{tag}-{concurrency}-{i}"))
                    .collect();
                leases = hold_many(client, keys).await;
            }
            Op::Renew => {
                let keys = (0..concurrency)
                    .map(|w| format!("{name}-{tag}-{concurrency}-{w}"))
                    .collect();
                for lease in hold_many(client, keys).await {
                    let pair = client
                        .clone()
                        .lease_keep_alive(lease)
                        .await
                        .expect("keepalive stream");
                    keepers.push(tokio::sync::Mutex::new(pair));
                }
            }
            Op::Owner | Op::Forward => {
                keys = (0..concurrency)
                    .map(|w| format!("{name}-{tag}-{concurrency}-{w}"))
                    .collect();
                hold_many(client, keys.clone()).await;
            }
        }
        Arc::new(EtcdTarget {
            client: client.clone(),
            op,
            tag: tag.to_string(),
            concurrency,
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
            let name = self.op.name();
            match self.op {
                Op::Acquire => {
                    for i in range {
                        let key = format!("{name}-{}-{}-{i}", self.tag, self.concurrency);
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
