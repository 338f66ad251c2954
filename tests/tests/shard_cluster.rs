//! The sharded bucket on a real three-node cluster: three R3 shards whose leaders
//! are spread one per node (moved there by a leader step-down with a preferred
//! successor, as docs/operations.md tells operators), then the node leading one
//! shard is killed. While that shard elects a new leader, the keys of the other two
//! shards keep being answered; the calls against the killed shard that went
//! unanswered (timed out, or answered `unavailable`) are counted and printed.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use dagnats_leases_core::shard::ShardMap;
use dagnats_leases_tests::NatsCluster;
use dagnats_leases_tests::cluster::NODES;
use dagnats_leases_tokio::service::{BucketOptions, ServiceConfig, ServiceHandle, ServiceOptions};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);
/// How long the test waits for one call's reply: past the service's own bound on
/// the JetStream requests a call makes one after another (`kv_timeout` each: an
/// acquire's read, write and read confirmation at most), so a call the service
/// gave up on is answered.
const CALL: Duration = Duration::from_secs(7);
const KV_TIMEOUT: Duration = Duration::from_secs(2);

fn shards() -> ShardMap {
    ShardMap::new(3).unwrap()
}

/// One key per shard: `keys[i]` lives in shard `i`.
fn key_per_shard(shards: ShardMap) -> Vec<String> {
    (0..shards.count())
        .map(|i| {
            (0..)
                .map(|n| format!("spread-{n}"))
                .find(|k| shards.shard_of(k) == i)
                .unwrap()
        })
        .collect()
}

async fn start_service(url: String) -> ServiceHandle {
    let options = ServiceOptions::from(ServiceConfig {
        bucket: BucketOptions {
            shards: shards(),
            ..BucketOptions::default()
        },
        kv_timeout: KV_TIMEOUT,
        ..ServiceConfig::default()
    });
    dagnats_leases_tests::cluster::start_r3_service(url, options).await
}

/// Moves the leader of `stream` to node `want`: a step-down naming it as the
/// preferred successor, then the server's leader-elected advisory (subscribed to
/// before the step-down) says who won; asked again while it goes elsewhere.
async fn move_leader(
    cluster: &NatsCluster,
    client: &async_nats::Client,
    stream: &str,
    want: usize,
) {
    use futures::StreamExt;
    let deadline = Instant::now() + WAIT;
    let want_name = NatsCluster::name_of(want);
    let body = json!({"placement": {"preferred": want_name}});
    let mut elected = client
        .subscribe(format!("$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.{stream}"))
        .await
        .expect("subscribe to the leader advisory");
    client.flush().await.expect("the subscription is in place");
    let info = client
        .request(format!("$JS.API.STREAM.INFO.{stream}"), "{}".into())
        .await
        .expect("stream info");
    let info: Value = serde_json::from_slice(&info.payload).unwrap();
    let mut now = info["cluster"]["leader"]
        .as_str()
        .and_then(|n| cluster.index_of(n));
    while now != Some(want) {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "the leader of {stream} did not move to node {want} (it is {now:?})"
        );
        // Refused while there is no leader (an election under way): that
        // election's end is the advisory waited on below.
        let _ = client
            .request(
                format!("$JS.API.STREAM.LEADER.STEPDOWN.{stream}"),
                body.to_string().into(),
            )
            .await;
        let advisory = tokio::time::timeout(left, elected.next())
            .await
            .unwrap_or_else(|_| panic!("no leader elected for {stream} within {WAIT:?}"))
            .expect("the advisory subscription ended");
        let v: Value = serde_json::from_slice(&advisory.payload).unwrap();
        now = v["leader"].as_str().and_then(|n| cluster.index_of(n));
    }
}

/// Whether a call was answered: a reply that is not `unavailable` in time.
async fn answered(client: &async_nats::Client, endpoint: &str, body: Value) -> bool {
    unanswered_because(client, endpoint, body).await.is_none()
}

/// Why a call was not answered (`None`: it was): no reply within [`CALL`], a
/// request error, or the service's `unavailable` reply, whose message says which
/// JetStream step failed.
async fn unanswered_because(
    client: &async_nats::Client,
    endpoint: &str,
    body: Value,
) -> Option<String> {
    let request = client.request(format!("api.leases.{endpoint}"), body.to_string().into());
    match tokio::time::timeout(CALL, request).await {
        Ok(Ok(reply)) => {
            let v: Value = serde_json::from_slice(&reply.payload).unwrap();
            (v["kind"] == "unavailable").then(|| format!("{endpoint}: {v}"))
        }
        Ok(Err(e)) => Some(format!("{endpoint}: request failed: {e}")),
        Err(_) => Some(format!("{endpoint}: no reply within {CALL:?}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_leaders_spread_over_nodes_and_one_nodes_loss_stalls_only_its_shard() {
    let mut cluster = tokio::task::spawn_blocking(NatsCluster::start)
        .await
        .unwrap();
    let shards = shards();
    let mut services = Vec::new();
    for i in 0..NODES {
        services.push(start_service(cluster.url(i)).await);
    }
    // Shard i's leader on node i: one pipeline per node.
    let admin = async_nats::ConnectOptions::new()
        .connect(cluster.urls().as_slice())
        .await
        .expect("connect an operator");
    for i in shards.indexes() {
        move_leader(&cluster, &admin, &shards.stream(i), i as usize).await;
    }
    let leaders: Vec<usize> = shards
        .indexes()
        .map(|i| {
            (0..NODES)
                .find_map(|via| cluster.stream_leader_via(via, &shards.stream(i)))
                .unwrap()
        })
        .collect();
    let spread: BTreeSet<usize> = leaders.iter().copied().collect();
    assert_eq!(
        spread.len(),
        NODES,
        "one shard leader per node: {leaders:?}"
    );
    println!("shard cluster: leaders of KV_leases_0..2 on nodes {leaders:?}");

    // A node leading a shard, but not the JetStream meta group, goes; callers and
    // services on the other two stay. Losing the meta leader is another fault:
    // until the meta group elects again, a stream's followers answer a leader read
    // "temporarily unavailable" (10008) when its leader is slower than their
    // delayed error, on every shard (seen under load: 1 call of 292 on a shard
    // whose leader lived), and the service answers `unavailable`, as the contract
    // says, for the caller to retry. The fault suite kills nodes regardless.
    let meta = cluster.meta_leader();
    let killed_shard = (0..NODES)
        .find(|&i| Some(leaders[i]) != meta)
        .expect("two of three nodes do not lead the meta group");
    let victim = leaders[killed_shard];
    println!("shard cluster: meta leader {meta:?}; killing the leader of shard {killed_shard}");
    let urls: Vec<String> = (0..NODES)
        .filter(|&i| i != victim)
        .map(|i| cluster.url(i))
        .collect();
    let client = async_nats::ConnectOptions::new()
        .connect(urls.as_slice())
        .await
        .expect("connect a caller");
    let keys = key_per_shard(shards);
    for key in &keys {
        // Granted once the shard's new leader settled after the moves.
        let deadline = Instant::now() + WAIT;
        while !answered(
            &client,
            "acquire",
            json!({"key": key, "holder": "h", "ttl_ms": 60_000}),
        )
        .await
        {
            assert!(Instant::now() < deadline, "{key} was never granted");
        }
    }
    // The victim's own service stops first, so the cluster no longer routes calls
    // to its queue subscriptions: a call sent to a node that just died is lost
    // whatever its shard, which would say nothing about the shards.
    services.remove(victim).shutdown().await;
    cluster.kill(victim);

    // Rounds of one owner call and one idempotent acquire per shard, at once,
    // until the killed shard has answered three rounds in a row.
    let deadline = Instant::now() + WAIT;
    let mut unanswered = vec![0usize; keys.len()];
    let mut calls = vec![0usize; keys.len()];
    let mut why_others: Vec<String> = Vec::new();
    let mut in_a_row = 0;
    while in_a_row < 3 {
        assert!(
            Instant::now() < deadline,
            "shard {killed_shard} never answered again: {unanswered:?}"
        );
        let round = futures::future::join_all(keys.iter().map(|key| {
            let client = client.clone();
            async move {
                let owner = unanswered_because(&client, "owner", json!({"key": key})).await;
                let acquire = unanswered_because(
                    &client,
                    "acquire",
                    json!({"key": key, "holder": "h", "ttl_ms": 60_000}),
                )
                .await;
                [owner, acquire]
            }
        }))
        .await;
        for (i, outcomes) in round.iter().enumerate() {
            calls[i] += outcomes.len();
            unanswered[i] += outcomes.iter().filter(|why| why.is_some()).count();
            if i != killed_shard {
                why_others.extend(
                    outcomes
                        .iter()
                        .flatten()
                        .map(|why| format!("shard {i}: {why}")),
                );
            }
        }
        in_a_row = if round[killed_shard].iter().all(Option::is_none) {
            in_a_row + 1
        } else {
            0
        };
    }
    println!(
        "shard cluster: node {victim} (leader of shard {killed_shard}) killed; calls \
         unanswered per shard {unanswered:?} of {calls:?}"
    );
    assert!(
        unanswered[killed_shard] > 0,
        "the killed node led shard {killed_shard}: some of its calls went unanswered \
         ({unanswered:?} of {calls:?})"
    );
    for (i, n) in unanswered.iter().enumerate() {
        if i != killed_shard {
            assert_eq!(
                *n, 0,
                "shard {i}'s keys went unanswered: {unanswered:?}: {why_others:?}"
            );
        }
    }
    for s in services {
        s.shutdown().await;
    }
}
