//! The `stoker` command: a demo of the loader, side-by-side benchmarks, `doctor`, `pack` and
//! `tokens order`.

mod args;
mod bench;
mod bench_autotune;
mod bench_decoders;
mod bench_doctor;
mod bench_packed;
mod bench_scaling;
mod demo;
mod doctor;
mod pack;
mod photos;
mod report;
mod tokens;

use std::process::ExitCode;

use clap::Parser;

use args::{BenchCommand, Cli, Command, TokensCommand};

fn main() -> ExitCode {
    // clap prints --help/--version and usage errors itself, with exit codes 0 and 2.
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Bench(BenchCommand::Npy(args)) => bench::npy(args),
        Command::Bench(BenchCommand::Images(args)) => bench::images(args),
        Command::Bench(BenchCommand::Packed(args)) => bench_packed::run(args),
        Command::Bench(BenchCommand::Decoders(args)) => bench_decoders::run(args),
        Command::Bench(BenchCommand::Doctor(args)) => bench_doctor::run(args),
        Command::Bench(BenchCommand::Autotune(args)) => bench_autotune::run(args),
        Command::Bench(BenchCommand::Scaling(args)) => bench_scaling::run(args),
        Command::Doctor(args) => doctor::run(args),
        Command::Pack(args) => pack::run(args),
        Command::Tokens(TokensCommand::Order(args)) => tokens::run_order(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stoker: {e}");
            ExitCode::FAILURE
        }
    }
}
