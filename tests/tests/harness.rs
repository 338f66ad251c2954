//! Tests of the test harness itself, against real nats-server processes.

use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Duration;

use dagnats_leases_tests::{Binary, LEGACY_VERSION, NatsServer, SUPPORTED_VERSION};
use serde_json::{Value, json};

/// Sends a JetStream API request and returns the decoded JSON reply.
async fn js_api(client: &async_nats::Client, subject: &str, body: Value) -> Value {
    let reply = tokio::time::timeout(
        Duration::from_secs(5),
        client.request(subject.to_owned(), body.to_string().into()),
    )
    .await
    .unwrap_or_else(|_| panic!("{subject}: no reply within 5 s"))
    .unwrap_or_else(|e| panic!("{subject}: {e}"));
    serde_json::from_slice(&reply.payload).unwrap_or_else(|e| panic!("{subject}: {e}"))
}

async fn connect(server: &NatsServer) -> async_nats::Client {
    async_nats::connect(server.url())
        .await
        .unwrap_or_else(|e| panic!("connect to {}: {e}", server.url()))
}

fn assert_refused(server: &NatsServer) {
    let err = TcpStream::connect_timeout(&server.addr(), Duration::from_secs(1))
        .expect_err("nothing should listen on the port of a stopped server");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
}

#[tokio::test]
async fn start_serves_jetstream_right_away() {
    let server = NatsServer::start();
    assert_eq!(server.version(), SUPPORTED_VERSION);
    assert!(server.info().jetstream, "INFO should announce JetStream");
    assert!(server.url().starts_with("nats://127.0.0.1:"));
    assert_ne!(server.port(), 0);
    assert!(server.store_dir().is_dir());
    println!("{} runs nats-server v{}", server.url(), server.version());

    // No retry: start() returning means the server is ready for JetStream requests.
    let client = connect(&server).await;
    assert_eq!(client.server_info().version, SUPPORTED_VERSION);
    assert_eq!(client.server_info().port, server.port());
    let info = js_api(&client, "$JS.API.INFO", json!({})).await;
    assert_eq!(
        info["type"], "io.nats.jetstream.api.v1.account_info_response",
        "{info}"
    );
    assert!(info.get("error").is_none(), "{info}");
    let level = info["api"]["level"]
        .as_u64()
        .expect("2.15 reports api.level");
    assert!(level >= 4, "{info}");
    println!("$JS.API.INFO: api.level {level}");
}

/// Creates file-backed stream `T` on `t.>` and stores one acknowledged message.
async fn store_one_message(client: &async_nats::Client) {
    let created = js_api(
        client,
        "$JS.API.STREAM.CREATE.T",
        json!({"name": "T", "subjects": ["t.>"], "storage": "file", "num_replicas": 1}),
    )
    .await;
    assert!(created.get("error").is_none(), "{created}");
    let ack = client
        .request("t.one", "hello".into())
        .await
        .expect("publish to the stream");
    let ack: Value = serde_json::from_slice(&ack.payload).unwrap();
    assert_eq!(ack["stream"], "T", "{ack}");
    assert_eq!(ack["seq"], 1, "{ack}");
}

async fn assert_message_kept(client: &async_nats::Client) {
    let info = js_api(client, "$JS.API.STREAM.INFO.T", json!({})).await;
    assert_eq!(info["state"]["messages"], 1, "{info}");
    let msg = js_api(client, "$JS.API.STREAM.MSG.GET.T", json!({"seq": 1})).await;
    assert_eq!(msg["message"]["subject"], "t.one", "{msg}");
    assert_eq!(msg["message"]["data"], "aGVsbG8=", "{msg}"); // base64 of "hello"
}

#[tokio::test]
async fn restart_keeps_port_and_store() {
    let mut server = NatsServer::start();
    let (port, store) = (server.port(), server.store_dir().to_path_buf());
    let (pid, id) = (server.pid(), server.info().server_id.clone());
    let client = connect(&server).await;
    store_one_message(&client).await;

    server.restart();
    assert!(server.is_running());
    assert_eq!(server.port(), port);
    assert_eq!(server.store_dir(), store);
    assert_ne!(server.pid(), pid, "a new process");
    assert_ne!(server.info().server_id, id, "a new process");
    assert!(store.join("jetstream").is_dir());

    let fresh = connect(&server).await;
    assert_message_kept(&fresh).await;
    println!("restarted on port {port}; stream T kept its message");
}

#[tokio::test]
async fn kill_then_restart_recovers_synced_store() {
    let mut server = NatsServer::builder().sync_always(true).start();
    let port = server.port();
    let client = connect(&server).await;
    store_one_message(&client).await;

    server.kill();
    assert!(!server.is_running());
    assert_eq!(server.pid(), None);
    assert_refused(&server);

    server.restart();
    assert_eq!(server.port(), port);
    assert_message_kept(&connect(&server).await).await;
    assert_eq!(
        server.log().matches("Server is ready").count(),
        2,
        "one log over both runs"
    );
}

#[tokio::test]
async fn options_reach_the_server() {
    let server = NatsServer::builder()
        .max_payload(4096)
        .server_name("harness-n1")
        .start();
    assert_eq!(server.info().max_payload, 4096);
    assert_eq!(server.info().server_name, "harness-n1");
    let client = connect(&server).await;
    assert_eq!(client.server_info().max_payload, 4096);
    assert_eq!(client.server_info().server_name, "harness-n1");
}

#[tokio::test]
async fn legacy_is_debians_2_9_10() {
    let server = NatsServer::start_legacy();
    assert_eq!(server.version(), LEGACY_VERSION);
    assert!(server.info().jetstream);
    println!("{} runs nats-server v{}", server.url(), server.version());

    let client = connect(&server).await;
    assert_eq!(client.server_info().version, LEGACY_VERSION);
    let info = js_api(&client, "$JS.API.INFO", json!({})).await;
    assert_eq!(
        info["type"], "io.nats.jetstream.api.v1.account_info_response",
        "{info}"
    );
    assert!(
        info["api"].get("level").is_none(),
        "2.9 has no api.level: {info}"
    );
}

#[test]
fn legacy_refuses_sync_always() {
    let err = NatsServer::builder()
        .legacy()
        .sync_always(true)
        .try_start()
        .expect_err("2.9.10 does not know sync_interval");
    let err = err.to_string();
    assert!(err.contains("exited during start-up"), "{err}");
    assert!(
        err.contains("sync_interval"),
        "the log tail explains: {err}"
    );
}

#[test]
fn stop_and_drop_free_everything() {
    let mut server = NatsServer::start();
    server.stop();
    assert!(!server.is_running());
    assert_refused(&server);
    server.stop(); // again: a no-op

    let server = NatsServer::start();
    let dir = server.store_dir().to_path_buf();
    let addr = server.addr();
    drop(server);
    assert!(!dir.exists(), "drop removes the temporary directory");
    let err = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
}

#[test]
fn a_panicking_test_still_kills_its_server() {
    let (tx, rx) = std::sync::mpsc::channel();
    let joined = std::thread::spawn(move || {
        let server = NatsServer::start();
        tx.send((server.addr(), server.store_dir().to_path_buf()))
            .unwrap();
        panic!("the test fails while the server runs");
    })
    .join();
    assert!(joined.is_err());
    let (addr, dir) = rx.recv().unwrap();
    assert!(!dir.exists());
    let err = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
}

#[test]
fn a_missing_binary_says_how_to_install() {
    let err = NatsServer::builder()
        .binary(Binary::Path(PathBuf::from("/nonexistent/nats-server")))
        .try_start()
        .expect_err("no such binary");
    let err = err.to_string();
    assert!(err.contains("scripts/install-nats-server"), "{err}");
    assert!(err.contains("/nonexistent/nats-server"), "{err}");
}

#[test]
fn servers_in_parallel_get_distinct_ports() {
    let servers: Vec<NatsServer> = (0..4).map(|_| NatsServer::start()).collect();
    let mut ports: Vec<u16> = servers.iter().map(NatsServer::port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), servers.len(), "{ports:?}");
}
