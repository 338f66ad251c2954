//! The raw protocol client (`dagnats_leases_tests::raw`) against a real server: the
//! header bytes a test writes arrive as written, a request nobody answers comes back
//! as status 503, and a refused subscription is a readable `-ERR`.

use dagnats_leases_tests::NatsServer;
use dagnats_leases_tests::raw::RawClient;

const CONF: &str = r#"
authorization {
  users: [
    {user: a, password: a}
    {user: b, password: b, permissions: {subscribe: {deny: ["secret.>"]}}}
  ]
}
"#;

#[tokio::test]
async fn header_bytes_arrive_as_written_and_errors_are_read() {
    let server = NatsServer::builder().config(CONF).start();
    let url = server.url();
    let mut a = RawClient::connect_as(&url, "a", "a").await.unwrap();
    let mut b = RawClient::connect_as(&url, "b", "b").await.unwrap();
    let sid = a.subscribe("svc.*", None).await.unwrap();
    a.flush().await.unwrap();

    let block = b"NATS/1.0\r\nX-A: a\nNats-Request-Info: {\"acc\":\"TB\"}\r\nX-B: b\r\n \r\n";
    let reply = b.send_request("svc.x", Some(block), b"hi").await.unwrap();
    let msg = a.next_on(sid).await.unwrap();
    assert_eq!(msg.subject, "svc.x");
    assert_eq!(msg.headers.as_deref(), Some(&block[..]));
    assert_eq!(msg.payload, b"hi");
    assert_eq!(msg.reply.as_deref(), Some(reply.as_str()));
    a.publish(&reply, None, b"ok").await.unwrap();
    let answer = b.reply_to(&reply).await.unwrap();
    assert_eq!(answer.payload, b"ok");
    assert_eq!(answer.headers, None);

    let none = b.request("nobody.here", None, b"").await.unwrap();
    assert_eq!(none.status(), Some(503));

    b.subscribe("secret.x", None).await.unwrap();
    let error = b.next_error().await.unwrap();
    assert!(
        error.contains("Permissions Violation") && error.contains("secret.x"),
        "{error}"
    );
    let refused = RawClient::connect_as(&url, "a", "wrong").await.unwrap_err();
    assert!(refused.to_string().contains("Authorization"), "{refused}");
}
