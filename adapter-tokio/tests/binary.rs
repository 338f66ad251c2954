//! The `dagnats-leases` binary: it serves, and stops cleanly.

#[path = "support/serve_binary.rs"]
mod serve_binary;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_answers_and_exits_zero_on_sigterm() {
    serve_binary::serves_and_exits_zero_on_sigterm(env!("CARGO_BIN_EXE_dagnats-leases")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_stops_in_bound_with_its_server_killed() {
    serve_binary::stops_in_bound_with_its_server_killed(env!("CARGO_BIN_EXE_dagnats-leases")).await;
}

#[test]
fn serve_without_a_server_fails_with_a_clear_exit_code() {
    serve_binary::fails_with_exit_2_without_a_server(env!("CARGO_BIN_EXE_dagnats-leases"));
}
