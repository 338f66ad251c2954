//! Tests of the three-node cluster harness, against real nats-server processes.

use std::time::{Duration, Instant};

use dagnats_leases_tests::NatsCluster;
use dagnats_leases_tests::cluster::NODES;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

/// Creates stream `T` (R3, file) and stores one message through node `via`.
fn create_r3_with_one_message(cluster: &NatsCluster, via: usize) {
    let created = cluster
        .js_api(
            via,
            "$JS.API.STREAM.CREATE.T",
            &json!({"name": "T", "subjects": ["t.>"], "storage": "file", "num_replicas": 3}),
        )
        .expect("create T");
    assert!(created.get("error").is_none(), "{created}");
    // The create returns before the stream's own group has elected a leader; until
    // then a publish finds no responders.
    let mut ack = Value::Null;
    eventually("the new stream takes a publish", || {
        match cluster.js_api(via, "t.one", &json!("hello")) {
            Ok(a) => {
                ack = a;
                true
            }
            // Only "nobody took it" is retried: a timeout may have stored it.
            Err(e) if e.contains("no responders") => false,
            Err(e) => panic!("publish: {e}"),
        }
    });
    assert_eq!(ack["seq"], 1, "{ack}");
}

/// Polls until `f` is true; panics after `WAIT` with `what`.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !f() {
        assert!(Instant::now() < deadline, "not within {WAIT:?}: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn messages_via(cluster: &NatsCluster, via: usize) -> Option<u64> {
    let info: Value = cluster
        .js_api(via, "$JS.API.STREAM.INFO.T", &json!({}))
        .ok()?;
    info["state"]["messages"].as_u64()
}

#[test]
fn three_nodes_form_one_jetstream_cluster_with_fsync_always() {
    let mut cluster = NatsCluster::start();
    for i in 0..NODES {
        let node = cluster.node(i);
        assert_eq!(node.info().server_name, NatsCluster::name_of(i));
        assert!(node.cluster_port().is_some());
        let conf = std::fs::read_to_string(node.config_path()).unwrap();
        assert!(conf.contains("sync_interval: always"), "{conf}");
        assert!(conf.contains("routes: ["), "{conf}");
    }
    let dirs: std::collections::HashSet<_> = (0..NODES)
        .map(|i| cluster.node(i).store_dir().to_path_buf())
        .collect();
    assert_eq!(dirs.len(), NODES, "each node has its own store");

    create_r3_with_one_message(&cluster, 0);
    let leader = cluster.wait_stream_leader("T", WAIT);
    let info = cluster
        .js_api(leader, "$JS.API.STREAM.INFO.T", &json!({}))
        .unwrap();
    let replicas = info["cluster"]["replicas"].as_array().expect("replicas");
    assert_eq!(replicas.len(), NODES - 1, "{info}");
    for i in 0..NODES {
        eventually("every node answers for T", || {
            messages_via(&cluster, i) == Some(1)
        });
    }
    println!("stream T led by {}", NatsCluster::name_of(leader));
}

#[test]
fn a_killed_leader_is_replaced_and_rejoins_after_restart() {
    let mut cluster = NatsCluster::start();
    create_r3_with_one_message(&cluster, 1);
    let old = cluster.wait_stream_leader("T", WAIT);
    let port = cluster.node(old).cluster_port();
    cluster.kill(old);
    assert!(!cluster.node_mut(old).is_running());
    let new = cluster.wait_stream_leader("T", WAIT);
    assert_ne!(new, old, "a surviving node leads");
    cluster.restart(old);
    assert_eq!(
        cluster.node(old).cluster_port(),
        port,
        "cluster port pinned"
    );
    eventually("the restarted node serves T again", || {
        messages_via(&cluster, old) == Some(1)
    });
    println!(
        "leader {} killed, {} took over, {} rejoined",
        NatsCluster::name_of(old),
        NatsCluster::name_of(new),
        NatsCluster::name_of(old)
    );
}

#[test]
fn an_isolated_node_loses_the_cluster_until_healed() {
    let mut cluster = NatsCluster::start();
    create_r3_with_one_message(&cluster, 0);
    let leader = cluster.wait_stream_leader("T", WAIT);
    let cut = (leader + 1) % NODES; // a follower
    cluster.isolate(cut);
    eventually("the isolated follower sees no stream leader", || {
        cluster.stream_leader_via(cut, "T").is_none()
    });
    // The majority still writes (retried: on a busy machine a reply may be slow).
    let mut seq = 0;
    eventually("the majority stores a message", || {
        let ack = cluster.js_api(leader, "t.two", &json!("x"));
        seq = ack.ok().and_then(|a| a["seq"].as_u64()).unwrap_or(0);
        seq >= 2
    });
    cluster.heal();
    eventually("the healed node catches up", || {
        messages_via(&cluster, cut) == Some(seq)
    });
}

#[test]
fn pause_freezes_a_node_and_resume_thaws_it() {
    let mut cluster = NatsCluster::start();
    cluster.pause(2);
    assert!(cluster.node(2).is_paused());
    let err = cluster
        .js_api(2, "$JS.API.INFO", &json!({}))
        .expect_err("a frozen node answers nothing");
    assert!(err.contains("no reply") || err.contains("INFO"), "{err}");
    cluster.resume(2);
    assert!(!cluster.node(2).is_paused());
    cluster.wait_jetstream(WAIT);
}

#[test]
fn a_whole_cluster_kill_keeps_acknowledged_messages() {
    let mut cluster = NatsCluster::start();
    create_r3_with_one_message(&cluster, 2);
    cluster.kill_all();
    for i in 0..NODES {
        assert!(!cluster.node_mut(i).is_running());
    }
    cluster.restart_all();
    cluster.wait_stream_leader("T", WAIT);
    for i in 0..NODES {
        eventually("T kept its message", || {
            messages_via(&cluster, i) == Some(1)
        });
    }
}
