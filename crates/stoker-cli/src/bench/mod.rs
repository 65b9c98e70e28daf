//! `stoker bench ...`: benchmarks that measure stoker beside the limit of the machine in the same
//! run, one file each.

mod autotune;
mod decoders;
mod doctor;
mod images;
mod npy;
mod packed;
mod parquet_table;
pub(crate) mod parquet_text;
mod scaling;
mod tokens;

use std::path::PathBuf;

use autotune::AutotuneBenchArgs;
use decoders::DecodersBenchArgs;
use doctor::DoctorBenchArgs;
use images::ImagesArgs;
use npy::NpyArgs;
use packed::PackedBenchArgs;
use scaling::ScalingBenchArgs;
use tokens::TokensBenchArgs;

/// The benchmarks, `stoker bench NAME`.
#[derive(Debug, clap::Subcommand)]
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
    /// Checks `stoker doctor`'s prediction: on small JPEGs, large JPEGs and an npy file (and a
    /// Parquet table when asked for), the samples/s the doctor predicts for the settings it
    /// advises (or those given, without advice) beside a loader run with exactly those settings;
    /// target: within 15%.
    Doctor(DoctorBenchArgs),
    /// autotune=true, starting from one worker, beside every fixed setting (num_workers 1 to
    /// the usable cores, each --prefetch): when it reaches 90% of the best fixed setting, its
    /// steady samples/s and the decisions it made.
    Autotune(AutotuneBenchArgs),
    /// Throughput by worker count (1, 2, 4, ... every core) on an npy file of float32 150 KB
    /// samples, packed raw pixels and JPEGs: samples/s, GB/s, scaling efficiency, page faults
    /// per batch, worker busy; with a CUDA device also device=cuda and the pinned copy bandwidth.
    Scaling(ScalingBenchArgs),
    /// A token source's startup on many Megatron datasets (files evicted from the page cache,
    /// then cached) and the heap it keeps per document; tokens/s and tokens per CPU-second into
    /// pinned batches beside nanoGPT's get_batch on the same files, natively on one thread.
    Tokens(TokensBenchArgs),
}

/// Where the generated benchmark data goes, and whether its images are photographs.
#[derive(Debug, clap::Args)]
pub(crate) struct BenchData {
    /// Drawn images instead of crops of photographs (used anyway when the photographs cannot
    /// be had).
    #[arg(long)]
    pub(crate) synthetic: bool,
    /// Where the data is built, once (default: $XDG_CACHE_HOME/stoker or ~/.cache/stoker).
    #[arg(long, value_name = "DIR")]
    pub(crate) data_dir: Option<PathBuf>,
}

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
        BenchCommand::Tokens(args) => tokens::run(args),
    }
}
