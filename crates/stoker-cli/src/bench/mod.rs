//! `stoker bench ...`: benchmarks that measure stoker beside the limit of the machine in the same
//! run, one file each.

mod autotune;
mod decoders;
mod doctor;
mod images;
mod npy;
mod packed;
mod scaling;

use crate::args::BenchCommand;

/// Runs the benchmark `command` names.
pub(crate) fn run(command: &BenchCommand) -> Result<(), String> {
    match command {
        BenchCommand::Npy(args) => npy::run(args),
        BenchCommand::Images(args) => images::run(args),
        BenchCommand::Packed(args) => packed::run(args),
        BenchCommand::Decoders(args) => decoders::run(args),
        BenchCommand::Doctor(args) => doctor::run(args),
        BenchCommand::Autotune(args) => autotune::run(args),
        BenchCommand::Scaling(args) => scaling::run(args),
    }
}
