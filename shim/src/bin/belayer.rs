//! `belayer`: the Belayer command line. See `belayer --help`.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = belayer_shim::cli::Cli::parse();
    match belayer_shim::cli::run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("belayer: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
