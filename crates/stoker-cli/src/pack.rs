//! `stoker pack`: a source into stoker's packed format, with a progress bar (rate and ETA), and
//! `stoker pack --merge OUT` for slices packed separately; a token source (`parquet:`,
//! `tokens:`, `megatron:`) into one flat token file with its sidecar of document lengths.

use std::io::IsTerminal;
use std::path::Path;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use stoker_core::pack::{merge, open_source_with_fields, pack, parse_size, PackOptions};
use stoker_core::source::TokenSource;

/// `stoker pack`'s arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct PackArgs {
    /// SRC OUT: any source spec (`image_folder:ROOT`, `tar:PATTERN`, `npy:PATH`,
    /// `packed:PATH`) and the output (a file; a directory with --shard-size or --num-shards).
    /// With --merge, only OUT. A token source (`parquet:PATTERN` with `--set tokenizer=…`,
    /// `tokens:PATTERN`, `megatron:PREFIX`) is written to OUT.npy and OUT.lengths.npy, read back
    /// as `tokens:OUT.npy`.
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
    pub(crate) quality: u32,
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
    /// A tar source's fields, as the loader's `fields` option
    /// (`jpg:image,json#boxes:boxes,json#labels:labels`; default: image and label), or a parquet:
    /// table's columns, as the loader's `columns` option (`img:image,label`; default: every image
    /// and number column).
    #[arg(long, value_name = "EXT:NAME,...")]
    pub(crate) fields: Option<String>,
    /// A loader option of a token source as KEY=VALUE (repeat for more): tokenizer,
    /// text_column, eos_token, token_dtype.
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = crate::doctor::key_value)]
    pub(crate) set: Vec<(String, String)>,
}

pub(crate) fn run(args: &PackArgs) -> Result<(), String> {
    if args.merge {
        let [out] = &args.paths[..] else {
            return Err("--merge takes one path: the directory the slices were packed into".into());
        };
        let index = merge(Path::new(out)).map_err(|e| e.to_string())?;
        println!("wrote {}", index.display());
        return Ok(());
    }
    let [src, out] = &args.paths[..] else {
        return Err("expected SRC OUT (or --merge OUT)".into());
    };
    // A parquet: source is text read as tokens with a tokenizer, else a table of images and
    // numbers packed as any other source.
    let text = src.starts_with("parquet:") && args.set.iter().any(|(k, _)| k == "tokenizer");
    if text || ["tokens:", "megatron:"].iter().any(|p| src.starts_with(p)) {
        return pack_tokens(src, Path::new(out), &args.set);
    }
    if let Some((key, _)) = args.set.first() {
        return Err(format!("--set {key}=…: options are for token sources only"));
    }
    let options = PackOptions {
        max_side: args.max_side,
        quality: args.quality,
        mode: args
            .mode
            .parse()
            .map_err(|e: stoker_core::Error| e.to_string())?,
        shard_size: args
            .shard_size
            .as_deref()
            .map(|v| parse_size("shard-size", v))
            .transpose()
            .map_err(|e| e.to_string())?,
        slice: args.shard_index.zip(args.num_shards),
        ..PackOptions::default()
    };
    let source = open_source_with_fields(src, args.fields.as_deref()).map_err(|e| e.to_string())?;
    let interactive = std::io::stderr().is_terminal();
    let bar = interactive.then(|| {
        // The template is a constant; should indicatif ever reject it, the default bar still
        // shows progress.
        let style = ProgressStyle::with_template(
            "stoker pack [{bar:30}] {pos}/{len} samples  {rate}  ETA {eta}",
        )
        .map(|s| s.progress_chars("#>.").with_key("rate", whole_rate))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        ProgressBar::new(0).with_style(style)
    });
    let start = Instant::now();
    let progress = |done: u64, total: u64| {
        if let Some(bar) = &bar {
            bar.set_length(total);
            bar.set_position(done);
        }
    };
    let report = pack(&*source, Path::new(out), &options, &progress).map_err(|e| e.to_string())?;
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "packed {} samples into {} file(s), {:.1} MiB, in {secs:.2} s ({:.0} samples/s){}",
        report.samples,
        report.files.len(),
        report.bytes as f64 / (1 << 20) as f64,
        report.samples as f64 / secs.max(1e-9),
        match &report.index {
            Some(index) => format!("; index {}", index.display()),
            None if options.slice.is_some() => {
                "; run `stoker pack --merge OUT` once every slice is packed".to_owned()
            }
            None => String::new(),
        }
    );
    Ok(())
}

/// The token source `src` with the options `set`, opened to be written out.
pub(crate) fn open_tokens(src: &str, set: &[(String, String)]) -> Result<TokenSource, String> {
    let mut options = stoker_core::LoaderOptions::new();
    options.set("source", src).map_err(|e| e.to_string())?;
    for (key, value) in set {
        options.set(key, value).map_err(|e| e.to_string())?;
    }
    options.open_token_source().map_err(|e| e.to_string())
}

/// Writes the token source `src` (with the options `set`) to `out` and its sidecar of lengths.
fn pack_tokens(src: &str, out: &Path, set: &[(String, String)]) -> Result<(), String> {
    let start = Instant::now();
    let source = open_tokens(src, set)?;
    let opened = start.elapsed().as_secs_f64();
    let total = source.total_tokens();
    let bar = std::io::stderr().is_terminal().then(|| {
        let style = ProgressStyle::with_template(
            "stoker pack [{bar:30}] {pos}/{len} tokens  {rate}  ETA {eta}",
        )
        .map(|s| s.progress_chars("#>.").with_key("rate", whole_rate))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        ProgressBar::new(total).with_style(style)
    });
    let report = source
        .write_flat(out, &mut |done| {
            if let Some(bar) = &bar {
                bar.set_position(done);
            }
        })
        .map_err(|e| e.to_string())?;
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "packed {} tokens of {} documents as {} into {} and {} in {secs:.2} s \
         (opening {opened:.2} s; {:.0} tokens/s); read them as tokens:{}",
        report.tokens,
        report.documents,
        report.dtype,
        report.path.display(),
        report.sidecar.display(),
        report.tokens as f64 / secs.max(1e-9),
        report.path.display()
    );
    Ok(())
}

/// The bar's rate as a whole number per second (indicatif's `{per_sec}` shows four decimals).
fn whole_rate(state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write) {
    let _ = write!(w, "{:.0}/s", state.per_sec());
}
