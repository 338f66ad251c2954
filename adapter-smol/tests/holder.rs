//! The holder library on smol, with no tokio runtime in the test: an elector is
//! elected, another member takes over when it stops, and the typed calls answer.

use std::time::Duration;

use dagnats_leases_smol::Ownership;
use dagnats_leases_tests::NatsServer;

fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    smol::block_on(async {
        futures_lite_timeout(f, Duration::from_secs(20))
            .await
            .expect("in time")
    })
}

async fn futures_lite_timeout<T>(
    f: impl std::future::Future<Output = T>,
    d: Duration,
) -> Option<T> {
    smol::future::or(async { Some(f.await) }, async {
        smol::Timer::after(d).await;
        None
    })
    .await
}

/// The service on smol, connected to `url`.
async fn serve(url: &str) -> dagnats_leases_smol::ServiceHandle {
    let client = dagnats_leases_smol::connect(url).await.unwrap();
    dagnats_leases_smol::start((url, client), Default::default())
        .await
        .unwrap()
}

#[test]
fn an_elector_on_smol_is_elected_and_hands_over_on_stop() {
    let server = NatsServer::start();
    within(async {
        let url = server.url();
        let service = serve(&url).await;
        let a = dagnats_leases_smol::member(dagnats_leases_smol::connect(&url).await.unwrap(), "a")
            .unwrap();
        let b = dagnats_leases_smol::member(dagnats_leases_smol::connect(&url).await.unwrap(), "b")
            .unwrap();
        let mut ea = a.elect("leader", Duration::from_secs(2)).unwrap();
        let change = ea.next().await.unwrap();
        let Ownership::Elected { fence } = change.ownership else {
            panic!("{change:?}")
        };
        let mut eb = b.elect("leader", Duration::from_secs(2)).unwrap();
        let leases =
            dagnats_leases_smol::lease_client(dagnats_leases_smol::connect(&url).await.unwrap());
        assert_eq!(leases.owner("leader").await.unwrap().unwrap().holder, "a");
        ea.stop().await;
        let change = eb.next().await.unwrap();
        let Ownership::Elected { fence: next } = change.ownership else {
            panic!("{change:?}")
        };
        assert!(next > fence);
        assert_eq!(leases.owner("leader").await.unwrap().unwrap().holder, "b");
        eb.stop().await;
        assert_eq!(leases.owner("leader").await.unwrap(), None);
        service.shutdown().await;
    });
}

/// `acquire_waiting` times its wait on smol's timer: no tokio runtime in the test
/// (with tokio's timer this panicked: "there is no reactor running").
#[test]
fn a_waiting_acquire_on_smol_gives_up_at_its_wait_and_is_granted_on_release() {
    let server = NatsServer::start();
    within(async {
        let url = server.url();
        let service = serve(&url).await;
        let leases =
            dagnats_leases_smol::lease_client(dagnats_leases_smol::connect(&url).await.unwrap());
        let ttl = Duration::from_secs(10);
        let held = leases.acquire("gate", "c", ttl).await.unwrap();
        assert!(held.granted);
        let refused = leases
            .acquire_waiting("gate", "d", ttl, Duration::from_millis(300))
            .await
            .unwrap();
        assert!(!refused.granted);
        let (waited, ()) = smol::future::zip(
            leases.acquire_waiting("gate", "d", ttl, Duration::from_secs(8)),
            async {
                smol::Timer::after(Duration::from_millis(300)).await;
                leases
                    .release("gate", "c", held.lease.revision)
                    .await
                    .unwrap();
            },
        )
        .await;
        let waited = waited.unwrap();
        assert!(waited.granted);
        assert_eq!(waited.lease.holder, "d");
        service.shutdown().await;
    });
}
