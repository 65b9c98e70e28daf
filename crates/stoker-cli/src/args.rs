//! The command line: subcommands and flags, declared with clap's derive API so that `--help`,
//! `--version`, typo detection and error messages follow the conventions users know.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

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
    Doctor(crate::doctor::DoctorArgs),
    /// Packs a source into stoker's packed format (`source=packed:OUT`): images kept or shrunk
    /// to --max-side and stored as JPEG or raw pixels, in page-aligned files with a per-sample
    /// metadata table. `stoker pack --merge OUT` writes the index of slices packed separately
    /// (--shard-index I --num-shards N on many machines).
    Pack(PackArgs),
    /// Token streams for language models (megatron:PREFIX, tokens:PATTERN, blend=).
    #[command(subcommand)]
    Tokens(TokensCommand),
}

#[derive(Debug, Subcommand)]
pub(crate) enum TokensCommand {
    /// Writes an epoch's global order of samples as an int64 .npy array: position k of the
    /// epoch's global batches holds sample order[k], whatever the world size (the tail shorter
    /// than a global batch is left out).
    Order(TokensOrderArgs),
}

#[derive(Debug, Args)]
pub(crate) struct TokensOrderArgs {
    /// The source, as the `source` option spells it (megatron:PREFIX, tokens:PATTERN); leave
    /// it out with --set blend=…
    #[arg(value_name = "SOURCE")]
    pub(crate) source: Option<String>,
    /// Where to write the order (int64, 1-D).
    #[arg(long, value_name = "FILE.npy")]
    pub(crate) out: PathBuf,
    /// A loader option as KEY=VALUE (repeat for more): seq_len is required; shuffle, seed,
    /// global_batch_size, blend, token_dtype… as the training job sets them.
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = crate::doctor::key_value)]
    pub(crate) set: Vec<(String, String)>,
    /// The epoch whose order to write.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub(crate) epoch: u64,
}

#[derive(Debug, Subcommand)]
pub(crate) enum BenchCommand {
    /// Shuffled uint8 `[N,3,224,224]` batches from an npy file beside single-thread memcpy
    /// bandwidth, measured in the same run.
    Npy(NpyArgs),
    /// The demo's pipeline beside decode-only throughput on the same files, measured in the
    /// same run.
    Images(ImagesArgs),
    /// The pipeline on the same photographs as a folder of JPEGs and packed three ways
    /// (original JPEGs, shrunk to --max-side, shrunk and raw), with each pack's speed.
    Packed(PackedBenchArgs),
    /// The JPEG decoders side by side on the same files from memory, one thread and all:
    /// zune-jpeg and libjpeg-turbo whole, libjpeg-turbo on a crop's region (with and without
    /// DCT scaling), and Pillow.
    Decoders(DecodersBenchArgs),
    /// Checks `stoker doctor`'s prediction: on small JPEGs, large JPEGs and an npy file, the
    /// samples/s the doctor predicts for the settings it advises (or those given, without
    /// advice) beside a loader run with exactly those settings; target: within 15%.
    Doctor(DoctorBenchArgs),
    /// autotune=true, starting from one worker, beside every fixed setting (num_workers 1 to
    /// the usable cores, each --prefetch): when it reaches 90% of the best fixed setting, its
    /// steady samples/s and the decisions it made.
    Autotune(AutotuneBenchArgs),
    /// Throughput by worker count (1, 2, 4, ... every core) on an npy file of float32 150 KB
    /// samples, packed raw pixels and JPEGs: samples/s, GB/s, scaling efficiency, page faults
    /// per batch, worker busy; with a CUDA device also device=cuda and the pinned copy bandwidth.
    Scaling(ScalingBenchArgs),
}

#[derive(Debug, Args)]
pub(crate) struct ScalingBenchArgs {
    /// A folder of class subfolders of JPEGs (default: an ImageNet-like folder of real
    /// photographs in the cache directory).
    #[arg(value_name = "ROOT")]
    pub(crate) root: Option<PathBuf>,
    /// Samples in the generated npy file (150 KB each).
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub(crate) samples: usize,
    /// Samples per batch.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub(crate) batch_size: usize,
    /// Measured epochs per row (one more runs first, to warm up).
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub(crate) epochs: usize,
    /// The most workers measured (default: every usable core).
    #[arg(long, value_name = "N")]
    pub(crate) max_workers: Option<usize>,
    /// Images per class when building the default folder.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub(crate) per_class: usize,
}

#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// A folder of class subfolders of JPEGs (default: an ImageNet-like folder built from real
    /// photographs in the cache directory).
    #[arg(long, value_name = "ROOT")]
    pub(crate) images: Option<PathBuf>,
    /// Epochs to run.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub(crate) epochs: usize,
    /// Samples per batch.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub(crate) batch_size: usize,
    #[command(flatten)]
    pub(crate) workers: Workers,
    /// Images per class when building the default folder.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub(crate) per_class: usize,
    /// The simulated training step: how long each batch is held, in milliseconds.
    #[arg(long, value_name = "N", default_value_t = 30)]
    pub(crate) step_ms: u64,
}

#[derive(Debug, Args)]
pub(crate) struct NpyArgs {
    /// Samples in the generated npy file.
    #[arg(long, value_name = "N", default_value_t = 2048)]
    pub(crate) samples: usize,
    /// Samples per batch.
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub(crate) batch_size: usize,
    /// Epochs to run (at least 2: the first one warms up and is not measured).
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub(crate) epochs: usize,
    #[command(flatten)]
    pub(crate) workers: Workers,
    /// An existing npy file to read instead of the generated one.
    #[arg(long, value_name = "FILE")]
    pub(crate) path: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct ImagesArgs {
    /// A folder of class subfolders of JPEGs (default: the demo's ImageNet-like folder).
    #[arg(value_name = "ROOT")]
    pub(crate) root: Option<PathBuf>,
    /// Measured epochs (one more runs first, to warm up).
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub(crate) epochs: usize,
    /// Samples per batch.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub(crate) batch_size: usize,
    #[command(flatten)]
    pub(crate) workers: Workers,
    /// Images per class when building the default folder.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub(crate) per_class: usize,
}

#[derive(Debug, Args)]
pub(crate) struct PackArgs {
    /// SRC OUT: any source spec (`image_folder:ROOT`, `tar:PATTERN`, `npy:PATH`,
    /// `packed:PATH`) and the output (a file; a directory with --shard-size or --num-shards).
    /// With --merge, only OUT.
    #[arg(value_name = "SRC OUT", num_args = 1..=2, required = true)]
    pub(crate) paths: Vec<String>,
    /// Write the dataset index of the slices packed into OUT (every slice must be there).
    #[arg(long)]
    pub(crate) merge: bool,
    /// Shrink images whose longer side exceeds N pixels to N (aspect kept).
    #[arg(long, value_name = "N")]
    pub(crate) max_side: Option<u32>,
    /// JPEG quality of re-encoded images (1-100); they are stored with 4:2:0 chroma.
    #[arg(long, value_name = "Q", default_value_t = 90)]
    pub(crate) quality: u8,
    /// How images are stored: jpeg (kept, or re-encoded when shrunk), raw (RGB8 pixels, no
    /// decoding when read) or smart (raw for images of at most 256x256 pixels, else jpeg).
    #[arg(long, value_name = "MODE", default_value = "jpeg", value_parser = ["jpeg", "raw", "smart"])]
    pub(crate) mode: String,
    /// Start a new shard file past this much data (`512MiB`, `2GB`); OUT is then a directory.
    #[arg(long, value_name = "BYTES")]
    pub(crate) shard_size: Option<String>,
    /// Pack only slice I of --num-shards (0-based): contiguous slices, one per machine or job.
    #[arg(long, value_name = "I", requires = "num_shards")]
    pub(crate) shard_index: Option<usize>,
    /// The number of slices the source is split into (see --shard-index).
    #[arg(long, value_name = "N", requires = "shard_index")]
    pub(crate) num_shards: Option<usize>,
}

#[derive(Debug, Args)]
pub(crate) struct PackedBenchArgs {
    /// A folder of class subfolders of JPEGs (default: an ImageNet-like folder of real
    /// photographs in the cache directory).
    #[arg(value_name = "ROOT")]
    pub(crate) root: Option<PathBuf>,
    /// Measured epochs per round (one more runs first, to warm up).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub(crate) epochs: usize,
    /// Rounds over the four sources; each keeps its best.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub(crate) rounds: usize,
    /// Samples per batch.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub(crate) batch_size: usize,
    /// The longer side of the shrunk packs.
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub(crate) max_side: u32,
    #[command(flatten)]
    pub(crate) workers: Workers,
    /// Images per class when building the default folder (250: 3,000 images).
    #[arg(long, value_name = "N", default_value_t = 250)]
    pub(crate) per_class: usize,
}

#[derive(Debug, Args)]
pub(crate) struct DecodersBenchArgs {
    /// A folder of class subfolders of JPEGs (default: the demo's ImageNet-like folder).
    #[arg(value_name = "ROOT")]
    pub(crate) root: Option<PathBuf>,
    /// Rounds over the decoders, interleaved; each keeps its best.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub(crate) rounds: usize,
    /// Images per class when building the default folder.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub(crate) per_class: usize,
    /// Print the figures as one JSON object (images per second per decoder and thread count)
    /// instead of the table.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct DoctorBenchArgs {
    /// A shorter run: smaller folders, fewer samples, one round.
    #[arg(long)]
    pub(crate) quick: bool,
    /// The data shapes to check, comma-separated: small (160x120 JPEGs), large (1600x1200
    /// JPEGs), npy (uint8 [N,3,224,224]).
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_value = "small,large,npy",
          value_parser = ["small", "large", "npy"])]
    pub(crate) shapes: Vec<String>,
    /// Rounds over the shapes (each: the doctor, then the check); the round with the fastest
    /// check is shown [default: 2, --quick 1].
    #[arg(long, value_name = "N")]
    pub(crate) rounds: Option<usize>,
    /// Images in each JPEG folder [default: 1200 small, 240 large; --quick 480, 96].
    #[arg(long, value_name = "N")]
    pub(crate) images: Option<usize>,
    /// Samples in the npy file [default: 2048, --quick 1024].
    #[arg(long, value_name = "N")]
    pub(crate) npy_samples: Option<usize>,
    /// Seconds each measurement runs — each of the doctor's, and the check after filling the
    /// pipeline (at least 8 batches) [default: 2, --quick 1].
    #[arg(long, value_name = "S")]
    pub(crate) seconds: Option<f64>,
    /// Samples per JPEG batch; npy batches are four times larger.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub(crate) batch_size: usize,
    /// Workers the doctor is given: with fewer than the cores it advises more, and that
    /// prediction is checked too.
    #[arg(long = "workers", value_name = "N|auto", default_value = "1", value_parser = workers)]
    pub(crate) workers: String,
    /// The training step to simulate, in milliseconds per batch.
    #[arg(long, value_name = "MS", default_value_t = 0.0)]
    pub(crate) step_ms: f64,
    #[command(flatten)]
    pub(crate) data: BenchData,
    /// Print the results as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct AutotuneBenchArgs {
    /// A folder of class subfolders of JPEGs (default: an ImageNet-like folder of 500x375
    /// photographs in the data directory).
    #[arg(value_name = "ROOT")]
    pub(crate) root: Option<PathBuf>,
    /// A shorter run: a smaller folder, fewer batches, one round.
    #[arg(long)]
    pub(crate) quick: bool,
    /// Also an npy file of uint8 [N,3,224,224] in batches four times larger.
    #[arg(long)]
    pub(crate) npy: bool,
    /// Rounds, each measuring every fixed setting and then autotune; each keeps its best
    /// [default: 3, --quick 1].
    #[arg(long, value_name = "N")]
    pub(crate) rounds: Option<usize>,
    /// Images in the default folder [default: 1200, --quick 480].
    #[arg(long, value_name = "N")]
    pub(crate) images: Option<usize>,
    /// Samples in the npy file [default: 2048, --quick 1024].
    #[arg(long, value_name = "N")]
    pub(crate) npy_samples: Option<usize>,
    /// Batches autotune runs for, from the loader's start; npy runs four times as many
    /// [default: 300, --quick 120].
    #[arg(long, value_name = "N")]
    pub(crate) batches: Option<usize>,
    /// Batches each fixed setting is measured for, after filling its pipeline; npy four times
    /// as many [default: 40, --quick 16].
    #[arg(long, value_name = "N")]
    pub(crate) fixed_batches: Option<usize>,
    /// The prefetch_factor values of the fixed settings, comma-separated.
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "2,4"
    )]
    pub(crate) prefetch: Vec<usize>,
    /// Samples per image batch; npy batches are four times larger.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub(crate) batch_size: usize,
    /// The training step to simulate, in milliseconds per batch.
    #[arg(long, value_name = "MS", default_value_t = 0.0)]
    pub(crate) step_ms: f64,
    #[command(flatten)]
    pub(crate) data: BenchData,
    /// Print the results as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Where the generated benchmark data goes, and whether its images are photographs.
#[derive(Debug, Args)]
pub(crate) struct BenchData {
    /// Drawn images instead of crops of photographs (used anyway when the photographs cannot
    /// be had).
    #[arg(long)]
    pub(crate) synthetic: bool,
    /// Where the data is built, once (default: $XDG_CACHE_HOME/stoker or ~/.cache/stoker).
    #[arg(long, value_name = "DIR")]
    pub(crate) data_dir: Option<PathBuf>,
}

/// `--workers`, shared by every command that builds a loader.
#[derive(Debug, Args)]
pub(crate) struct Workers {
    /// Worker threads: a number, or `auto` for the cores this process may run on.
    #[arg(long = "workers", value_name = "N|auto", default_value = "auto", value_parser = workers)]
    pub(crate) value: String,
}

/// Accepts what the loader's `num_workers` option accepts, so that a typo fails before any
/// dataset is built, with clap's message naming the flag.
fn workers(value: &str) -> Result<String, String> {
    if value == "auto" || value.parse::<usize>().is_ok() {
        Ok(value.to_owned())
    } else {
        Err(format!("`{value}` is neither a number nor `auto`"))
    }
}

#[cfg(test)]
mod tests {
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
