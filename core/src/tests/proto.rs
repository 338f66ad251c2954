//! The strict NATS protocol: one table test per rule of the parser, the encoder
//! and the connection machine, and a property over chunking.

use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use crate::io::RequestOutcome;
use crate::proto::encode::{self, EncodeError};
use crate::proto::parse::{HeaderErrorKind, Parser, ServerOp, parse_headers};
use crate::proto::{
    Auth, ConnEvent, Connection, ConnectionConfig, NonceSigner, RequestId, SendError, ServerAddr,
};

fn ops(bytes: &[u8]) -> Vec<Result<ServerOp, String>> {
    let mut parser = Parser::new(1 << 20);
    parser.feed(bytes);
    let mut out = Vec::new();
    while let Some(op) = parser.next_op() {
        out.push(op.map_err(|e| e.0));
    }
    out
}

fn msg(op: &Result<ServerOp, String>) -> &crate::proto::Delivered {
    match op {
        Ok(ServerOp::Msg(m)) => m,
        other => panic!("not a message: {other:?}"),
    }
}

/// An HMSG of `block` (its length declared) and payload `x`, then a PING.
fn hmsg(block: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "HMSG a.b 7 _INBOX.r {} {}\r\n",
        block.len(),
        block.len() + 1
    )
    .into_bytes();
    out.extend_from_slice(block);
    out.extend_from_slice(b"x\r\nPING\r\n");
    out
}

#[test]
fn each_server_op_is_read() {
    let got = ops(b"PING\r\nPONG\r\n+OK\r\n-ERR 'Permissions Violation for Publish to \"x\"'\r\nINFO {\"server_id\":\"S\",\"version\":\"2.11.4\",\"max_payload\":1024,\"headers\":true,\"nonce\":\"n\"}\r\nMSG a.b 3 5\r\nhello\r\nMSG a.b 3 _INBOX.x 0\r\n\r\n");
    assert_eq!(got[0], Ok(ServerOp::Ping));
    assert_eq!(got[1], Ok(ServerOp::Pong));
    assert_eq!(got[2], Ok(ServerOp::Ok));
    assert_eq!(
        got[3],
        Ok(ServerOp::Err(
            "Permissions Violation for Publish to \"x\"".into()
        ))
    );
    let Ok(ServerOp::Info(info)) = &got[4] else {
        panic!("{:?}", got[4])
    };
    assert_eq!((info.version.as_str(), info.max_payload), ("2.11.4", 1024));
    assert_eq!(info.nonce.as_deref(), Some("n"));
    let m = msg(&got[5]);
    assert_eq!(
        (m.subject.as_str(), m.sid, m.reply.as_deref()),
        ("a.b", 3, None)
    );
    assert_eq!(m.payload, b"hello");
    assert_eq!(msg(&got[6]).reply.as_deref(), Some("_INBOX.x"));
    assert_eq!(got.len(), 7);
}

#[test]
fn a_message_is_framed_by_its_byte_count_whatever_its_payload_holds() {
    let got = ops(b"MSG a 1 12\r\nPING\r\nPONG\r\n\r\nPONG\r\n");
    assert_eq!(msg(&got[0]).payload, b"PING\r\nPONG\r\n");
    assert_eq!(got[1], Ok(ServerOp::Pong));
}

#[test]
fn a_well_formed_header_block_is_read_with_its_status() {
    let h = parse_headers(b"NATS/1.0 503 No Responders\r\n\r\n").unwrap();
    assert_eq!(
        (h.status, h.description.as_str()),
        (Some(503), "No Responders")
    );
    let h = parse_headers(b"NATS/1.0\r\nNats-Request-Info: {\"acc\":\"A\"}\r\nX-Two:\tv 2 \r\nX-Two: again\r\nEmpty:\r\n\r\n").unwrap();
    assert_eq!(
        h.pairs,
        vec![
            (
                "Nats-Request-Info".to_string(),
                "{\"acc\":\"A\"}".to_string()
            ),
            ("X-Two".to_string(), "v 2".to_string()),
            ("X-Two".to_string(), "again".to_string()),
            ("Empty".to_string(), String::new()),
        ]
    );
}

#[test]
fn a_malformed_header_block_is_an_error_of_that_message_only() {
    let cases: &[(&str, &[u8], HeaderErrorKind)] = &[
        (
            "bare LF ends a line",
            b"NATS/1.0\r\nA: 1\nNats-Request-Info: x\r\n\r\n",
            HeaderErrorKind::BareLineEnd,
        ),
        (
            "bare CR inside a line",
            b"NATS/1.0\r\nA: 1\rB: 2\r\n\r\n",
            HeaderErrorKind::BareLineEnd,
        ),
        (
            "bare LF after the status line",
            b"NATS/1.0\nA: 1\r\n\r\n",
            HeaderErrorKind::BareLineEnd,
        ),
        (
            "folded line",
            b"NATS/1.0\r\nA: 1\r\n Nats-Request-Info: x\r\n\r\n",
            HeaderErrorKind::Folded,
        ),
        (
            "folded with a tab",
            b"NATS/1.0\r\nA: 1\r\n\tmore\r\n\r\n",
            HeaderErrorKind::Folded,
        ),
        (
            "no colon",
            b"NATS/1.0\r\nno colon here\r\n\r\n",
            HeaderErrorKind::NoColon,
        ),
        (
            "space in the name",
            b"NATS/1.0\r\nBad Name: v\r\n\r\n",
            HeaderErrorKind::BadName,
        ),
        (
            "empty name",
            b"NATS/1.0\r\n: v\r\n\r\n",
            HeaderErrorKind::BadName,
        ),
        (
            "non-token name",
            b"NATS/1.0\r\nA(b): v\r\n\r\n",
            HeaderErrorKind::BadName,
        ),
        (
            "non-UTF-8 name",
            b"NATS/1.0\r\nA\xff: v\r\n\r\n",
            HeaderErrorKind::BadName,
        ),
        (
            "non-UTF-8 value",
            b"NATS/1.0\r\nA: \xc3\x28\r\n\r\n",
            HeaderErrorKind::NotUtf8,
        ),
        (
            "control in value",
            b"NATS/1.0\r\nA: x\x00y\r\n\r\n",
            HeaderErrorKind::ControlInValue,
        ),
        (
            "DEL in value",
            b"NATS/1.0\r\nA: x\x7f\r\n\r\n",
            HeaderErrorKind::ControlInValue,
        ),
        (
            "no version",
            b"HTTP/1.1\r\nA: 1\r\n\r\n",
            HeaderErrorKind::StatusLine,
        ),
        (
            "bad status",
            b"NATS/1.0 5x3\r\n\r\n",
            HeaderErrorKind::StatusLine,
        ),
        (
            "no empty line",
            b"NATS/1.0\r\nA: 1\r\n",
            HeaderErrorKind::Unterminated,
        ),
        (
            "bytes after the end",
            b"NATS/1.0\r\nA: 1\r\n\r\nB: 2\r\n",
            HeaderErrorKind::Unterminated,
        ),
        ("empty block", b"", HeaderErrorKind::Unterminated),
    ];
    for (rule, block, kind) in cases {
        let got = ops(&hmsg(block));
        let m = msg(&got[0]);
        let err = m.headers.as_ref().expect_err(rule);
        assert_eq!(err.kind, *kind, "{rule}: {err}");
        assert_eq!(m.payload, b"x", "{rule}");
        // The stream goes on: the next op is read.
        assert_eq!(got.get(1), Some(&Ok(ServerOp::Ping)), "{rule}");
    }
}

#[test]
fn a_broken_protocol_line_fails_the_stream() {
    for (rule, bytes) in [
        ("unknown op", &b"HELLO\r\n"[..]),
        ("payload not followed by CRLF", b"MSG a 1 2\r\nabc\r\n"),
        ("count not a number", b"MSG a 1 x\r\n"),
        ("too many arguments", b"MSG a 1 r extra 2\r\nab\r\n"),
        ("header length past total", b"HMSG a 1 5 2\r\nabcde\r\n"),
        ("bare LF ends a line", b"PING\nPONG\r\n"),
        ("INFO not JSON", b"INFO {nope\r\n"),
    ] {
        let got = ops(bytes);
        assert!(matches!(got.last(), Some(Err(_))), "{rule}: {got:?}");
        assert_eq!(got.iter().filter(|o| o.is_err()).count(), 1, "{rule}");
    }
}

/// A subject or reply is the publisher's bytes, relayed by the server unchecked:
/// one that is not text (not UTF-8, a bare CR, another control character) makes
/// that message malformed, a reply that is not text is no reply, and the next
/// message is read.
#[test]
fn a_subject_or_reply_that_is_not_text_is_an_error_of_that_message_only() {
    for (rule, line, reply_kept) in [
        (
            "subject not UTF-8",
            &b"MSG api.leases.\xff 1 _INBOX.r 2\r\n"[..],
            true,
        ),
        (
            "bare CR in the subject",
            b"MSG api.leases.a\rb 1 _INBOX.r 2\r\n",
            true,
        ),
        (
            "tab-free control in the subject",
            b"MSG a.\x01 1 _INBOX.r 2\r\n",
            true,
        ),
        ("reply not UTF-8", b"MSG a.b 1 _INBOX.\xff 2\r\n", false),
        (
            "bare CR in the reply",
            b"MSG a.b 1 _INBOX.a\rb 2\r\n",
            false,
        ),
        (
            "HMSG subject not UTF-8",
            b"HMSG a.\xc0 1 _INBOX.r 12 14\r\n",
            true,
        ),
    ] {
        let mut bytes = line.to_vec();
        if line.starts_with(b"HMSG") {
            bytes.extend_from_slice(b"NATS/1.0\r\n\r\n");
        }
        bytes.extend_from_slice(b"{}\r\nMSG a.b 2 _INBOX.r 2\r\nok\r\n");
        let got = ops(&bytes);
        assert_eq!(got.len(), 2, "{rule}: {got:?}");
        let bad = msg(&got[0]);
        let err = bad.headers.as_ref().expect_err(rule);
        assert_eq!(err.kind, HeaderErrorKind::Subject, "{rule}");
        assert!(
            err.to_string().contains("malformed subject"),
            "{rule}: {err}"
        );
        assert_eq!(bad.reply.is_some(), reply_kept, "{rule}: {:?}", bad.reply);
        assert!(!bad.subject.chars().any(char::is_control), "{rule}");
        assert_eq!(
            msg(&got[1]).payload,
            b"ok",
            "{rule}: the next message is read"
        );
    }
}

/// A header block past the bound is refused unread, on its own.
#[test]
fn a_header_block_past_the_bound_is_refused_unread_and_the_next_message_is_read() {
    use crate::proto::parse::MAX_HEADER_BLOCK;
    let mut block = b"NATS/1.0\r\n".to_vec();
    while block.len() <= MAX_HEADER_BLOCK {
        block.extend_from_slice(b"X-Big: vvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv\r\n");
    }
    block.extend_from_slice(b"\r\n");
    let got = ops(&hmsg(&block));
    let err = msg(&got[0]).headers.as_ref().expect_err("too large");
    assert_eq!(err.kind, HeaderErrorKind::TooLarge);
    assert_eq!(got[1], Ok(ServerOp::Ping));
    // At the bound it is read.
    let mut at = b"NATS/1.0\r\nX-A: ".to_vec();
    at.resize(MAX_HEADER_BLOCK - 4, b'v');
    at.extend_from_slice(b"\r\n\r\n");
    assert_eq!(at.len(), MAX_HEADER_BLOCK);
    let got = ops(&hmsg(&at));
    assert!(msg(&got[0]).headers.is_ok(), "{:?}", msg(&got[0]).headers);
}

#[test]
fn a_message_past_the_bound_fails_the_stream() {
    let mut parser = Parser::new(10);
    parser.feed(b"MSG a 1 11\r\n");
    assert!(matches!(parser.next_op(), Some(Err(_))));
}

#[test]
fn a_protocol_line_past_the_bound_fails_the_stream() {
    let mut parser = Parser::new(10);
    parser.feed(&vec![b'A'; crate::proto::parse::MAX_CONTROL_LINE + 1]);
    assert!(matches!(parser.next_op(), Some(Err(_))));
}

#[test]
fn what_is_written_is_checked() {
    assert_eq!(
        encode::sub("api.leases.*", Some("leases"), 4).unwrap(),
        b"SUB api.leases.* leases 4\r\n"
    );
    assert_eq!(encode::sub("$SRV.>", None, 5).unwrap(), b"SUB $SRV.> 5\r\n");
    assert_eq!(encode::unsub(5), b"UNSUB 5\r\n");
    assert_eq!(
        encode::publish("a.b", Some("_INBOX.x.1"), &[], b"hi", 100).unwrap(),
        b"PUB a.b _INBOX.x.1 2\r\nhi\r\n"
    );
    assert_eq!(
        encode::publish("a.b", None, &[("K", "v")], b"hi", 100).unwrap(),
        b"HPUB a.b 18 20\r\nNATS/1.0\r\nK: v\r\n\r\nhi\r\n"
    );
    for subject in ["", "a..b", "a b", "a.*", "a.>", ".a", "a.\r\n"] {
        assert!(
            matches!(
                encode::publish(subject, None, &[], b"", 100),
                Err(EncodeError::Subject(_))
            ),
            "{subject:?}"
        );
    }
    for subject in ["a.>.b", "", "a\tb"] {
        assert!(encode::sub(subject, None, 1).is_err(), "{subject:?}");
    }
    assert!(matches!(
        encode::sub("a", Some("q q"), 1),
        Err(EncodeError::Queue(_))
    ));
    assert!(matches!(
        encode::publish("a", None, &[("Bad Name", "v")], b"", 100),
        Err(EncodeError::HeaderName(_))
    ));
    assert!(matches!(
        encode::publish("a", None, &[("K", "v\r\nInjected: 1")], b"", 100),
        Err(EncodeError::HeaderValue(_))
    ));
    assert!(matches!(
        encode::publish("a", None, &[], &[0; 101], 100),
        Err(EncodeError::TooLarge {
            size: 101,
            max: 100
        })
    ));
}

#[test]
fn connect_says_headers_no_responders_and_not_verbose() {
    let text = String::from_utf8(encode::connect(&encode::Connect {
        headers: true,
        no_responders: true,
        ..Default::default()
    }))
    .unwrap();
    assert!(
        text.starts_with("CONNECT {") && text.ends_with("}\r\n"),
        "{text}"
    );
    for field in [
        "\"headers\":true",
        "\"no_responders\":true",
        "\"verbose\":false",
    ] {
        assert!(text.contains(field), "{field}: {text}");
    }
    assert!(!text.contains("\"pass\""), "{text}");
}

#[test]
fn a_server_url_is_read() {
    let ok = |u: &str| ServerAddr::parse(u).unwrap();
    assert_eq!(
        ok("nats://127.0.0.1:4333"),
        ServerAddr {
            host: "127.0.0.1".into(),
            port: 4333,
            tls: false
        }
    );
    assert_eq!(
        ok("tls://h:1"),
        ServerAddr {
            host: "h".into(),
            port: 1,
            tls: true
        }
    );
    assert_eq!(ok("localhost").port, 4222);
    assert_eq!(ok("[::1]:5").host, "::1");
    for bad in ["ws://h:1", "nats://u:p@h:1", "nats://h:x", "nats://"] {
        assert!(ServerAddr::parse(bad).is_err(), "{bad}");
    }
}

// The connection machine.

#[derive(Debug)]
struct FixedSigner;

impl NonceSigner for FixedSigner {
    fn sign(&self, nonce: &[u8]) -> String {
        format!("signed-{}", String::from_utf8_lossy(nonce))
    }
}

fn config(servers: usize) -> ConnectionConfig {
    let servers = (0..servers)
        .map(|i| ServerAddr {
            host: format!("h{i}"),
            port: 4222,
            tls: false,
        })
        .collect();
    ConnectionConfig::new(servers, "_INBOX.c")
}

fn events(conn: &mut Connection) -> Vec<ConnEvent> {
    std::iter::from_fn(|| conn.poll_event()).collect()
}

fn written(conn: &mut Connection) -> String {
    String::from_utf8(conn.poll_transmit().unwrap_or_default()).unwrap()
}

const INFO: &[u8] = b"INFO {\"server_id\":\"S\",\"version\":\"2.11.4\",\"max_payload\":100,\"headers\":true,\"nonce\":\"N0\"}\r\n";

/// A connection through its handshake, with its events and bytes read.
fn connected(config: ConnectionConfig, now: Instant) -> Connection {
    let mut conn = Connection::new(config, now);
    events(&mut conn);
    conn.handle_connected(now);
    conn.handle_read(now, INFO);
    written(&mut conn);
    conn.handle_read(now, b"PONG\r\n");
    let got = events(&mut conn);
    assert!(
        matches!(got.last(), Some(ConnEvent::Connected(_))),
        "{got:?}"
    );
    conn
}

#[test]
fn the_handshake_is_info_connect_subscriptions_ping_and_the_pong_connects() {
    let now = Instant::now();
    let mut conn = Connection::new(config(1), now);
    let sid = conn.subscribe("api.leases.*", Some("leases")).unwrap();
    assert!(matches!(
        events(&mut conn)[..],
        [ConnEvent::Dial { server: 0, .. }]
    ));
    conn.handle_connected(now);
    assert_eq!(conn.poll_transmit(), None, "nothing before INFO");
    conn.handle_read(now, INFO);
    let out = written(&mut conn);
    assert!(out.starts_with("CONNECT {"), "{out}");
    assert!(
        out.ends_with(&format!("SUB api.leases.* leases {sid}\r\nPING\r\n")),
        "{out}"
    );
    assert!(!conn.is_connected());
    conn.handle_read(now, b"PONG\r\n");
    assert!(conn.is_connected());
    assert!(matches!(events(&mut conn)[..], [ConnEvent::Connected(_)]));
    assert_eq!(conn.max_payload(), 100, "INFO's max_payload is the bound");
    assert!(matches!(
        conn.publish("a", None, &[], &[0; 101]),
        Err(SendError::Encode(EncodeError::TooLarge { .. }))
    ));
}

#[test]
fn tls_is_asked_of_the_adapter_when_the_server_requires_it_or_the_config_does() {
    let now = Instant::now();
    for (info, asks) in [
        (&b"INFO {\"tls_required\":true}\r\n"[..], false),
        (b"INFO {\"tls_available\":true}\r\n", true),
    ] {
        let mut cfg = config(1);
        cfg.tls = asks;
        let mut conn = Connection::new(cfg, now);
        events(&mut conn);
        conn.handle_connected(now);
        conn.handle_read(now, info);
        assert_eq!(
            events(&mut conn),
            vec![ConnEvent::UpgradeTls { host: "h0".into() }]
        );
        assert_eq!(conn.poll_transmit(), None, "CONNECT waits for TLS");
        conn.handle_tls_ready(now);
        assert!(written(&mut conn).contains("\"tls_required\":true"));
    }
    // TLS asked of a server that has none: no CONNECT in the clear.
    let mut cfg = config(1);
    cfg.tls = true;
    let mut conn = Connection::new(cfg, now);
    events(&mut conn);
    conn.handle_connected(now);
    conn.handle_read(now, b"INFO {}\r\n");
    assert_eq!(conn.poll_transmit(), None);
    assert!(matches!(
        events(&mut conn)[..],
        [ConnEvent::CloseSocket, ConnEvent::Disconnected { .. }]
    ));
}

#[test]
fn connect_carries_each_kind_of_credentials() {
    let now = Instant::now();
    let signer = Arc::new(FixedSigner);
    for (auth, want) in [
        (
            Auth::UserPassword {
                user: "u".into(),
                password: "p".into(),
            },
            vec!["\"user\":\"u\"", "\"pass\":\"p\""],
        ),
        (Auth::Token("t".into()), vec!["\"auth_token\":\"t\""]),
        (
            Auth::Nkey {
                public: "UABC".into(),
                signer: signer.clone(),
            },
            vec!["\"nkey\":\"UABC\"", "\"sig\":\"signed-N0\""],
        ),
        (
            Auth::Jwt {
                jwt: "eyJ".into(),
                signer: signer.clone(),
            },
            vec!["\"jwt\":\"eyJ\"", "\"sig\":\"signed-N0\""],
        ),
    ] {
        let mut cfg = config(1);
        cfg.auth = auth;
        let mut conn = Connection::new(cfg, now);
        conn.handle_connected(now);
        conn.handle_read(now, INFO);
        let out = written(&mut conn);
        for field in want {
            assert!(out.contains(field), "{field}: {out}");
        }
    }
}

#[test]
fn a_message_with_a_malformed_header_block_is_delivered_with_its_error_and_the_connection_stays() {
    let now = Instant::now();
    let mut conn = Connection::new(config(1), now);
    let sid = conn.subscribe("api.leases.*", None).unwrap();
    let mut conn = {
        conn.handle_connected(now);
        conn.handle_read(now, INFO);
        written(&mut conn);
        conn.handle_read(now, b"PONG\r\n");
        events(&mut conn);
        conn
    };
    let block = b"NATS/1.0\r\nA: 1\nNats-Request-Info: forged\r\n\r\n";
    let mut bytes = format!(
        "HMSG api.leases.renew {sid} _INBOX.x {} {}\r\n",
        block.len(),
        block.len() + 2
    )
    .into_bytes();
    bytes.extend_from_slice(block);
    bytes.extend_from_slice(b"{}\r\nMSG api.leases.renew 1 _INBOX.y 2\r\n{}\r\n");
    conn.handle_read(now, &bytes);
    let got = events(&mut conn);
    assert_eq!(got.len(), 2, "{got:?}");
    let ConnEvent::Message { message, .. } = &got[0] else {
        panic!("{got:?}")
    };
    assert_eq!(
        message.headers.as_ref().unwrap_err().kind,
        HeaderErrorKind::BareLineEnd
    );
    let ConnEvent::Message { message, .. } = &got[1] else {
        panic!("{got:?}")
    };
    assert!(message.headers.is_ok());
    assert!(conn.is_connected());
}

#[test]
fn a_reply_is_correlated_by_its_last_token_on_one_inbox_subscription() {
    let now = Instant::now();
    let mut conn = connected(config(1), now);
    let a = conn.request("svc.a", &[], b"1").unwrap();
    let b = conn.request("svc.b", &[("K", "v")], b"2").unwrap();
    let out = written(&mut conn);
    assert_eq!(out.matches("SUB _INBOX.c.* ").count(), 1, "{out}");
    assert!(
        out.contains(&format!("PUB svc.a _INBOX.c.{} 1", a.0)),
        "{out}"
    );
    let sid: u64 = out
        .split("SUB _INBOX.c.* ")
        .nth(1)
        .unwrap()
        .split("\r\n")
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let bad = b"NATS/1.0\r\n folded: x\r\n\r\n";
    let mut read = format!("MSG _INBOX.c.{} {sid} 2\r\nok\r\n", b.0).into_bytes();
    read.extend_from_slice(
        format!(
            "HMSG _INBOX.c.{} {sid} {} {}\r\n",
            a.0,
            bad.len(),
            bad.len()
        )
        .as_bytes(),
    );
    read.extend_from_slice(bad);
    read.extend_from_slice(b"\r\n");
    read.extend_from_slice(format!("MSG _INBOX.c.{} {sid} 2\r\nno\r\n", b.0).as_bytes());
    conn.handle_read(now, &read);
    let got = events(&mut conn);
    assert_eq!(
        got.len(),
        2,
        "a second reply to one request is dropped: {got:?}"
    );
    assert_eq!(
        got[0],
        ConnEvent::Replied {
            id: b,
            outcome: RequestOutcome::reply("ok")
        }
    );
    let ConnEvent::Replied {
        id,
        outcome: RequestOutcome::Failed(why),
    } = &got[1]
    else {
        panic!("{got:?}")
    };
    assert_eq!(*id, a);
    assert!(why.contains("malformed header block"), "{why}");
    assert!(conn.is_connected());
}

#[test]
fn a_503_status_is_no_responders_and_a_cancelled_request_is_dropped() {
    let now = Instant::now();
    let mut conn = connected(config(1), now);
    let a = conn.request("svc.a", &[], b"").unwrap();
    let b = conn.request("svc.b", &[], b"").unwrap();
    written(&mut conn);
    conn.cancel_request(b);
    let block = b"NATS/1.0 503\r\n\r\n";
    let mut read = Vec::new();
    for id in [a, b] {
        read.extend_from_slice(
            format!(
                "HMSG _INBOX.c.{} 1 {} {}\r\n",
                id.0,
                block.len(),
                block.len()
            )
            .as_bytes(),
        );
        read.extend_from_slice(block);
        read.extend_from_slice(b"\r\n");
    }
    conn.handle_read(now, &read);
    assert_eq!(
        events(&mut conn),
        vec![ConnEvent::Replied {
            id: a,
            outcome: RequestOutcome::NoResponders
        }]
    );
    assert_eq!(conn.requests_waiting(), 0);
    let _ = RequestId(0);
}

#[test]
fn a_server_ping_is_answered_and_a_flush_ends_with_its_pong() {
    let now = Instant::now();
    let mut conn = connected(config(1), now);
    conn.handle_read(now, b"PING\r\n");
    assert_eq!(written(&mut conn), "PONG\r\n");
    let flush = conn.flush();
    assert_eq!(written(&mut conn), "PING\r\n");
    assert!(events(&mut conn).is_empty());
    conn.handle_read(now, b"PONG\r\n");
    assert_eq!(events(&mut conn), vec![ConnEvent::Flushed(flush)]);
}

#[test]
fn pings_unanswered_past_the_bound_make_the_connection_stale_and_it_reconnects() {
    let mut now = Instant::now();
    let cfg = config(2);
    let interval = cfg.ping_interval;
    let mut conn = connected(cfg, now);
    for _ in 0..2 {
        now += interval;
        conn.handle_timeout(now);
        assert_eq!(written(&mut conn), "PING\r\n");
    }
    now += interval;
    conn.handle_timeout(now);
    let got = events(&mut conn);
    assert!(matches!(got[0], ConnEvent::CloseSocket), "{got:?}");
    assert!(
        matches!(&got[1], ConnEvent::Disconnected { why, ever_connected: true, .. } if why.contains("stale")),
        "{got:?}"
    );
    // The next server, after the backoff.
    let at = conn.poll_timeout().unwrap();
    assert!(at > now);
    conn.handle_timeout(at);
    assert!(matches!(
        events(&mut conn)[..],
        [ConnEvent::Dial { server: 1, .. }]
    ));
}

#[test]
fn a_pong_keeps_the_connection_alive() {
    let mut now = Instant::now();
    let cfg = config(1);
    let interval = cfg.ping_interval;
    let mut conn = connected(cfg, now);
    for _ in 0..10 {
        now += interval;
        conn.handle_timeout(now);
        conn.handle_read(now, b"PONG\r\n");
    }
    assert!(conn.is_connected());
}

#[test]
fn subscriptions_keep_their_sids_across_a_reconnect_and_publishes_wait_for_it() {
    let now = Instant::now();
    let mut conn = connected(config(1), now);
    let a = conn.subscribe("api.leases.*", Some("leases")).unwrap();
    let b = conn.subscribe("$SRV.PING", None).unwrap();
    conn.unsubscribe(b);
    written(&mut conn);
    conn.handle_closed(now, "reset by peer");
    let got = events(&mut conn);
    assert!(
        matches!(
            got[..],
            [ConnEvent::CloseSocket, ConnEvent::Disconnected { .. }]
        ),
        "{got:?}"
    );
    conn.publish("later", None, &[], b"x").unwrap();
    let flush = conn.flush();
    let at = conn.poll_timeout().unwrap();
    conn.handle_timeout(at);
    conn.handle_connected(at);
    conn.handle_read(at, INFO);
    let out = written(&mut conn);
    assert!(
        out.contains(&format!("SUB api.leases.* leases {a}\r\n")),
        "{out}"
    );
    assert!(!out.contains("$SRV.PING"), "{out}");
    assert!(
        out.ends_with("PING\r\nPING\r\nPUB later 1\r\nx\r\n"),
        "{out}"
    );
    conn.handle_read(at, b"PONG\r\nPONG\r\n");
    let got = events(&mut conn);
    assert!(
        matches!(got[..], [ConnEvent::Dial { .. }, ConnEvent::Connected(_), ConnEvent::Flushed(f)] if f == flush),
        "{got:?}"
    );
}

#[test]
fn a_broken_protocol_line_drops_the_socket_and_reconnects() {
    let now = Instant::now();
    let mut conn = connected(config(1), now);
    conn.handle_read(now, b"MSG a 1 2\r\nabc\r\n");
    let got = events(&mut conn);
    assert!(
        matches!(
            got[..],
            [ConnEvent::CloseSocket, ConnEvent::Disconnected { .. }]
        ),
        "{got:?}"
    );
    assert!(!conn.is_connected());
}

#[test]
fn the_backoff_doubles_per_failure_up_to_its_bound() {
    let mut now = Instant::now();
    let cfg = config(1);
    let (min, max) = (cfg.reconnect_min, cfg.reconnect_max);
    let mut conn = Connection::new(cfg, now);
    let mut waits = Vec::new();
    for _ in 0..8 {
        events(&mut conn);
        conn.handle_dial_failed(now, "refused");
        let at = conn.poll_timeout().unwrap();
        waits.push(at - now);
        now = at;
        conn.handle_timeout(now);
    }
    assert_eq!(waits[0], min);
    assert_eq!(waits[1], min * 2);
    assert_eq!(*waits.last().unwrap(), max);
    assert!(waits.windows(2).all(|w| w[0] <= w[1]));
}

#[test]
fn a_handshake_step_past_the_connect_timeout_drops_the_socket() {
    let now = Instant::now();
    let cfg = config(1);
    let timeout = cfg.connect_timeout;
    let mut conn = Connection::new(cfg, now);
    events(&mut conn);
    conn.handle_connected(now);
    conn.handle_timeout(now + timeout);
    assert!(matches!(
        events(&mut conn)[..],
        [ConnEvent::CloseSocket, ConnEvent::Disconnected { .. }]
    ));
}

#[test]
fn an_auth_error_is_named_when_the_server_closes() {
    let now = Instant::now();
    let mut conn = Connection::new(config(1), now);
    events(&mut conn);
    conn.handle_connected(now);
    conn.handle_read(now, INFO);
    conn.handle_read(now, b"-ERR 'Authorization Violation'\r\n");
    conn.handle_closed(now, "closed");
    let got = events(&mut conn);
    assert!(
        got.iter().any(|e| matches!(e, ConnEvent::Disconnected { why, ever_connected: false, .. } if why.contains("Authorization Violation"))),
        "{got:?}"
    );
}

#[test]
fn close_drops_the_socket_and_dials_no_more() {
    let now = Instant::now();
    let mut conn = connected(config(1), now);
    conn.close();
    assert_eq!(
        events(&mut conn),
        vec![ConnEvent::CloseSocket, ConnEvent::Closed]
    );
    assert_eq!(conn.poll_timeout(), None);
    assert_eq!(conn.publish("a", None, &[], b""), Err(SendError::Closed));
    let _ = Duration::ZERO;
}

/// Well-formed and malformed messages, the bytes of each.
fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let block: &[u8] = match kind % 4 {
        0 => b"",
        1 => b"NATS/1.0\r\nA: b\r\n\r\n",
        2 => b"NATS/1.0\r\nA: b\nC: d\r\n\r\n",
        _ => b"NATS/1.0\r\n folded\r\n\r\n",
    };
    let mut out = if kind.is_multiple_of(4) {
        format!("MSG s.t 1 {}\r\n", payload.len()).into_bytes()
    } else {
        format!(
            "HMSG s.t 1 _INBOX.r {} {}\r\n",
            block.len(),
            block.len() + payload.len()
        )
        .into_bytes()
    };
    out.extend_from_slice(block);
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\r\n");
    out
}

proptest! {
    /// However the bytes are chunked, the same ops come out, and a malformed
    /// header block never ends the stream.
    #[test]
    fn chunking_does_not_change_what_is_read(
        messages in proptest::collection::vec((any::<u8>(), proptest::collection::vec(any::<u8>(), 0..40)), 1..12),
        cuts in proptest::collection::vec(1usize..30, 1..40),
    ) {
        let bytes: Vec<u8> = messages.iter().flat_map(|(k, p)| frame(*k, p)).collect();
        let whole = ops(&bytes);
        prop_assert_eq!(whole.len(), messages.len());
        prop_assert!(whole.iter().all(Result::is_ok));
        let mut parser = Parser::new(1 << 20);
        let mut chunked = Vec::new();
        let mut rest = &bytes[..];
        let mut cuts = cuts.iter().cycle();
        while !rest.is_empty() {
            let n = (*cuts.next().unwrap()).min(rest.len());
            parser.feed(&rest[..n]);
            rest = &rest[n..];
            while let Some(op) = parser.next_op() {
                chunked.push(op.map_err(|e| e.0));
            }
        }
        prop_assert_eq!(whole, chunked);
    }
}

#[test]
fn a_drained_subscription_delivers_what_came_before_its_unsub_was_read() {
    let now = Instant::now();
    let mut conn = connected(config(1), now);
    let sid = conn.subscribe("api.leases.*", None).unwrap();
    written(&mut conn);
    conn.drain(sid);
    assert_eq!(written(&mut conn), format!("UNSUB {sid}\r\nPING\r\n"));
    conn.handle_read(
        now,
        format!("MSG api.leases.renew {sid} 0\r\n\r\nPONG\r\n").as_bytes(),
    );
    let got = events(&mut conn);
    assert!(
        matches!(got[..], [ConnEvent::Message { .. }, ConnEvent::Drained(s)] if s == sid),
        "{got:?}"
    );
    conn.handle_read(
        now,
        format!("MSG api.leases.renew {sid} 0\r\n\r\n").as_bytes(),
    );
    assert!(events(&mut conn).is_empty(), "nothing after the drain");
}

proptest! {
    /// Any header block at all, framed by correct byte counts and fed in any
    /// chunks, is delivered as its message (with its error if malformed) and the
    /// connection stays; the fuzz target `nats_protocol` runs the same longer.
    #[test]
    fn no_header_block_ends_the_connection(
        block in proptest::collection::vec(any::<u8>(), 0..80),
        payload in proptest::collection::vec(any::<u8>(), 0..20),
        chunk in 1usize..40,
    ) {
        let now = Instant::now();
        let mut conn = Connection::new(config(1), now);
        let sid = conn.subscribe("api.leases.*", None).unwrap();
        conn.handle_connected(now);
        conn.handle_read(now, INFO);
        conn.handle_read(now, b"PONG\r\n");
        events(&mut conn);
        let mut frame = format!("HMSG api.leases.renew {sid} _INBOX.x {} {}\r\n", block.len(), block.len() + payload.len()).into_bytes();
        frame.extend_from_slice(&block);
        frame.extend_from_slice(&payload);
        frame.extend_from_slice(b"\r\n");
        for part in frame.chunks(chunk) {
            conn.handle_read(now, part);
        }
        let got = events(&mut conn);
        prop_assert_eq!(got.len(), 1, "{:?}", got);
        let delivered = matches!(&got[0], ConnEvent::Message { message, .. } if message.payload == payload);
        prop_assert!(delivered, "{:?}", got);
        prop_assert!(conn.is_connected());
    }
}

#[test]
fn the_clusters_other_servers_from_info_are_dialed_in_turn_after_a_loss() {
    let now = Instant::now();
    let mut conn = Connection::new(config(1), now);
    events(&mut conn);
    conn.handle_connected(now);
    conn.handle_read(
        now,
        b"INFO {\"connect_urls\":[\"n2:4222\",\"h0:4222\",\"[::1]:4333\",\"bad:port\"]}\r\n",
    );
    written(&mut conn);
    conn.handle_read(now, b"PONG\r\n");
    let mut dialed = Vec::new();
    for _ in 0..3 {
        conn.handle_closed(now, "gone");
        events(&mut conn);
        let at = conn.poll_timeout().unwrap();
        conn.handle_timeout(at);
        for event in events(&mut conn) {
            if let ConnEvent::Dial { addr, .. } = event {
                dialed.push(format!("{}:{}", addr.host, addr.port));
            }
        }
        conn.handle_dial_failed(at, "refused");
        events(&mut conn);
    }
    // The configured one is not added twice; a URL that does not parse is skipped.
    assert_eq!(dialed, vec!["n2:4222", "::1:4333", "h0:4222"]);
}
