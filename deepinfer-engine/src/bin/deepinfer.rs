//! The `deepinfer` binary: parses the command line and dispatches to `deepinfer_engine::cli`.

use clap::Parser;

/// mimalloc (feature `mimalloc`, on by default): see the feature's note in Cargo.toml.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let cli = deepinfer_engine::cli::Cli::parse();
    if let Err(e) = deepinfer_engine::cli::run(cli) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
