//! The command line: the subcommands, and the flags several of them share, declared with clap's
//! derive API so that `--help`, `--version`, typo detection and error messages follow the
//! conventions users know. Each command's own flags are declared beside its code.

use clap::{Parser, Subcommand};

use crate::bench::BenchCommand;
use crate::demo::DemoArgs;
use crate::doctor::DoctorArgs;
use crate::pack::PackArgs;
use crate::tokens::TokensCommand;

#[derive(Debug, Parser)]
#[command(
    name = "stoker",
    version,
    about = "stoker keeps accelerators fed: a demo of the data loader and side-by-side benchmarks",
    // A flag given twice keeps its last value (as scripts that append overrides expect).
    args_override_self = true,
    propagate_version = true
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// The ImageNet training pipeline on a folder of photographs, with wait statistics.
    ///
    /// random_resized_crop(224) | hflip | normalize on a folder of class subfolders of JPEGs:
    /// epochs with a progress bar, each batch held for a simulated training step, then
    /// throughput and wait statistics. Without --images it builds an ImageNet-like folder from
    /// real photographs.
    Demo(DemoArgs),
    /// Benchmarks that measure stoker beside the machine's limit in the same run.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Where the time goes: each stage measured alone and the whole pipeline, the bottleneck
    /// named, and the settings that fix it with the predicted throughput.
    Doctor(DoctorArgs),
    /// Packs a source into stoker's packed format (`source=packed:OUT`): images kept or shrunk
    /// to --max-side and stored as JPEG or raw pixels, in page-aligned files with a per-sample
    /// metadata table. `stoker pack --merge OUT` writes the index of slices packed separately
    /// (--shard-index I --num-shards N on many machines).
    Pack(PackArgs),
    /// Token streams for language models (megatron:PREFIX, tokens:PATTERN, blend=).
    #[command(subcommand)]
    Tokens(TokensCommand),
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn flags_parse_into_the_subcommand_fields() {
        let cli = Cli::try_parse_from([
            "stoker",
            "bench",
            "npy",
            "--samples",
            "64",
            "--batch-size=16",
            "--workers",
            "3",
        ])
        .unwrap();
        let Command::Bench(BenchCommand::Npy(args)) = cli.command else {
            panic!("parsed {:?}", cli.command);
        };
        assert_eq!((args.samples, args.batch_size, args.epochs), (64, 16, 10));
        assert_eq!(args.workers.value, "3");
        assert!(args.path.is_none());
    }

    #[test]
    fn images_takes_an_optional_root_before_or_after_flags() {
        for argv in [
            &["stoker", "bench", "images", "/data", "--epochs", "1"][..],
            &["stoker", "bench", "images", "--epochs", "1", "/data"][..],
        ] {
            let cli = Cli::try_parse_from(argv).unwrap();
            let Command::Bench(BenchCommand::Images(args)) = cli.command else {
                panic!("parsed {:?}", cli.command);
            };
            assert_eq!(args.root, Some(PathBuf::from("/data")));
            assert_eq!(args.epochs, 1);
        }
    }

    #[test]
    fn a_repeated_flag_keeps_its_last_value() {
        let cli =
            Cli::try_parse_from(["stoker", "demo", "--epochs", "5", "--epochs", "1"]).unwrap();
        let Command::Demo(args) = cli.command else {
            panic!("parsed {:?}", cli.command);
        };
        assert_eq!(args.epochs, 1);
        assert_eq!(args.workers.value, "auto");
    }

    #[test]
    fn bad_values_and_unknown_flags_are_errors_naming_the_flag() {
        let err = Cli::try_parse_from(["stoker", "demo", "--epochs", "two"]).unwrap_err();
        assert!(err.to_string().contains("--epochs"), "{err}");
        let err = Cli::try_parse_from(["stoker", "demo", "--workers", "many"]).unwrap_err();
        assert!(
            err.to_string().contains("neither a number nor `auto`"),
            "{err}"
        );
        let err = Cli::try_parse_from(["stoker", "bench", "npy", "--sample", "3"]).unwrap_err();
        assert!(err.to_string().contains("--sample"), "{err}");
        assert!(Cli::try_parse_from(["stoker", "bench"]).is_err());
        assert!(Cli::try_parse_from(["stoker"]).is_err());
    }

    #[test]
    fn bench_doctor_and_autotune_take_lists_and_defaults() {
        let cli = Cli::try_parse_from([
            "stoker",
            "bench",
            "doctor",
            "--shapes",
            "small,npy",
            "--quick",
        ])
        .unwrap();
        let Command::Bench(BenchCommand::Doctor(args)) = cli.command else {
            panic!("parsed {:?}", cli.command);
        };
        assert_eq!(args.shapes, ["small", "npy"]);
        assert!(args.quick && !args.json && !args.data.synthetic);
        assert_eq!((args.workers.as_str(), args.batch_size), ("1", 64));
        assert!(
            Cli::try_parse_from(["stoker", "bench", "doctor", "--shapes", "huge"]).is_err(),
            "an unknown shape"
        );
        let cli = Cli::try_parse_from([
            "stoker",
            "bench",
            "autotune",
            "--prefetch",
            "2,8",
            "--step-ms=5",
            "--synthetic",
        ])
        .unwrap();
        let Command::Bench(BenchCommand::Autotune(args)) = cli.command else {
            panic!("parsed {:?}", cli.command);
        };
        assert_eq!(args.prefetch, [2, 8]);
        assert_eq!(args.step_ms, 5.0);
        assert!(args.data.synthetic && args.root.is_none() && !args.npy);
    }
}
