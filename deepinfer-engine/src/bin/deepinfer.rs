//! The `deepinfer` binary: parses the command line and dispatches to `deepinfer_engine::cli`.

use clap::Parser;

fn main() {
    let cli = deepinfer_engine::cli::Cli::parse();
    if let Err(e) = deepinfer_engine::cli::run(cli) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
