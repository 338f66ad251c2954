//! How a [`NatsServer`](super::NatsServer) is configured: which binary runs, the
//! options a test sets, and the configuration file they are written as.

use super::*;

/// Which nats-server binary to run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Binary {
    /// v2.15.1 from `.nats/bin/nats-server`, or `$DAGNATS_NATS_SERVER`.
    #[default]
    Supported,
    /// v2.11.11, the oldest supported, from `.nats/bin-2.11/nats-server`, or
    /// `$DAGNATS_NATS_SERVER_OLDEST`.
    Oldest,
    /// Debian's v2.9.10 from `/usr/sbin/nats-server`, or `$DAGNATS_NATS_SERVER_LEGACY`.
    Legacy,
    /// This exact path.
    Path(PathBuf),
}

impl Binary {
    /// The path this binary resolves to, and where that choice came from.
    pub(super) fn resolve(&self) -> (PathBuf, String) {
        let from_env = |var: &str| {
            std::env::var_os(var)
                .filter(|v| !v.is_empty())
                .map(|v| (PathBuf::from(v), format!("${var}")))
        };
        match self {
            Binary::Supported => from_env(ENV_SERVER).unwrap_or_else(|| {
                let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
                let root = manifest.parent().unwrap_or(manifest);
                (
                    root.join(".nats/bin/nats-server"),
                    "the checkout's .nats/bin".to_owned(),
                )
            }),
            Binary::Oldest => from_env(ENV_SERVER_OLDEST).unwrap_or_else(|| {
                let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
                let root = manifest.parent().unwrap_or(manifest);
                (
                    root.join(".nats/bin-2.11/nats-server"),
                    "the checkout's .nats/bin-2.11".to_owned(),
                )
            }),
            Binary::Legacy => from_env(ENV_SERVER_LEGACY).unwrap_or_else(|| {
                (
                    PathBuf::from(LEGACY_DEFAULT_PATH),
                    "Debian's package".to_owned(),
                )
            }),
            Binary::Path(p) => (p.clone(), "an explicit path".to_owned()),
        }
    }
}

/// How to start a [`NatsServer`]; a builder. Get one from [`NatsServer::builder`].
///
/// Every setting except the binary goes into a generated configuration file that
/// the server reads on every (re)start. A cluster node ([`cluster`](Self::cluster),
/// used by [`NatsCluster`](crate::NatsCluster)) reads its cluster port from the same ports file as the
/// client port, and pins it for restarts the same way.
#[derive(Clone, Debug)]
pub struct NatsServerOptions {
    pub(super) binary: Binary,
    pub(super) port: Option<u16>,
    server_name: Option<String>,
    max_payload: Option<u32>,
    sync_always: bool,
    jetstream: bool,
    extra_config: Vec<String>,
    pub(super) cluster: Option<ClusterConfig>,
    pub(super) ready_timeout: Duration,
}

/// The `cluster { .. }` block of one node (see [`NatsServerOptions::cluster`]).
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// The cluster's name, the same on every node.
    pub name: String,
    /// Route URLs this node dials, e.g. `nats-route://127.0.0.1:6222`.
    pub routes: Vec<String>,
    /// The address gossiped to other nodes for implicit routes (`advertise`); `None`
    /// gossips the listen address.
    pub advertise: Option<String>,
}

impl Default for NatsServerOptions {
    fn default() -> Self {
        Self {
            binary: Binary::Supported,
            port: None,
            server_name: None,
            max_payload: None,
            sync_always: false,
            jetstream: true,
            extra_config: Vec::new(),
            cluster: None,
            ready_timeout: Duration::from_secs(5),
        }
    }
}

impl NatsServerOptions {
    /// The defaults: v2.15.1, a free port, JetStream on, the server's own limits.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs this binary instead of v2.15.1.
    pub fn binary(mut self, binary: Binary) -> Self {
        self.binary = binary;
        self
    }

    /// Runs Debian's v2.9.10 (shorthand for `binary(Binary::Legacy)`).
    pub fn legacy(self) -> Self {
        self.binary(Binary::Legacy)
    }

    /// Listens on this port instead of one the kernel picks. Start fails if it is taken.
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    /// Sets `server_name` (needed for JetStream clusters; stable across restarts).
    pub fn server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }

    /// Sets `max_payload`, the largest message the server accepts, in bytes.
    pub fn max_payload(mut self, bytes: u32) -> Self {
        self.max_payload = Some(bytes);
        self
    }

    /// Sets JetStream's `sync_interval: always` (fsync before every ack). Not known
    /// to v2.9.10, which refuses to start with it.
    pub fn sync_always(mut self, on: bool) -> Self {
        self.sync_always = on;
        self
    }

    /// Turns JetStream on (the default) or off.
    pub fn jetstream(mut self, on: bool) -> Self {
        self.jetstream = on;
        self
    }

    /// Appends a raw line (or block) to the generated configuration file.
    pub fn config(mut self, text: impl Into<String>) -> Self {
        self.extra_config.push(text.into());
        self
    }

    /// Makes the server a cluster node: a `cluster { .. }` block listening on a loopback
    /// port the kernel picks on the first start (read from the ports file, then pinned
    /// for restarts, like the client port), dialing `config.routes`.
    pub fn cluster(mut self, config: ClusterConfig) -> Self {
        self.cluster = Some(config);
        self
    }

    /// Bounds how long a (re)start waits for the server to accept connections.
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }

    /// Starts the server; panics with the reason (and the server's log) if it fails.
    #[track_caller]
    pub fn start(self) -> NatsServer {
        match self.try_start() {
            Ok(server) => server,
            Err(e) => panic!("{e}"),
        }
    }

    /// Starts the server, or says why it did not start.
    pub fn try_start(self) -> Result<NatsServer, StartError> {
        NatsServer::launch(self)
    }

    /// The configuration file's text for this store directory; `cluster_port` 0 lets
    /// the kernel pick the cluster port.
    pub(super) fn config_text(&self, store_dir: &Path, cluster_port: u16) -> String {
        let mut conf = String::from("# Generated by dagnats-leases-tests.\n");
        if let Some(name) = &self.server_name {
            conf += &format!("server_name: {}\n", quote(name));
        }
        if let Some(bytes) = self.max_payload {
            conf += &format!("max_payload: {bytes}\n");
        }
        if self.jetstream {
            conf += "jetstream {\n";
            conf += &format!("  store_dir: {}\n", quote(&store_dir.to_string_lossy()));
            if self.sync_always {
                conf += "  sync_interval: always\n";
            }
            conf += "}\n";
        }
        if let Some(cluster) = &self.cluster {
            let port = if cluster_port == 0 {
                "-1".to_owned()
            } else {
                cluster_port.to_string()
            };
            conf += "cluster {\n";
            conf += &format!("  name: {}\n", quote(&cluster.name));
            conf += &format!("  listen: {}\n", quote(&format!("{HOST}:{port}")));
            if let Some(advertise) = &cluster.advertise {
                conf += &format!("  advertise: {}\n", quote(advertise));
            }
            let routes: Vec<String> = cluster.routes.iter().map(|r| quote(r)).collect();
            conf += &format!("  routes: [{}]\n", routes.join(", "));
            conf += "}\n";
        }
        for extra in &self.extra_config {
            conf += extra;
            conf += "\n";
        }
        conf
    }
}

/// A double-quoted string for the NATS configuration format (JSON escaping is valid there).
fn quote(s: &str) -> String {
    serde_json::to_string(s).expect("a string always serializes")
}
