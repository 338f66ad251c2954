//! The strict NATS protocol reader never panics, whatever bytes the server relays
//! and however they are chunked; and a message whose header block is anything at
//! all, framed by correct byte counts, is delivered (with its header error if the
//! block is malformed) and never ends the connection.
#![no_main]

use std::time::Instant;

use dagnats_leases_core::proto::{ConnEvent, Connection, ConnectionConfig, ServerAddr};
use libfuzzer_sys::fuzz_target;

fn connected(now: Instant) -> (Connection, u64) {
    let server = ServerAddr { host: "h".into(), port: 4222, tls: false };
    let mut conn = Connection::new(ConnectionConfig::new(vec![server], "_INBOX.f"), now);
    let sid = conn.subscribe("api.leases.*", Some("leases")).expect("valid");
    conn.handle_connected(now);
    conn.handle_read(now, b"INFO {\"max_payload\":1048576,\"headers\":true}\r\n");
    conn.handle_read(now, b"PONG\r\n");
    while conn.poll_event().is_some() {}
    let _ = conn.poll_transmit();
    assert!(conn.is_connected());
    (conn, sid)
}

fuzz_target!(|data: &[u8]| {
    let now = Instant::now();
    let Some((&chunk, rest)) = data.split_first() else { return };
    let chunk = usize::from(chunk).max(1);

    // Anything at all, in chunks: no panic.
    let (mut conn, _) = connected(now);
    for part in rest.chunks(chunk) {
        conn.handle_read(now, part);
        while conn.poll_event().is_some() {}
        let _ = conn.poll_transmit();
    }

    // Any header block, framed right: delivered, and the connection stays.
    let (mut conn, sid) = connected(now);
    let split = rest.len() / 2;
    let (block, payload) = rest.split_at(split);
    let mut frame = format!(
        "HMSG api.leases.renew {sid} _INBOX.x {} {}\r\n",
        block.len(),
        block.len() + payload.len()
    )
    .into_bytes();
    frame.extend_from_slice(block);
    frame.extend_from_slice(payload);
    frame.extend_from_slice(b"\r\nPING\r\n");
    for part in frame.chunks(chunk) {
        conn.handle_read(now, part);
    }
    let mut delivered = 0;
    while let Some(event) = conn.poll_event() {
        match event {
            ConnEvent::Message { message, .. } => {
                assert_eq!(message.payload, payload);
                delivered += 1;
            }
            other => panic!("a message ended in {other:?}"),
        }
    }
    assert_eq!(delivered, 1);
    assert!(conn.is_connected());
    assert_eq!(conn.poll_transmit().as_deref(), Some(&b"PONG\r\n"[..]));
});
