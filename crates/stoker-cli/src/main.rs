//! The `stoker` command: a demo of the loader, side-by-side benchmarks, `doctor`, `pack` and
//! `tokens order`.

mod args;
mod bench;
mod demo;
mod doctor;
mod pack;
mod photos;
mod report;
mod tokens;
mod workers;

use std::process::ExitCode;

use clap::Parser;

use args::{Cli, Command};

fn main() -> ExitCode {
    // clap prints --help/--version and usage errors itself, with exit codes 0 and 2.
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Bench(command) => bench::run(command),
        Command::Doctor(args) => doctor::run(args),
        Command::Pack(args) => pack::run(args),
        Command::Tokens(command) => tokens::run(command),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stoker: {e}");
            ExitCode::FAILURE
        }
    }
}
