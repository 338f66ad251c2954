//! The NATS client protocol, read and written strictly, with no IO: a parser of
//! what the server writes ([`parse`]), an encoder of what the client writes
//! ([`encode`]), and one connection as a machine ([`conn`]).
//!
//! Why the service has its own: every message a caller or an owner writes reaches
//! the service through this connection, and nats-server relays a header block
//! unchecked. A lenient reader lets a caller forge a header by folding or a bare
//! LF, and one that treats a block it cannot parse as an error of the whole
//! connection lets any caller reset the service's connection, and every request
//! in flight on it. Here a malformed header block makes that one message carry a
//! [`parse::HeaderError`]; only the server's own framing ([`parse::ProtocolError`])
//! ends the connection.

pub mod conn;
pub mod encode;
pub mod parse;

pub use conn::{
    Auth, ConnEvent, Connection, ConnectionConfig, FlushId, NonceSigner, RequestId, SendError,
    ServerAddr, Sid,
};
pub use encode::EncodeError;
pub use parse::{
    Delivered, HeaderError, HeaderErrorKind, Headers, Parser, ProtocolError, ServerInfo, ServerOp,
};
