//! `llmr-engine-worker`: the worker process on its own, for tests and benchmarks that run a
//! node in process (the `llmr` binary runs the same code as `llmr engine-worker`).

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LLMR_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    std::process::exit(llmr_engine_worker::serve_stdin());
}
