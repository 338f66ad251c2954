//! The probe's semantic checks (step 1): per-message TTL, RePublish, a failed
//! expected-sequence check and the batch size limit inside atomic batches, each
//! printed as a finding.

use dagnats_leases_core::subjects::{CHANGED_SUBJECTS, changed_subject};

use super::*;

/// Collects republished change events on `dagnats.lease.changed.<prefix>*` through
/// `client`.
async fn watch(client: &Client, prefix: &str) -> async_nats::Subscriber {
    let sub = client.subscribe(CHANGED_SUBJECTS).await.expect("subscribe");
    client.flush().await.expect("flush");
    let _ = prefix;
    sub
}

/// Change events for keys starting with `prefix` that arrive within `wait`
/// (stops early once `want` have arrived and 300 ms more passed quietly).
async fn drain(
    sub: &mut async_nats::Subscriber,
    prefix: &str,
    want: usize,
    wait: Duration,
) -> Vec<(async_nats::Message, Instant)> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let limit = if got.len() >= want {
            (tokio::time::Instant::now() + Duration::from_millis(300)).min(deadline)
        } else {
            deadline
        };
        match tokio::time::timeout_at(limit, sub.next()).await {
            Ok(Some(m)) => {
                if m.subject.starts_with(&changed_subject(prefix)) {
                    got.push((m, Instant::now()));
                }
            }
            _ => break,
        }
    }
    got
}

fn header(m: &async_nats::Message, name: &str) -> Option<String> {
    m.headers
        .as_ref()?
        .get(name)
        .map(|v| v.as_str().to_string())
}

fn err_of(ack: &Value) -> String {
    match ack.get("error") {
        Some(e) => format!(
            "err_code {} (http {}): \"{}\"",
            e["err_code"],
            e["code"],
            e["description"].as_str().unwrap_or("?")
        ),
        None => format!("no error: {ack}"),
    }
}

pub(super) async fn checks(place: &Place) -> Vec<String> {
    let p = place.name;
    let mut out = Vec::new();
    let c = &place.client;

    // Q2: per-message TTL inside a batch.
    place.purge().await;
    let mut sub = watch(c, "ttl").await;
    let keys: Vec<String> = (0..3).map(|i| format!("ttl{p}-{i}")).collect();
    let msgs: Vec<BatchMsg> = keys
        .iter()
        .map(|k| (k.clone(), 0, "2s".to_string()))
        .collect();
    let t0 = Instant::now();
    let ack = atomic_batch(c, &format!("ttl{p}"), &msgs).await;
    let mut events = drain(&mut sub, "ttl", 6, Duration::from_secs(10)).await;
    events.retain(|(m, _)| header(m, "Nats-Marker-Reason").is_some());
    // Arrival of each marker event after the commit was sent (TTL 2 s).
    let marker_ms: Vec<u128> = events
        .iter()
        .map(|(_, at)| at.duration_since(t0).as_millis())
        .collect();
    let mut stored_markers = 0;
    for k in &keys {
        if let Some((_, h)) = place.last(k).await
            && h.contains("Nats-Marker-Reason: MaxAge")
        {
            stored_markers += 1;
        }
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut left = 0;
    for k in &keys {
        if place.last(k).await.is_some() {
            left += 1;
        }
    }
    let reasons: Vec<String> = events
        .iter()
        .filter_map(|(m, _)| header(m, "Nats-Marker-Reason"))
        .collect();
    out.push(format!(
        "{p} Q2 TTL in a batch: batch of 3 with Nats-TTL 2s committed ({}); {} marker events \
         republished, reasons {reasons:?}, arriving {}-{} ms after the commit was sent; markers stored for {}/3 \
         keys when read; {left}/3 keys still hold anything 2.5 s later (markers' own 1 s TTL)",
        if ack.get("error").is_none() {
            format!("count {}", ack["count"])
        } else {
            err_of(&ack)
        },
        events.len(),
        marker_ms.iter().min().copied().unwrap_or(0),
        marker_ms.iter().max().copied().unwrap_or(0),
        stored_markers,
    ));

    // Q3: RePublish of batched messages, on n1 and (R3) on n2 as well.
    place.purge().await;
    let n = 32;
    let mut subs = vec![watch(c, "rp").await];
    let other = if place.nodes().len() > 1 {
        Some(place.nodes()[1].connect(ACCOUNT).await)
    } else {
        None
    };
    if let Some(o) = &other {
        subs.push(watch(o, "rp").await);
    }
    let id = format!("rp{p}");
    // Messages 1..N-1 first, then a pause: nothing may be visible before the commit.
    for i in 0..n - 1 {
        let mut h = write_headers(0, WRITE_TTL);
        h.insert("Nats-Batch-Id", id.as_str());
        h.insert("Nats-Batch-Sequence", (i + 1).to_string());
        c.publish_with_headers(kv_subject(&format!("rp{p}-{i}")), h, payload())
            .await
            .expect("publish");
    }
    c.flush().await.expect("flush");
    let early = drain(&mut subs[0], "rp", usize::MAX, Duration::from_millis(500)).await;
    let stored_early = place.messages().await;
    let mut h = write_headers(0, WRITE_TTL);
    h.insert("Nats-Batch-Id", id.as_str());
    h.insert("Nats-Batch-Sequence", n.to_string());
    h.insert("Nats-Batch-Commit", "1");
    let ack = match c
        .request_with_headers(kv_subject(&format!("rp{p}-{}", n - 1)), h, payload())
        .await
    {
        Ok(m) => serde_json::from_slice::<Value>(&m.payload).unwrap_or(Value::Null),
        Err(e) => json!({ "error": { "description": e.to_string() } }),
    };
    for (si, sub) in subs.iter_mut().enumerate() {
        let got = drain(sub, "rp", n, Duration::from_secs(5)).await;
        let mut per_key = std::collections::BTreeMap::<String, usize>::new();
        let mut seqs: Vec<u64> = Vec::new();
        for (m, _) in &got {
            *per_key.entry(m.subject.to_string()).or_default() += 1;
            if let Some(s) = header(m, "Nats-Sequence").and_then(|s| s.parse().ok()) {
                seqs.push(s);
            }
        }
        seqs.sort_unstable();
        let contiguous = seqs.windows(2).all(|w| w[1] == w[0] + 1);
        let max_per_key = per_key.values().copied().max().unwrap_or(0);
        out.push(format!(
            "{p} Q3 RePublish (subscriber on n{}): batch of {n} (ack seq {}, count {}); before the \
             commit {} events and {stored_early} messages stored; after it {} events for {} \
             distinct keys, at most {max_per_key} per key, Nats-Sequence {}..{} contiguous: {contiguous}",
            si + 1,
            ack["seq"],
            ack["count"],
            if si == 0 {
                early.len().to_string()
            } else {
                "-".into()
            },
            got.len(),
            per_key.len(),
            seqs.first().copied().unwrap_or(0),
            seqs.last().copied().unwrap_or(0),
        ));
    }

    // Q4: a failed expected-last-subject-sequence check inside a batch.
    place.purge().await;
    let held = single_write(c, &format!("q4{p}-held"), 0, WRITE_TTL).await;
    let held_seq = held["seq"].as_u64().unwrap_or(0);
    let mut msgs: Vec<BatchMsg> = (0..8)
        .map(|i| (format!("q4{p}-{i}"), 0, WRITE_TTL.to_string()))
        .collect();
    msgs[4] = (format!("q4{p}-held"), held_seq + 7, WRITE_TTL.to_string());
    let ack = atomic_batch(c, &format!("q4{p}"), &msgs).await;
    let mut stored = 0;
    for (k, _, _) in &msgs {
        if !k.ends_with("-held") && place.last(k).await.is_some() {
            stored += 1;
        }
    }
    let held_now = place.last(&format!("q4{p}-held")).await.map(|(s, _)| s);
    out.push(format!(
        "{p} Q4 failed check: batch of 8, message 5 expects {} on a key at seq {held_seq}: {}; \
         of the 7 other keys {stored} stored; the held key's seq now {held_now:?}; stream holds {} message(s)",
        held_seq + 7,
        err_of(&ack),
        place.messages().await,
    ));
    // Two messages to one key, both with an expected sequence, in one batch.
    let msgs: Vec<BatchMsg> = vec![
        (format!("q4{p}-dup"), 0, WRITE_TTL.to_string()),
        (format!("q4{p}-dup"), 0, WRITE_TTL.to_string()),
    ];
    let ack = atomic_batch(c, &format!("q4d{p}"), &msgs).await;
    out.push(format!(
        "{p} Q4 same key twice in one batch, both with an expected sequence: {}; key stored: {}",
        err_of(&ack),
        place.last(&format!("q4{p}-dup")).await.is_some(),
    ));

    // Q5: the batch size limit.
    for n in [1000usize, 1001] {
        place.purge().await;
        let msgs: Vec<BatchMsg> = (0..n)
            .map(|i| (format!("q5{p}{n}-{i}"), 0, WRITE_TTL.to_string()))
            .collect();
        let t = Instant::now();
        let ack = atomic_batch(c, &format!("q5{p}{n}"), &msgs).await;
        let ms = t.elapsed().as_millis();
        out.push(format!(
            "{p} Q5 batch of {n}: {} in {ms} ms; stream holds {} messages",
            if ack.get("error").is_none() {
                format!("accepted, count {}, last seq {}", ack["count"], ack["seq"])
            } else {
                err_of(&ack)
            },
            place.messages().await,
        ));
    }
    // The inflight limit: 51 open (uncommitted) batches on one stream.
    place.purge().await;
    let mut last_ack = Value::Null;
    let mut opened = 0;
    for b in 0..51 {
        let mut h = write_headers(0, WRITE_TTL);
        h.insert("Nats-Batch-Id", format!("open{p}{b}"));
        h.insert("Nats-Batch-Sequence", "1");
        // As a request: the server answers an open batch's message with an empty ack.
        match c
            .request_with_headers(kv_subject(&format!("open{p}-{b}")), h, payload())
            .await
        {
            Ok(m) if m.payload.is_empty() => opened += 1,
            Ok(m) => {
                last_ack = serde_json::from_slice(&m.payload).unwrap_or(Value::Null);
                break;
            }
            Err(e) => {
                last_ack = json!({ "error": { "description": e.to_string() } });
                break;
            }
        }
    }
    out.push(format!(
        "{p} Q5 open batches: {opened} opened (each first message answered with an empty ack), \
         the next: {}",
        err_of(&last_ack)
    ));
    // Let the open batches time out (10 s) later; purge now.
    place.purge().await;
    out
}
