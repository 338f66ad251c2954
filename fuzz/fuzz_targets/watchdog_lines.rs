//! The lines `lock` and its watchdog exchange never panic the reader, and every line
//! accepted reads back the same after writing it again.
#![no_main]

use std::time::{Duration, Instant};

use dagnats_leases_core::holder::supervise::{WatchdogMessage, WatchdogReport};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(line) = std::str::from_utf8(data) else { return };
    let base = Instant::now();
    let to_clock = |at: Instant| at.duration_since(base);
    let from_clock = |d: Duration| base.checked_add(d);
    if let Some(message) = WatchdogMessage::parse(line, from_clock) {
        let again = message.to_line(to_clock);
        assert_eq!(WatchdogMessage::parse(&again, from_clock), Some(message), "{line:?}");
    }
    if let Some(report) = WatchdogReport::parse(line) {
        assert_eq!(WatchdogReport::parse(&report.to_line()), Some(report), "{line:?}");
    }
});
