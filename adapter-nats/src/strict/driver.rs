//! The strict connection's one task: it carries out what the [`Connection`]
//! machine says (dial, upgrade to TLS, drop the socket), feeds it what the socket
//! reads and what the handles ask, writes its bytes, arms its one timer, and
//! hands each message, reply and flush to whoever waits for it.

use std::collections::HashMap;
use std::future::poll_fn;
use std::io;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use dagnats_leases_core::RequestOutcome;
use dagnats_leases_core::health::LinkEvent;
use dagnats_leases_core::proto::{
    ConnEvent, Connection, ConnectionConfig, Delivered, FlushId, RequestId, ServerInfo, Sid,
};
use futures::future::BoxFuture;
use futures::io::{AsyncReadExt as _, AsyncWriteExt as _, ReadHalf, WriteHalf};
use tokio::sync::{mpsc, oneshot};

use super::{Command, TlsSettings, tls};
use crate::runtime::{BoxSocket, Runtime, Sleep};

const READ_BUFFER: usize = 64 * 1024;

type ReadOut<S> = (S, Vec<u8>, io::Result<usize>);

/// Where the socket is.
enum Sock {
    None,
    Dialing(BoxFuture<'static, io::Result<BoxSocket>>),
    /// Before the handshake's CONNECT: the whole socket, read for INFO (it may be
    /// upgraded to TLS next).
    Whole(BoxFuture<'static, ReadOut<BoxSocket>>),
    Upgrading(BoxFuture<'static, io::Result<BoxSocket>>),
    /// Read and written at once.
    Split(BoxFuture<'static, ReadOut<ReadHalf<BoxSocket>>>),
}

enum Input {
    Command(Option<Command>),
    Dialed(io::Result<BoxSocket>),
    ReadWhole(ReadOut<BoxSocket>),
    Upgraded(io::Result<BoxSocket>),
    Read(ReadOut<ReadHalf<BoxSocket>>),
    Wrote(WriteHalf<BoxSocket>, io::Result<()>),
    Timer(Instant),
}

fn read<S: futures::io::AsyncRead + Unpin + Send + 'static>(
    mut socket: S,
    mut buf: Vec<u8>,
) -> BoxFuture<'static, ReadOut<S>> {
    Box::pin(async move {
        buf.resize(READ_BUFFER, 0);
        let n = socket.read(&mut buf).await;
        (socket, buf, n)
    })
}

pub(super) struct Driver {
    runtime: Arc<dyn Runtime>,
    conn: Connection,
    tls: Option<TlsSettings>,
    commands: mpsc::UnboundedReceiver<Command>,
    first: Option<oneshot::Sender<Result<ServerInfo, String>>>,
    servers: usize,
    /// Logs the connection's ups and downs (one warning per outage) and counts
    /// them for readiness.
    links: crate::links::LinkReporter,
    socket: Sock,
    /// A socket in hand between two steps (read for INFO, upgraded).
    parked: Option<BoxSocket>,
    /// The read buffer of the socket in hand.
    reuse: Option<Vec<u8>>,
    writer: Option<WriteHalf<BoxSocket>>,
    writing: Option<BoxFuture<'static, (WriteHalf<BoxSocket>, io::Result<()>)>>,
    subs: HashMap<Sid, mpsc::Sender<Delivered>>,
    requests: HashMap<RequestId, oneshot::Sender<RequestOutcome>>,
    sweep_at: usize,
    flushes: HashMap<FlushId, oneshot::Sender<()>>,
    timer: Option<(Instant, Sleep)>,
    dropped: u64,
    done: bool,
    commands_first: bool,
}

impl Driver {
    pub(super) fn new(
        runtime: Arc<dyn Runtime>,
        config: ConnectionConfig,
        tls: Option<TlsSettings>,
        commands: mpsc::UnboundedReceiver<Command>,
        first: oneshot::Sender<Result<ServerInfo, String>>,
        servers: usize,
        links: crate::links::LinkReporter,
    ) -> Self {
        let conn = Connection::new(config, runtime.now());
        Self {
            runtime,
            conn,
            tls,
            commands,
            first: Some(first),
            servers,
            links,
            socket: Sock::None,
            parked: None,
            reuse: None,
            writer: None,
            writing: None,
            subs: HashMap::new(),
            requests: HashMap::new(),
            sweep_at: 1024,
            flushes: HashMap::new(),
            timer: None,
            dropped: 0,
            done: false,
            commands_first: false,
        }
    }

    pub(super) async fn run(mut self) {
        self.settle();
        while !self.done {
            let input = self.next_input().await;
            self.apply(input);
            self.settle();
        }
    }

    async fn next_input(&mut self) -> Input {
        // Turn about between the handles' commands and the socket: a flood read
        // must not hold the replies back, nor the replies the reads.
        self.commands_first = !self.commands_first;
        let commands_first = self.commands_first;
        poll_fn(|cx| {
            if commands_first && let Poll::Ready(c) = self.commands.poll_recv(cx) {
                return Poll::Ready(Input::Command(c));
            }
            match &mut self.socket {
                Sock::None => {}
                Sock::Dialing(f) => {
                    if let Poll::Ready(r) = f.as_mut().poll(cx) {
                        self.socket = Sock::None;
                        return Poll::Ready(Input::Dialed(r));
                    }
                }
                Sock::Whole(f) => {
                    if let Poll::Ready(r) = f.as_mut().poll(cx) {
                        self.socket = Sock::None;
                        return Poll::Ready(Input::ReadWhole(r));
                    }
                }
                Sock::Upgrading(f) => {
                    if let Poll::Ready(r) = f.as_mut().poll(cx) {
                        self.socket = Sock::None;
                        return Poll::Ready(Input::Upgraded(r));
                    }
                }
                Sock::Split(f) => {
                    if let Poll::Ready(r) = f.as_mut().poll(cx) {
                        self.socket = Sock::None;
                        return Poll::Ready(Input::Read(r));
                    }
                }
            }
            if let Some(w) = &mut self.writing
                && let Poll::Ready((half, r)) = w.as_mut().poll(cx)
            {
                self.writing = None;
                return Poll::Ready(Input::Wrote(half, r));
            }
            if let Some((at, sleep)) = &mut self.timer
                && sleep.as_mut().poll(cx).is_ready()
            {
                let at = *at;
                self.timer = None;
                return Poll::Ready(Input::Timer(at));
            }
            if !commands_first && let Poll::Ready(c) = self.commands.poll_recv(cx) {
                return Poll::Ready(Input::Command(c));
            }
            Poll::Pending
        })
        .await
    }

    fn apply(&mut self, input: Input) {
        let now = self.runtime.now();
        match input {
            Input::Command(None) => self.conn.close(),
            Input::Command(Some(command)) => self.command(command),
            Input::Dialed(Ok(socket)) => {
                self.conn.handle_connected(now);
                self.socket = Sock::Whole(read(socket, Vec::new()));
            }
            Input::Dialed(Err(e)) => self.conn.handle_dial_failed(now, &e.to_string()),
            Input::ReadWhole((socket, buf, Ok(n))) if n > 0 => {
                self.parked = Some(socket);
                self.conn.handle_read(now, &buf[..n]);
                self.reuse = Some(buf);
            }
            Input::Read((half, buf, Ok(n))) if n > 0 => {
                self.conn.handle_read(now, &buf[..n]);
                self.socket = Sock::Split(read(half, buf));
            }
            Input::ReadWhole((_, _, r)) | Input::Read((_, _, r)) => {
                self.conn.handle_closed(now, &closed_why(r));
            }
            Input::Upgraded(Ok(socket)) => {
                self.parked = Some(socket);
                self.conn.handle_tls_ready(now);
            }
            Input::Upgraded(Err(e)) => self.conn.handle_closed(now, &format!("TLS: {e}")),
            Input::Wrote(half, Ok(())) => self.writer = Some(half),
            Input::Wrote(_, Err(e)) => self.conn.handle_closed(now, &format!("write: {e}")),
            Input::Timer(at) => {
                self.conn.handle_timeout(now.max(at));
                self.sweep();
            }
        }
    }
}

fn closed_why(r: io::Result<usize>) -> String {
    match r {
        Ok(_) => "the server closed the connection".to_string(),
        Err(e) => format!("read: {e}"),
    }
}

impl Driver {
    fn command(&mut self, command: Command) {
        match command {
            Command::Subscribe {
                subject,
                queue,
                messages,
                done,
            } => {
                let made = self.conn.subscribe(&subject, queue.as_deref());
                if let Ok(sid) = made {
                    self.subs.insert(sid, messages);
                }
                let _ = done.send(made);
            }
            Command::Drain(sid) => self.conn.drain(sid),
            Command::Publish {
                subject,
                reply,
                headers,
                payload,
                done,
            } => {
                let headers: Vec<(&str, &str)> = headers
                    .iter()
                    .map(|(n, v)| (n.as_str(), v.as_str()))
                    .collect();
                let _ =
                    done.send(
                        self.conn
                            .publish(&subject, reply.as_deref(), &headers, &payload),
                    );
            }
            Command::Request {
                subject,
                headers,
                payload,
                outcome,
            } => {
                let headers: Vec<(&str, &str)> = headers
                    .iter()
                    .map(|(n, v)| (n.as_str(), v.as_str()))
                    .collect();
                match self.conn.request(&subject, &headers, &payload) {
                    Ok(id) => {
                        self.requests.insert(id, outcome);
                        if self.requests.len() >= self.sweep_at {
                            self.sweep();
                        }
                    }
                    Err(e) => {
                        let _ = outcome.send(RequestOutcome::Failed(e.to_string()));
                    }
                }
            }
            Command::Flush(done) => {
                let id = self.conn.flush();
                self.flushes.insert(id, done);
            }
        }
    }

    /// Forgets the requests whose caller gave up.
    fn sweep(&mut self) {
        let conn = &mut self.conn;
        self.requests.retain(|id, outcome| {
            let waiting = !outcome.is_closed();
            if !waiting {
                conn.cancel_request(*id);
            }
            waiting
        });
        self.sweep_at = (self.requests.len() * 2).max(1024);
    }

    /// Carries out the machine's events, puts a socket in hand to work, starts a
    /// write, and arms the timer.
    fn settle(&mut self) {
        {
            while let Some(event) = self.conn.poll_event() {
                self.event(event);
            }
            if let Some(socket) = self.parked.take() {
                match self.conn.poll_transmit() {
                    // CONNECT is out: read and write at once from now on.
                    Some(bytes) => {
                        let (reader, writer) = socket.split();
                        let buf = self.reuse.take().unwrap_or_default();
                        self.socket = Sock::Split(read(reader, buf));
                        self.write(writer, bytes);
                    }
                    None => {
                        let buf = self.reuse.take().unwrap_or_default();
                        self.socket = Sock::Whole(read(socket, buf));
                    }
                }
            }
            if self.writing.is_none()
                && let Some(writer) = self.writer.take()
            {
                match self.conn.poll_transmit() {
                    Some(bytes) => self.write(writer, bytes),
                    None => self.writer = Some(writer),
                }
            }
        }
        let at = self.conn.poll_timeout();
        if self.timer.as_ref().map(|(t, _)| *t) != at {
            self.timer = at.map(|at| (at, self.runtime.sleep_until(at)));
        }
    }

    fn write(&mut self, mut writer: WriteHalf<BoxSocket>, bytes: Vec<u8>) {
        self.writing = Some(Box::pin(async move {
            let mut r = writer.write_all(&bytes).await;
            if r.is_ok() {
                r = writer.flush().await;
            }
            (writer, r)
        }));
    }

    fn drop_socket(&mut self) {
        self.socket = Sock::None;
        self.parked = None;
        self.writer = None;
        self.writing = None;
    }

    fn event(&mut self, event: ConnEvent) {
        match event {
            ConnEvent::Dial { addr, .. } => {
                self.drop_socket();
                self.socket = Sock::Dialing(self.runtime.connect_tcp(addr.host, addr.port));
            }
            ConnEvent::UpgradeTls { host } => {
                let Some(socket) = self.parked.take() else {
                    return;
                };
                let config = match &self.tls {
                    Some(settings) => Ok(settings.0.clone()),
                    None => tls::client_config(None, None),
                };
                self.socket = Sock::Upgrading(match config {
                    Ok(config) => Box::pin(tls::upgrade(config, host, socket)),
                    Err(e) => Box::pin(async move { Err(io::Error::other(e.to_string())) }),
                });
            }
            ConnEvent::CloseSocket => self.drop_socket(),
            ConnEvent::Connected(info) => match self.first.take() {
                Some(first) => {
                    let _ = first.send(Ok(*info));
                }
                None => self.links.report(LinkEvent::Connected),
            },
            ConnEvent::Disconnected {
                why,
                ever_connected,
                failures,
            } => {
                if !ever_connected && failures as usize >= self.servers {
                    if let Some(first) = self.first.take() {
                        let _ = first.send(Err(why));
                        self.conn.close();
                    }
                } else if failures <= 1 {
                    // The first failure of an outage is the loss itself.
                    self.links.report(LinkEvent::Disconnected);
                } else {
                    self.links.report(LinkEvent::AttemptFailed(why));
                }
            }
            ConnEvent::Message { sid, message } => {
                if let Some(messages) = self.subs.get(&sid) {
                    match messages.try_send(message) {
                        Ok(()) => {}
                        Err(mpsc::error::TrySendError::Full(_)) => {
                            self.dropped += 1;
                            if self.dropped.is_power_of_two() {
                                tracing::warn!(
                                    dropped = self.dropped,
                                    "strict connection: a subscriber is slow; messages dropped"
                                );
                            }
                        }
                        Err(mpsc::error::TrySendError::Closed(_)) => {
                            self.subs.remove(&sid);
                            self.conn.unsubscribe(sid);
                        }
                    }
                }
            }
            ConnEvent::Replied { id, outcome } => {
                if let Some(waiting) = self.requests.remove(&id) {
                    let _ = waiting.send(outcome);
                }
            }
            ConnEvent::Flushed(id) => {
                if let Some(waiting) = self.flushes.remove(&id) {
                    let _ = waiting.send(());
                }
            }
            ConnEvent::Drained(sid) => {
                self.subs.remove(&sid);
            }
            ConnEvent::ServerError(text) => tracing::warn!("strict connection: -ERR {text}"),
            ConnEvent::Closed => {
                self.drop_socket();
                self.done = true;
            }
        }
    }
}
