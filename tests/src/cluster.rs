//! A three-node nats-server cluster on loopback, with faults on single nodes, on the
//! whole cluster, and on the links between nodes.
//!
//! Each node is a [`NatsServer`] with `server_name` `n1`, `n2`, `n3`, JetStream in its
//! own store directory with `sync_interval: always` (Jepsen's analysis of NATS
//! 2.12.1 lost acknowledged writes after crashes under the default lazy fsync), and
//! a `cluster { .. }` block. Routes go through cuttable relays ([`Link`], one per
//! ordered pair of nodes), so that [`NatsCluster::isolate`] can cut one node off
//! from the others while it keeps serving its clients. Each node gossips a dead
//! address (`advertise`), so no node can learn another's real cluster port and dial
//! around a cut.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::proxy::Link;
use crate::{ClusterConfig, NatsServer};

/// How many nodes [`NatsCluster::start`] runs.
pub const NODES: usize = 3;
/// The cluster's name.
pub const CLUSTER_NAME: &str = "dagnats-test";
/// How long a cluster start (or restart) waits for JetStream to be ready.
const JS_READY_TIMEOUT: Duration = Duration::from_secs(30);
/// An address where nothing listens (port 1 on loopback): what nodes gossip.
const DEAD_ADVERTISE: &str = "127.0.0.1:1";
const POLL: Duration = Duration::from_millis(50);

/// Three nats-server processes forming one JetStream cluster on loopback.
///
/// Dropping it kills every node and removes their directories.
pub struct NatsCluster {
    nodes: Vec<NatsServer>,
    /// `links[from][to]`: the relay node `from` dials to reach node `to` (none for `from == to`).
    links: Vec<Vec<Option<Link>>>,
}

impl std::fmt::Debug for NatsCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsCluster")
            .field("urls", &self.urls())
            .finish()
    }
}

impl NatsCluster {
    /// Starts three nodes and waits until JetStream answers on each (a meta leader
    /// is elected and every node knows it). Panics if that takes over 30 s.
    #[track_caller]
    pub fn start() -> NatsCluster {
        let mut links: Vec<Vec<Option<Link>>> = (0..NODES)
            .map(|from| {
                (0..NODES)
                    .map(|to| (from != to).then(|| Link::bind().expect("bind a route relay")))
                    .collect()
            })
            .collect();
        let mut nodes: Vec<NatsServer> = Vec::with_capacity(NODES);
        for (i, row) in links.iter().enumerate() {
            let routes = row
                .iter()
                .flatten()
                .map(|link| format!("nats-route://{}", link.addr()))
                .collect();
            let node = NatsServer::builder()
                .server_name(Self::name_of(i))
                .sync_always(true)
                .cluster(ClusterConfig {
                    name: CLUSTER_NAME.to_owned(),
                    routes,
                    advertise: Some(DEAD_ADVERTISE.to_owned()),
                })
                .ready_timeout(Duration::from_secs(10))
                .start();
            nodes.push(node);
        }
        for (to, node) in nodes.iter().enumerate() {
            let target = SocketAddr::from(([127, 0, 0, 1], node.cluster_port().unwrap()));
            for row in links.iter_mut() {
                if let Some(link) = &row[to] {
                    link.set_target(target);
                }
            }
        }
        let cluster = NatsCluster { nodes, links };
        cluster.wait_jetstream(JS_READY_TIMEOUT);
        cluster
    }

    /// The `server_name` of node `i`: `n1`, `n2`, `n3`.
    pub fn name_of(i: usize) -> String {
        format!("n{}", i + 1)
    }

    /// The node with this `server_name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        (0..NODES).find(|&i| Self::name_of(i) == name)
    }

    /// Node `i`.
    pub fn node(&self, i: usize) -> &NatsServer {
        &self.nodes[i]
    }

    /// Node `i`, to act on it directly.
    pub fn node_mut(&mut self, i: usize) -> &mut NatsServer {
        &mut self.nodes[i]
    }

    /// Node `i`'s client URL.
    pub fn url(&self, i: usize) -> String {
        self.nodes[i].url()
    }

    /// Every node's client URL, node 1 first.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(NatsServer::url).collect()
    }

    /// Every node's client URL starting at node `first` (a client that prefers that node
    /// but fails over to the others).
    pub fn urls_from(&self, first: usize) -> Vec<String> {
        (0..NODES).map(|k| self.url((first + k) % NODES)).collect()
    }

    /// The node leading the JetStream meta group, as the nodes' logs tell it: the
    /// newest line of any running node saying who won the meta group's vote
    /// (`Self is new JetStream cluster metadata leader` from the winner,
    /// `JetStream cluster new metadata leader: <name>/<cluster>` from the others),
    /// `None` if the newest says there is none. Logs are read because a meta step-down, or
    /// the servers' `jsz` report, needs a system account these clusters have not.
    pub fn meta_leader(&mut self) -> Option<usize> {
        let mut newest: Option<(String, Option<usize>)> = None;
        for i in 0..NODES {
            if !self.nodes[i].is_running() {
                continue;
            }
            for line in self.nodes[i].log().lines() {
                let said = if line.contains("Self is new JetStream cluster metadata leader") {
                    Some(Some(i))
                } else if let Some((_, rest)) =
                    line.split_once("JetStream cluster new metadata leader: ")
                {
                    let name = rest.split('/').next().unwrap_or(rest).trim();
                    Some(self.index_of(name))
                } else if line.contains("JetStream cluster no metadata leader") {
                    Some(None)
                } else {
                    None
                };
                // `[pid] 2026/12/05 08:50:34.749979 [INF] ...`: the time sorts as text.
                if let (Some(leader), Some(at)) = (said, line.split(' ').nth(2)) {
                    let at = format!("{} {at}", line.split(' ').nth(1).unwrap_or_default());
                    if newest.as_ref().is_none_or(|(t, _)| at >= *t) {
                        newest = Some((at, leader));
                    }
                }
            }
        }
        newest.and_then(|(_, leader)| leader)
    }

    /// Kills node `i` at once (SIGKILL).
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].kill();
    }

    /// Starts node `i` again (same ports, same store) after a kill, or restarts it
    /// gracefully if it runs.
    #[track_caller]
    pub fn restart(&mut self, i: usize) {
        self.nodes[i].restart();
    }

    /// Freezes node `i` (SIGSTOP).
    pub fn pause(&mut self, i: usize) {
        self.nodes[i].pause();
    }

    /// Lets node `i` run again (SIGCONT).
    pub fn resume(&mut self, i: usize) {
        self.nodes[i].resume();
    }

    /// Kills every node at once (SIGKILL), as a power loss would.
    pub fn kill_all(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
    }

    /// Starts every node that is not running, then waits for JetStream on all.
    #[track_caller]
    pub fn restart_all(&mut self) {
        for node in &mut self.nodes {
            if !node.is_running() {
                node.restart();
            }
        }
        self.wait_jetstream(JS_READY_TIMEOUT);
    }

    /// Cuts every route link to and from node `i`: it keeps serving its clients but
    /// cannot reach the other two nodes.
    pub fn isolate(&self, i: usize) {
        for (from, row) in self.links.iter().enumerate() {
            for (to, link) in row.iter().enumerate() {
                if let Some(link) = link
                    && (from == i || to == i)
                {
                    link.cut();
                }
            }
        }
    }

    /// Restores every route link.
    pub fn heal(&self) {
        self.links.iter().flatten().flatten().for_each(Link::heal);
    }

    /// Sends a JetStream API request through node `i` and returns its JSON reply.
    pub fn js_api(&self, i: usize, subject: &str, body: &Value) -> Result<Value, String> {
        crate::probe::request_json(self.nodes[i].addr(), subject, body, Duration::from_secs(2))
    }

    /// The node that leads `stream` now, as node `via` sees it; `None` while there is
    /// no leader or the question gets no answer.
    pub fn stream_leader_via(&self, via: usize, stream: &str) -> Option<usize> {
        let info = self
            .js_api(via, &format!("$JS.API.STREAM.INFO.{stream}"), &json!({}))
            .ok()?;
        let leader = info["cluster"]["leader"].as_str()?;
        self.index_of(leader)
    }

    /// Polls the running nodes until one names `stream`'s leader; panics after `timeout`.
    #[track_caller]
    pub fn wait_stream_leader(&mut self, stream: &str, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
            for via in 0..NODES {
                if self.nodes[via].is_running()
                    && !self.nodes[via].is_paused()
                    && let Some(leader) = self.stream_leader_via(via, stream)
                {
                    return leader;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no leader for stream {stream} within {timeout:?}"
            );
            std::thread::sleep(POLL);
        }
    }

    /// Polls until `$JS.API.INFO` answers without error on every running node, and,
    /// with all three running, until a three-replica stream can be placed (the meta
    /// group knows every peer): a probe stream is created and deleted.
    #[track_caller]
    pub fn wait_jetstream(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        self.wait_api(deadline, timeout);
        if self.nodes.iter().all(|n| n.pid().is_some()) {
            let body = json!({"name": "HARNESS_READY", "subjects": ["harness.ready"],
                "storage": "memory", "num_replicas": NODES});
            loop {
                let last = match self.js_api(0, "$JS.API.STREAM.CREATE.HARNESS_READY", &body) {
                    Ok(v) if v.get("error").is_none() => break,
                    Ok(v) => v.to_string(),
                    Err(e) => e,
                };
                assert!(
                    Instant::now() < deadline,
                    "no three-replica placement within {timeout:?}: {last}"
                );
                std::thread::sleep(POLL);
            }
            let _ = self.js_api(0, "$JS.API.STREAM.DELETE.HARNESS_READY", &json!({}));
        }
    }

    #[track_caller]
    fn wait_api(&self, deadline: Instant, timeout: Duration) {
        for i in 0..NODES {
            if self.nodes[i].pid().is_none() {
                continue;
            }
            loop {
                let last = match self.js_api(i, "$JS.API.INFO", &json!({})) {
                    Ok(v) if v.get("error").is_none() => break,
                    Ok(v) => v.to_string(),
                    Err(e) => e,
                };
                assert!(
                    Instant::now() < deadline,
                    "JetStream not ready on {} within {timeout:?}: {last}",
                    Self::name_of(i)
                );
                std::thread::sleep(POLL);
            }
        }
    }
}

/// A lease service connected to the node at `url`, its bucket R3, the rest as
/// `options` says: how the cluster suites start one instance per node.
pub async fn start_r3_service(
    url: String,
    options: dagnats_leases_tokio::service::ServiceOptions,
) -> dagnats_leases_tokio::service::ServiceHandle {
    let client = async_nats::ConnectOptions::new()
        .connect(url.clone())
        .await
        .expect("connect the service");
    let mut options = options;
    options.bucket.replicas = Some(3);
    dagnats_leases_tokio::service::start((url, client), options)
        .await
        .expect("service starts")
}
