//! `belayer`: the Belayer command line. See `belayer --help`.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = belayer_shim::cli::Cli::parse();
    match belayer_shim::cli::run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line: errors carry CRIU's log lines and sources, joined.
            eprintln!("belayer: {}", e.trim().replace('\n', "; "));
            std::process::ExitCode::FAILURE
        }
    }
}
