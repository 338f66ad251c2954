//! The `dagnats-leases-smol` binary: it serves, and stops cleanly.

#[path = "../../adapter-tokio/tests/support/serve_binary.rs"]
mod serve_binary;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_answers_and_exits_zero_on_sigterm() {
    serve_binary::serves_and_exits_zero_on_sigterm(env!("CARGO_BIN_EXE_dagnats-leases-smol")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_stops_in_bound_with_its_server_killed() {
    serve_binary::stops_in_bound_with_its_server_killed(env!("CARGO_BIN_EXE_dagnats-leases-smol"))
        .await;
}

#[test]
fn serve_without_a_server_fails_with_a_clear_exit_code() {
    serve_binary::fails_with_exit_2_without_a_server(env!("CARGO_BIN_EXE_dagnats-leases-smol"));
}

#[path = "../../adapter-tokio/tests/support/scrape.rs"]
mod scrape;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_metrics_addr_counts_calls() {
    scrape::counts_calls(env!("CARGO_BIN_EXE_dagnats-leases-smol")).await;
}
