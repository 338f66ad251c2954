//! A TCP relay the harness can cut: how a cluster's route links are partitioned.
//!
//! There is no iptables in the sandbox, and nodes on loopback in one network
//! namespace cannot be cut apart by the kernel. So every route link between two
//! nodes goes through a [`Link`]: node A dials the link's own port, the link dials
//! node B's cluster port and copies bytes both ways. [`Link::cut`] closes every
//! connection through it and refuses new ones (accepts, then closes at once) until
//! [`Link::heal`]; to the nodes this looks like a network that resets their route
//! connections and refuses new ones. Client connections do not go through links: a
//! node cut off from its peers still serves its own clients, as in a real partition
//! that splits a node (with its clients) from the rest of the cluster.
//!
//! The stop matrix (`adapter-tokio/tests/stop_matrix.rs`) puts client connections
//! through a link instead: [`Link::cut`] is then a route to the server gone, and
//! [`Link::set_delay`] a slow one (every chunk of bytes held back before it is
//! passed on).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One direction of dialing (node A to node B) through a relay that can be cut.
#[derive(Debug)]
pub struct Link {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    target: Mutex<Option<SocketAddr>>,
    cut: AtomicBool,
    stopped: AtomicBool,
    /// Microseconds each chunk is held back before it is passed on.
    delay_us: AtomicU64,
    conns: Mutex<Vec<TcpStream>>,
}

impl Shared {
    fn close_all(&self) {
        for conn in self.conns.lock().unwrap().drain(..) {
            let _ = conn.shutdown(Shutdown::Both);
        }
    }
}

impl Link {
    /// Binds a free loopback port and relays each connection to the target, once set.
    pub fn bind() -> std::io::Result<Link> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let accept_shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name(format!("link-{}", addr.port()))
            .spawn(move || accept_loop(listener, accept_shared))?;
        Ok(Link { addr, shared })
    }

    /// The port nodes dial.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where connections are relayed to (the far node's cluster port).
    pub fn set_target(&self, target: SocketAddr) {
        *self.shared.target.lock().unwrap() = Some(target);
    }

    /// Closes every connection through the link and refuses new ones until healed.
    pub fn cut(&self) {
        self.shared.cut.store(true, Ordering::SeqCst);
        self.shared.close_all();
    }

    /// Relays again.
    pub fn heal(&self) {
        self.shared.cut.store(false, Ordering::SeqCst);
    }

    /// Holds every chunk of bytes back by `delay` (both ways) before passing it on,
    /// from the next chunk on: a slow route. `Duration::ZERO` passes bytes at once.
    pub fn set_delay(&self, delay: Duration) {
        let us = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.shared.delay_us.store(us, Ordering::SeqCst);
    }

    /// Whether the link is cut.
    pub fn is_cut(&self) -> bool {
        self.shared.cut.load(Ordering::SeqCst)
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        self.shared.close_all();
        // Wake the accept loop so that it sees `stopped`.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(100));
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for incoming in listener.incoming() {
        if shared.stopped.load(Ordering::SeqCst) {
            return;
        }
        let Ok(inbound) = incoming else { continue };
        let target = *shared.target.lock().unwrap();
        let (false, Some(target)) = (shared.cut.load(Ordering::SeqCst), target) else {
            let _ = inbound.shutdown(Shutdown::Both);
            continue;
        };
        let Ok(outbound) = TcpStream::connect_timeout(&target, Duration::from_secs(1)) else {
            let _ = inbound.shutdown(Shutdown::Both);
            continue;
        };
        let _ = inbound.set_nodelay(true);
        let _ = outbound.set_nodelay(true);
        let clones = (
            inbound.try_clone(),
            outbound.try_clone(),
            inbound.try_clone(),
            outbound.try_clone(),
        );
        let (Ok(in2), Ok(out2), Ok(in3), Ok(out3)) = clones else {
            continue;
        };
        {
            let mut conns = shared.conns.lock().unwrap();
            conns.push(in3);
            conns.push(out3);
        }
        // A cut between the checks above and the registration: close at once.
        if shared.cut.load(Ordering::SeqCst) {
            shared.close_all();
        }
        let s1 = Arc::clone(&shared);
        let s2 = Arc::clone(&shared);
        std::thread::spawn(move || pump(inbound, out2, &s1));
        std::thread::spawn(move || pump(outbound, in2, &s2));
    }
}

/// Copies `from` to `to` until either side closes or the link is cut.
fn pump(mut from: TcpStream, mut to: TcpStream, shared: &Shared) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let delay = shared.delay_us.load(Ordering::SeqCst);
        if delay > 0 {
            std::thread::sleep(Duration::from_micros(delay));
        }
        if shared.cut.load(Ordering::SeqCst) || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
