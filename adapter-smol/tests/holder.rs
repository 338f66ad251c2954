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

#[test]
fn an_elector_on_smol_is_elected_and_hands_over_on_stop() {
    let server = NatsServer::start();
    within(async {
        let url = server.url();
        let service_client = dagnats_leases_smol::connect(&url).await.unwrap();
        let service = dagnats_leases_smol::start(service_client, Default::default())
            .await
            .unwrap();
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
