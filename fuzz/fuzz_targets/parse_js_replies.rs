//! Whatever JetStream (or anything on its subjects) answers, reading it never panics.
#![no_main]

use dagnats_leases_core::js::{self};

use dagnats_leases_core::io::{RequestOutcome};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let outcome = RequestOutcome::reply(data.to_vec());
    let _ = js::parse_read(&outcome);
    let _ = js::parse_pub_ack(&outcome);
    let _ = js::parse_api_reply(&outcome);
    let _ = js::parse_header_block(data);
});
