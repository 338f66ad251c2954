//! etcd's capacity ramp: a fresh etcd, leases granted with a key each and kept
//! alive over a few keepalive streams, each step held for a window; a build
//! without the `etcd` feature reports it left out.

use super::*;

#[cfg(not(feature = "etcd"))]
pub(super) async fn etcd(_out: &Path, name: &str, _members: usize, options: &Options) -> Capacity {
    println!("capacity {name}: left out: this build lacks the `etcd` feature");
    capacity_of(
        Vec::new(),
        "not run".to_string(),
        options.hold_s,
        load_average(),
    )
}

/// etcd's ramp: a fresh etcd (one member or three), leases granted
/// [`ETCD_GRANTS_IN_FLIGHT`] at a time, each with a key, kept alive over
/// [`ETCD_STREAMS`] streams to the leader.
#[cfg(feature = "etcd")]
pub(super) async fn etcd(out: &Path, name: &str, members: usize, options: &Options) -> Capacity {
    use futures::StreamExt;

    let load = load_average();
    let etcd = if members == 1 {
        crate::etcd::Etcd::start(out)
    } else {
        crate::etcd::Etcd::start_cluster(out)
    };
    let client = etcd.client().await;
    let url = etcd.leader_url().await;
    let setup = format!(
        "etcd {}, {members} member(s) on loopback (fsync as shipped), every call to the leader; leases kept alive over {ETCD_STREAMS} keepalive streams, each on its own connection, carrying many leases",
        etcd.version()
    );
    println!("capacity {name}: {setup}");
    let pids = etcd.pids();
    let mut keepers = crate::etcd::KeepAlives::open(&url, ETCD_STREAMS, TTL / 3).await;
    let counts = keepers.counts.clone();
    let prefix = format!("cap-{name}-");
    let mut have = 0;
    let mut steps = Vec::new();
    for &target in &options.steps {
        let lost0 = counts.expired.load(Ordering::Relaxed);
        let t0 = Instant::now();
        let mut grants = futures::stream::iter(have..target)
            .map(|i| crate::etcd::hold_for(&client, format!("{prefix}{i}"), TTL.as_secs() as i64))
            .buffer_unordered(ETCD_GRANTS_IN_FLIGHT);
        while let Some(lease) = grants.next().await {
            keepers.add(lease);
        }
        drop(grants);
        have = target;
        let ramp_s = t0.elapsed().as_secs_f64();
        let r0 = counts.replies.load(Ordering::Relaxed);
        counts.take_latencies();
        let windowed = counts.expired.load(Ordering::Relaxed) == lost0;
        let w = if windowed {
            window(
                options.hold_s,
                None,
                &pids,
                || counts.expired.load(Ordering::Relaxed),
                lost0,
            )
            .await
        } else {
            window(0, None, &pids, || 0, 0).await
        };
        let mut lat = counts.take_latencies();
        lat.sort_unstable();
        let pick = |p: f64| {
            if lat.is_empty() {
                f64::NAN
            } else {
                lat[((lat.len() as f64 - 1.0) * p).round() as usize] as f64 / 1e3
            }
        };
        let live = client
            .clone()
            .get(
                prefix.as_str(),
                Some(
                    etcd_client::GetOptions::new()
                        .with_prefix()
                        .with_count_only(),
                ),
            )
            .await
            .map_or(-1, |r| r.count());
        let lost_now = counts.expired.load(Ordering::Relaxed) - lost0;
        let broken = counts.broken.load(Ordering::Relaxed);
        // Every grant has come back by now: the ramp held what it asked for.
        let other = if live != target as i64 {
            Some(format!("{live} of {target} keys left at the window's end"))
        } else if broken > 0 {
            Some(format!("{broken} keepalive streams broke"))
        } else {
            None
        };
        let why = why_failed(target, ramp_s, true, live, lost_now, None, other);
        if !record_step(
            &mut steps,
            target,
            ramp_s,
            live,
            lost_now,
            &w,
            windowed.then(|| (counts.replies.load(Ordering::Relaxed) - r0) as f64),
            (pick(0.5), pick(0.99)),
            why,
        ) {
            break;
        }
    }
    keepers.stop();
    drop(etcd);
    capacity_of(steps, setup, options.hold_s, load)
}
