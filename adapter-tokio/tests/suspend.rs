//! Deadlines count time suspended: a member whose runtime's clock jumps ahead (as
//! `CLOCK_BOOTTIME` does over a suspend, while `CLOCK_MONOTONIC` stands still) stops
//! believing at once, on a real server and service. The clock that jumps is a test
//! runtime's (`JumpingClock`, a stand-in for a suspend); everything else is the
//! library as shipped.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use dagnats_leases_core::subjects::{HDR_FENCE, HDR_REJECT};
use dagnats_leases_tests::NatsServer;
use dagnats_leases_tokio::clock;
use dagnats_leases_tokio::member::{Member, Ownership};
use dagnats_leases_tokio::runtime::{Runtime, Sleep, Task};
use dagnats_leases_tokio::service::{self, ServiceOptions};

/// The tokio runtime with a clock that can be moved ahead: a suspend of the machine,
/// as the suspend-counting clock sees it.
#[derive(Debug, Default)]
struct JumpingClock {
    ahead_ms: AtomicU64,
}

impl JumpingClock {
    fn jump(&self, by: Duration) {
        self.ahead_ms
            .fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }
}

impl Runtime for JumpingClock {
    fn spawn(&self, future: Task) {
        tokio::spawn(future);
    }

    fn sleep_until(&self, deadline: Instant) -> Sleep {
        Box::pin(tokio::time::sleep(
            deadline.saturating_duration_since(self.now()),
        ))
    }

    fn now(&self) -> Instant {
        clock::now() + Duration::from_millis(self.ahead_ms.load(Ordering::SeqCst))
    }

    fn connect_tcp(
        &self,
        host: String,
        port: u16,
    ) -> futures::future::BoxFuture<
        'static,
        std::io::Result<dagnats_leases_tokio::runtime::BoxSocket>,
    > {
        dagnats_leases_tokio::runtime::TokioRuntime.connect_tcp(host, port)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_suspend_longer_than_the_lease_the_holder_believes_nothing() {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let _service = service::start((server.url(), client.clone()), ServiceOptions::default())
        .await
        .unwrap();
    let runtime = Arc::new(JumpingClock::default());
    let member = Member::with_runtime(client.clone(), "sleeper", runtime.clone()).unwrap();
    let _inbox = member.inbox().await.unwrap();
    let mut elector = member.elect("leader", Duration::from_secs(3)).unwrap();
    let fence = match elector.next().await.map(|c| c.ownership) {
        Some(Ownership::Elected { fence }) => fence,
        other => panic!("not elected: {other:?}"),
    };
    let tenure = elector.tenure().expect("owner right after the election");
    let direct = async |fence: u64| {
        let mut headers = HeaderMap::new();
        headers.insert(HDR_FENCE, fence.to_string().as_str());
        let reply = client
            .request_with_headers("dagnats.lease.inbox.sleeper.leader", headers, "x".into())
            .await
            .unwrap();
        reply
            .headers
            .as_ref()
            .and_then(|h| h.get(HDR_REJECT))
            .map(|v| v.as_str().to_string())
    };

    // The machine sleeps for longer than the lease has left; nothing ran meanwhile.
    let left = tenure.deadline.saturating_duration_since(runtime.now());
    runtime.jump(left + Duration::from_millis(1));
    assert!(
        !elector.is_leader(),
        "past the deadline on the suspend-counting clock"
    );
    assert!(elector.tenure().is_none());
    assert_eq!(
        direct(fence).await.as_deref(),
        Some("stale"),
        "the inbox guard refuses a request with the tenure's fence"
    );
    elector.stop().await;
}
