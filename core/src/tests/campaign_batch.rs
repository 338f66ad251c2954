//! Renewals in one request: the campaign batches the renewals due together where the
//! service advertises `renew_many`, never later than each key's own schedule, and
//! splits the reply back into each key's renew reply; without it, one by one.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::holder::campaign::{Campaign, CampaignEvent, CampaignTransmit};
use crate::holder::{HolderConfig, HolderEvent, HolderStatus, StepDownReason};
use crate::io::{RequestOutcome, TransmitId};
use crate::wire::{Endpoint, renew_many_subject};

const TTL: Duration = Duration::from_secs(15);

const INFO: &[u8] =
    br#"{"name":"dagnats-api","endpoints":[{"name":"renew"},{"name":"renew_many"}]}"#;

fn lease(key: &str, revision: u64) -> Value {
    json!({"held": true, "key": key, "holder": "h1", "revision": revision,
        "acquired_at": "2026-10-18T12:00:00Z", "expires_at": "2026-10-18T12:00:15Z",
        "ttl_ms": 15000})
}

fn reply(v: Value) -> RequestOutcome {
    RequestOutcome::reply(v.to_string())
}

struct Run {
    campaign: Campaign,
    t0: Instant,
}

impl Run {
    fn new(batching: bool) -> Self {
        let t0 = Instant::now();
        let mut campaign = Campaign::new("h1", t0).unwrap();
        if batching {
            campaign.handle_service_info(INFO);
        }
        assert_eq!(campaign.batches_renewals(), batching);
        Self { campaign, t0 }
    }

    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    fn requests(&mut self) -> Vec<CampaignTransmit> {
        std::iter::from_fn(|| self.campaign.poll_transmit()).collect()
    }

    /// The keys a request renews: those of a batch's items, or a renew's one key.
    fn keys(t: &CampaignTransmit) -> Vec<String> {
        let body: Value = serde_json::from_slice(&t.transmit.request.payload).unwrap();
        match body["leases"].as_array() {
            Some(items) => items
                .iter()
                .map(|i| i["key"].as_str().unwrap().to_string())
                .collect(),
            None => vec![body["key"].as_str().unwrap().to_string()],
        }
    }

    fn is_batch(t: &CampaignTransmit) -> bool {
        t.transmit.request.subject == renew_many_subject()
    }

    /// Keys `keys` elected at `ms` one at a time (batching off meanwhile), their
    /// fences `10 * i`.
    fn elect(&mut self, ms: u64, keys: &[&str]) {
        let on = self.campaign.batches_renewals();
        self.campaign.handle_service_info(b"{}");
        let now = self.at(ms);
        let configs = keys
            .iter()
            .map(|k| HolderConfig::new(*k, "h1", TTL))
            .collect();
        self.campaign.add_group(now, configs, keys.len()).unwrap();
        for key in keys {
            self.campaign.handle_watched(now, key);
        }
        for _ in 0..keys.len() * 2 {
            for t in self.requests() {
                let key = Self::keys(&t).remove(0);
                let mut v = lease(&key, 10);
                if t.endpoint == Endpoint::Acquire {
                    v["granted"] = json!(true);
                }
                self.campaign.handle_outcome(now, t.transmit.id, reply(v));
            }
        }
        for key in keys {
            assert_eq!(
                self.campaign.status(key),
                Some(HolderStatus::Owner),
                "{key}"
            );
        }
        if on {
            self.campaign.handle_service_info(INFO);
        }
        self.events();
    }

    fn events(&mut self) -> Vec<CampaignEvent> {
        std::iter::from_fn(|| self.campaign.poll_event()).collect()
    }

    /// The next due instant, fed to the campaign; the requests that go out then.
    fn tick(&mut self) -> (Instant, Vec<CampaignTransmit>) {
        let at = self.campaign.poll_timeout().expect("something due");
        self.campaign.handle_timeout(at);
        (at, self.requests())
    }
}

fn step_downs(events: &[CampaignEvent]) -> Vec<(String, StepDownReason)> {
    events
        .iter()
        .filter_map(|e| match e {
            CampaignEvent::Holder {
                key,
                event: HolderEvent::SteppedDown { reason },
                ..
            } => Some((key.clone(), *reason)),
            _ => None,
        })
        .collect()
}

#[test]
fn renewals_due_together_go_out_as_one_request_and_each_hears_its_own_reply() {
    let mut run = Run::new(true);
    run.elect(0, &["a", "b", "c"]);
    let (at, out) = run.tick();
    assert_eq!(out.len(), 1, "one request: {out:?}");
    let batch = &out[0];
    assert!(Run::is_batch(batch), "{batch:?}");
    let keys = Run::keys(batch);
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(sorted, ["a", "b", "c"]);
    let body: Value = serde_json::from_slice(&batch.transmit.request.payload).unwrap();
    assert_eq!(
        body["leases"][0],
        json!({"key": keys[0], "holder": "h1", "revision": 10, "ttl_ms": 15000}),
        "each item is the renew request alone"
    );
    // In the request's order: b lost, a and c renewed.
    let results: Vec<Value> = keys
        .iter()
        .map(|k| match k.as_str() {
            "a" => lease("a", 21),
            "b" => json!({"key": "b", "error": "the lease is not held", "kind": "lost"}),
            _ => lease("c", 23),
        })
        .collect();
    let results = json!({ "results": results });
    run.campaign
        .handle_outcome(at, batch.transmit.id, reply(results));
    let events = run.events();
    assert_eq!(
        step_downs(&events),
        [("b".to_string(), StepDownReason::Lost)]
    );
    assert_eq!(run.campaign.tenure("a", at).map(|t| t.fence), Some(21));
    assert_eq!(run.campaign.tenure("c", at).map(|t| t.fence), Some(23));
    assert!(run.campaign.tenure("b", at).is_none());
}

#[test]
fn an_owner_due_within_its_early_window_renews_with_one_due_now_and_none_goes_later() {
    let mut run = Run::new(true);
    run.elect(0, &["a"]);
    // b is due 1 s after a (inside a tenth of the TTL), c 3 s after (outside).
    run.elect(1_000, &["b"]);
    run.elect(3_000, &["c"]);
    let due_a = run.campaign.poll_timeout().unwrap();
    // Nothing goes out before the first renewal is due.
    run.campaign
        .handle_timeout(due_a - Duration::from_millis(1));
    assert!(run.requests().is_empty());
    let (at, out) = run.tick();
    assert_eq!(at, due_a);
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(Run::keys(&out[0]), ["a", "b"], "b early, c not");
    // c still renews at its own schedule, alone: nothing else is due near it.
    let (at_c, out) = run.tick();
    assert!(out.is_empty() || Run::keys(&out[0]) == ["c"], "{out:?}");
    assert!(
        at_c <= run.at(3_000) + TTL / 3,
        "c never later than its schedule"
    );
}

#[test]
fn without_the_endpoint_advertised_renewals_go_one_by_one() {
    let mut run = Run::new(false);
    run.elect(0, &["a", "b"]);
    let mut out = Vec::new();
    while out.len() < 2 {
        out.extend(run.tick().1);
    }
    assert_eq!(out.len(), 2, "{out:?}");
    assert!(
        out.iter()
            .all(|t| !Run::is_batch(t) && t.endpoint == Endpoint::Renew)
    );
    // An older service's INFO lists the five only: still one by one.
    run.campaign
        .handle_service_info(br#"{"name":"dagnats-api","endpoints":[{"name":"renew"}]}"#);
    assert!(!run.campaign.batches_renewals());
}

#[test]
fn no_responders_turns_batching_off_and_sends_each_renewal_alone_at_once() {
    for whole in [
        RequestOutcome::NoResponders,
        reply(json!({"error": "invalid renew_many request: ...", "kind": "invalid"})),
    ] {
        let mut run = Run::new(true);
        run.elect(0, &["a", "b"]);
        let (at, out) = run.tick();
        assert!(Run::is_batch(&out[0]));
        run.campaign
            .handle_outcome(at, out[0].transmit.id, whole.clone());
        assert!(!run.campaign.batches_renewals());
        let again = run.requests();
        assert_eq!(again.len(), 2, "{whole:?}: {again:?}");
        assert!(again.iter().all(|t| !Run::is_batch(t)));
        for t in &again {
            let key = Run::keys(t).remove(0);
            let rev = if key == "a" { 31 } else { 32 };
            run.campaign
                .handle_outcome(at, t.transmit.id, reply(lease(&key, rev)));
        }
        assert_eq!(run.campaign.tenure("a", at).map(|t| t.fence), Some(31));
        assert_eq!(run.campaign.tenure("b", at).map(|t| t.fence), Some(32));
        assert!(step_downs(&run.events()).is_empty());
    }
}

#[test]
fn a_whole_request_answer_is_every_items_and_a_malformed_reply_an_unknown_outcome() {
    for name in [
        "unavailable",
        "one result for two",
        "out of order",
        "failed",
    ] {
        let mut run = Run::new(true);
        run.elect(0, &["a", "b"]);
        let (at, out) = run.tick();
        let keys = Run::keys(&out[0]);
        let outcome = match name {
            "unavailable" => reply(json!({"error": "busy", "kind": "unavailable"})),
            "one result for two" => reply(json!({"results": [lease(&keys[0], 40)]})),
            "out of order" => reply(json!({"results": [lease(&keys[1], 40), lease(&keys[0], 41)]})),
            _ => RequestOutcome::Failed("gone".into()),
        };
        run.campaign.handle_outcome(at, out[0].transmit.id, outcome);
        let events = run.events();
        let answered: Vec<(String, bool)> = events
            .iter()
            .filter_map(|e| match e {
                CampaignEvent::Answered(a) => Some((a.key.clone(), a.class.is_clear())),
                _ => None,
            })
            .collect();
        assert_eq!(answered.len(), 2, "{name}: {events:?}");
        assert!(
            answered.iter().all(|(_, clear)| !clear),
            "{name}: no renewal believed"
        );
        // Both still own their keys at the fence they had: nothing was believed.
        assert_eq!(
            run.campaign.tenure("a", at).map(|t| t.fence),
            Some(10),
            "{name}"
        );
        assert_eq!(
            run.campaign.tenure("b", at).map(|t| t.fence),
            Some(10),
            "{name}"
        );
    }
}

#[test]
fn each_renewal_times_out_at_its_own_deadline_and_the_spent_batch_is_cancelled() {
    let mut run = Run::new(true);
    run.elect(0, &["a", "b"]);
    let (at, out) = run.tick();
    let batch = out[0].transmit.id;
    let deadline = at + out[0].transmit.request.timeout;
    run.campaign.handle_timeout(deadline);
    let events = run.events();
    assert!(
        events.contains(&CampaignEvent::Cancel { id: batch }),
        "{events:?}"
    );
    let timed_out = events
        .iter()
        .filter(|e| matches!(e, CampaignEvent::Answered(a) if !a.class.is_clear()))
        .count();
    assert_eq!(timed_out, 2);
    // A late reply is ignored: no renewal is believed from it.
    run.campaign.handle_outcome(
        deadline,
        batch,
        reply(json!({"results": [lease("a", 50), lease("b", 51)]})),
    );
    assert_eq!(
        run.campaign.tenure("a", deadline).map(|t| t.fence),
        Some(10)
    );
}

#[test]
fn the_campaign_asks_the_service_once_and_batches_only_where_the_answer_lists_renew_many() {
    let older = br#"{"name":"dagnats-api","endpoints":[{"name":"renew"}]}"#;
    let table: [(&str, RequestOutcome, bool); 5] = [
        (
            "a reply listing it",
            RequestOutcome::reply(INFO.to_vec()),
            true,
        ),
        (
            "an older service's reply",
            RequestOutcome::reply(older.to_vec()),
            false,
        ),
        ("no responders", RequestOutcome::NoResponders, false),
        ("timed out", RequestOutcome::TimedOut, false),
        ("failed", RequestOutcome::Failed("closed".into()), false),
    ];
    for (name, outcome, batches) in table {
        let mut campaign = Campaign::new("h1", Instant::now()).unwrap();
        let ask = campaign.poll_service_info().expect("asked at the start");
        assert_eq!(ask.subject, "$SRV.INFO.dagnats-api", "{name}");
        assert!(campaign.poll_service_info().is_none(), "{name}: asked once");
        assert!(!campaign.batches_renewals(), "{name}: alone until answered");
        campaign.handle_service_info_outcome(&outcome);
        assert_eq!(campaign.batches_renewals(), batches, "{name}");
        // A second outcome changes nothing.
        campaign.handle_service_info_outcome(&RequestOutcome::reply(INFO.to_vec()));
        assert_eq!(campaign.batches_renewals(), batches, "{name}: read once");
    }
}

#[test]
fn owners_are_pulled_in_early_only_while_one_request_has_room_so_a_group_stays_one_request() {
    use crate::holder::campaign::GROUP_BOUND;
    let mut run = Run::new(true);
    // More owners than one group, elected 5 ms apart: all due within the early
    // window of the first.
    let keys: Vec<String> = (0..GROUP_BOUND + 20).map(|i| format!("k{i:03}")).collect();
    for (i, key) in keys.iter().enumerate() {
        run.elect(i as u64 * 5, &[key.as_str()]);
    }
    let (_, out) = run.tick();
    let renewed: Vec<String> = out.iter().flat_map(Run::keys).collect();
    assert_eq!(out.len(), 1, "one request: {} renewals", renewed.len());
    assert!(Run::is_batch(&out[0]));
    assert_eq!(
        renewed,
        keys[..GROUP_BOUND],
        "the first due and the nearest after it, up to the bound"
    );
    // The others were not pulled in: they renew on their own schedule, later.
    for key in &keys[GROUP_BOUND..] {
        assert_eq!(run.campaign.status(key), Some(HolderStatus::Owner), "{key}");
    }
}

/// Renewals sent by one group of `n` keys won in one burst, from 10 s to 130 s
/// after, each request answered 5 to 85 ms after it went out (a fixed sequence);
/// and the renewals ttl/3 asks for in that time.
fn renewals_of_a_group_over_two_minutes(batching: bool, n: usize) -> (u64, u64) {
    let mut run = Run::new(batching);
    let keys: Vec<String> = (0..n).map(|i| format!("k{i:04}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    run.elect(0, &keys);
    let (start, end) = (run.at(10_000), run.at(130_000));
    let mut sent = 0;
    let mut revision = 100;
    let mut latency_seed = 7u64;
    let mut replies: Vec<(Instant, TransmitId, RequestOutcome)> = Vec::new();
    loop {
        let timer = run.campaign.poll_timeout().expect("renewals are due");
        replies.sort_by_key(|r| std::cmp::Reverse(r.0));
        let now = match replies.last() {
            Some((at, ..)) if *at <= timer => {
                let (at, id, outcome) = replies.pop().expect("one");
                run.campaign.handle_outcome(at, id, outcome);
                at
            }
            _ => {
                run.campaign.handle_timeout(timer);
                timer
            }
        };
        if now > end {
            break;
        }
        for t in run.requests() {
            let keys = Run::keys(&t);
            if now >= start {
                sent += keys.len() as u64;
            }
            let mut renewed = |key: &str| {
                revision += 1;
                lease(key, revision)
            };
            let body = if Run::is_batch(&t) {
                let results: Vec<Value> = keys.iter().map(|k| renewed(k)).collect();
                json!({ "results": results })
            } else {
                renewed(&keys[0])
            };
            latency_seed = latency_seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let latency = Duration::from_millis(5 + (latency_seed >> 33) % 80);
            replies.push((now + latency, t.transmit.id, reply(body)));
        }
        run.events();
    }
    let asked = n as u64 * 120 * 3 / TTL.as_secs();
    (sent, asked)
}

#[test]
fn a_group_won_in_one_burst_renews_as_often_as_its_schedule_asks_not_more() {
    // The spread of a group's renewals and the early pull of a batch each renew a
    // key sooner than its schedule; neither may shorten its interval for good.
    for batching in [true, false] {
        let (sent, asked) = renewals_of_a_group_over_two_minutes(batching, 300);
        assert!(
            sent >= asked && sent * 100 <= asked * 101,
            "batching {batching}: {sent} renewals where ttl/3 asks {asked}"
        );
    }
}
