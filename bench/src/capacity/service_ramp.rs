//! The service's capacity ramp: a fresh nats-server (or cluster) and service,
//! the holder library's members added a thousand keys at a time, each step held
//! for a window with CPU and renewals measured (and profiled with `--cpu-profile`).

use super::*;

/// The service's ramp: a fresh server (or cluster) and service, holders added a
/// member of [`PER_MEMBER`] keys at a time.
pub(super) async fn service(
    out: &Path,
    name: &str,
    setting: Setting,
    options: &Options,
    handle: &metrics_exporter_prometheus::PrometheusHandle,
) -> Capacity {
    let Setting {
        cluster,
        shards,
        coalesce,
        renew_many,
    } = setting;
    let load = load_average();
    let server = if cluster {
        servers::Server::Cluster(servers::Cluster::start().await)
    } else if options.profile.is_some() {
        servers::Server::Single(servers::Nats::start_profiled(servers::Sync::Always))
    } else {
        servers::Server::Single(servers::Nats::start_sync(servers::Sync::Always))
    };
    let imp = match coalesce {
        CoalesceWrites::Auto => Impl::Tokio,
        CoalesceWrites::On => Impl::TokioBatched,
        CoalesceWrites::Off => Impl::TokioSingle,
    };
    let account = Impl::Tokio.name();
    let admin = server.connect(account).await;
    let mut extra_args = Vec::new();
    if coalesce == CoalesceWrites::Auto {
        // The capacity runs of record ran `auto`, the default.
        extra_args.extend(["--coalesce-writes".to_string(), "auto".to_string()]);
    }
    if let Some(n) = shards {
        extra_args.extend(["--shards".to_string(), n.to_string()]);
    }
    if !renew_many {
        extra_args.extend(["--renew-many".to_string(), "false".to_string()]);
    }
    let start_options = procs::Options {
        replicas: cluster.then_some(servers::CLUSTER_NODES),
        extra_args,
        ..procs::Options::default()
    };
    let running = procs::start_with(
        imp,
        account,
        &format!("capacity-{name}"),
        &server.url(),
        out,
        &admin,
        &start_options,
    )
    .await;
    if cluster && shards.is_none() {
        servers::Cluster::pin_leader(&admin, dagnats_leases_core::subjects::STREAM).await;
    }
    let setup = format!(
        "nats-server {}, sync_interval: always, {}{}{}{}; the tokio service; holders: the holder library, members of {PER_MEMBER} keys, one connection each",
        server.version(),
        if cluster {
            "three nodes on loopback, R3 bucket, leader on the node everything connects to"
        } else {
            "one server (R1)"
        },
        shards.map_or(String::new(), |n| format!(", --shards {n}")),
        match coalesce {
            CoalesceWrites::Auto => ", --coalesce-writes auto (as it ships)",
            CoalesceWrites::On => ", --coalesce-writes true",
            CoalesceWrites::Off => ", --coalesce-writes false",
        },
        if renew_many {
            ", renew_many served (renewals grouped)"
        } else {
            ", --renew-many false (one renewal a request)"
        },
    );
    println!("capacity {name}: {setup}");
    let server_pids: Vec<u32> = server.nodes().iter().map(|n| n.pid()).collect();
    let mut holders = Holders::new(&server.url(), account, &format!("cap-{name}"));
    let (held, lost) = (holders.held.clone(), holders.lost.clone());
    let renews = || {
        sample(
            &handle.render(),
            &format!("{}_count", dagnats_leases_tokio::telemetry::RENEW_DURATION),
        )
        .unwrap_or(0.0)
    };
    let mut have = 0;
    let mut steps = Vec::new();
    let mut recorded = None;
    for &target in &options.steps {
        // A profile is of the last step, and only if that step had a window.
        recorded = None;
        let lost0 = lost.load(Ordering::Relaxed);
        let t0 = Instant::now();
        // Members join one after another, the next once the leases so far are
        // held (as `--scale-gradual`), so a step is not one burst of acquires.
        while have < target && t0.elapsed() < RAMP_BOUND && lost.load(Ordering::Relaxed) == lost0 {
            let upto = (have + PER_MEMBER).min(target);
            holders.add_member(have..upto).await;
            have = upto;
            let joined = Instant::now();
            while (held.load(Ordering::Relaxed) as usize) < have
                && joined.elapsed() < MEMBER_BOUND
                && t0.elapsed() < RAMP_BOUND
                && lost.load(Ordering::Relaxed) == lost0
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        // Every member has joined: the last sets get until the ramp's bound.
        while (held.load(Ordering::Relaxed) as usize) < target
            && t0.elapsed() < RAMP_BOUND
            && lost.load(Ordering::Relaxed) == lost0
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let ramp_s = t0.elapsed().as_secs_f64();
        let ramped = held.load(Ordering::Relaxed) as usize >= target;
        let r0 = renews();
        let w = if ramped && lost.load(Ordering::Relaxed) == lost0 {
            // The profilers run for the window (the server, the service, and this
            // process, where the holders run).
            let recording = options.profile.as_ref().filter(|_| !cluster).map(|dir| {
                crate::cpu_profile::Recording::start(
                    &dir.join(format!("{name}-{target}")),
                    options.hold_s,
                    &[
                        (crate::cpu_profile::Role::Server, server_pids[0]),
                        (crate::cpu_profile::Role::Service, running.pid()),
                        (crate::cpu_profile::Role::Holders, std::process::id()),
                    ],
                    &server.nodes()[0],
                )
            });
            let w = window(
                options.hold_s,
                Some(running.pid()),
                &server_pids,
                || lost.load(Ordering::Relaxed),
                lost0,
            )
            .await;
            if let Some(r) = recording {
                let node = &server.nodes()[0];
                recorded = Some(tokio::task::block_in_place(|| r.finish(node)));
            }
            w
        } else {
            window(0, Some(running.pid()), &server_pids, || 0, 0).await
        };
        let text = handle.render();
        let q = |quantile: &str| {
            sample(
                &text,
                &format!(
                    "{}{{quantile=\"{quantile}\"}}",
                    dagnats_leases_tokio::telemetry::RENEW_DURATION
                ),
            )
            .map_or(f64::NAN, |s| s * 1e3)
        };
        let lost_now = lost.load(Ordering::Relaxed) - lost0;
        let held_now = held.load(Ordering::Relaxed);
        let why = why_failed(
            target,
            ramp_s,
            ramped,
            held_now,
            lost_now,
            Some(holders.lost_reasons()),
            None,
        );
        // The holders' counters so far (renewals by outcome, retries, step-downs
        // by reason), kept for reading a step afterwards.
        let _ = std::fs::write(
            out.join(format!("capacity-{name}-{target}-metrics.txt")),
            &text,
        );
        if !record_step(
            &mut steps,
            target,
            ramp_s,
            held_now,
            lost_now,
            &w,
            ramped.then(|| renews() - r0),
            (q("0.5"), q("0.99")),
            why,
        ) {
            break;
        }
    }
    println!("capacity {name}: {} members; stopping", holders.members());
    holders.stop();
    running.stop();
    drop(server);
    let mut capacity = capacity_of(steps, setup, options.hold_s, load);
    capacity.recorded = recorded;
    capacity
}
