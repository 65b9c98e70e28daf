//! `stoker bench decoders [ROOT]`: the JPEG decoders side by side on the same files, from
//! memory, on one thread and on all of them, in one run: zune-jpeg and libjpeg-turbo on whole
//! images, libjpeg-turbo on only the region a random_resized_crop(224) reads (as the loader
//! does, shrinking in the DCT domain when the crop is at least 6x the output; and shrinking
//! whenever it is 2x, faster but further from Pillow's pixels), and Pillow's decode
//! (libjpeg-turbo through Python) as the reference users know.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use stoker_core::decode::{
    decode, decode_rgb_with, jpeg_decoder_summary, read_header, turbo_available, DecodeBuffers,
    JpegDecoder, Window,
};
use stoker_core::rng::{Rng, Stream};
use stoker_core::{ImageFolderSource, Layout, Pipeline, Source};

/// The crop whose region the region decoders decode.
const CROP: &str = "random_resized_crop(224)";

#[derive(Clone, Copy, PartialEq)]
enum Decoder {
    ZuneWhole,
    TurboWhole,
    TurboRegion,
    TurboRegionScaled,
}

impl Decoder {
    fn name(self) -> &'static str {
        match self {
            Decoder::ZuneWhole => "zune-jpeg, whole image",
            Decoder::TurboWhole => "libjpeg-turbo, whole image",
            Decoder::TurboRegion => "libjpeg-turbo, crop region (loader)",
            Decoder::TurboRegionScaled => "libjpeg-turbo, region + DCT at >=2x",
        }
    }
}

/// `stoker bench decoders`'s arguments.
#[derive(Debug, clap::Args)]
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

pub(crate) fn run(args: &DecodersBenchArgs) -> Result<(), String> {
    let root = match &args.root {
        Some(root) => root.clone(),
        None => crate::photos::imagenet_like(&crate::photos::cache_dir(), args.per_class)?,
    };
    let folder = ImageFolderSource::open(&root).map_err(|e| e.to_string())?;
    let files: Vec<PathBuf> = (0..folder.len()).map(|i| folder.path(i)).collect();
    let images: Vec<Vec<u8>> = files
        .iter()
        .map(|p| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display())))
        .collect::<Result<_, _>>()?;
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pipeline = Pipeline::new(Some(CROP), None, Layout::Nchw)?;

    let mut decoders = vec![Decoder::ZuneWhole];
    if turbo_available() {
        decoders.extend([
            Decoder::TurboWhole,
            Decoder::TurboRegion,
            Decoder::TurboRegionScaled,
        ]);
    }
    let thread_counts = if all > 1 { vec![1, all] } else { vec![1] };
    // best[decoder][threads], images per second; the rounds interleave the decoders so that
    // a noisy neighbour slows every row alike, and each keeps its best round.
    let mut best = vec![vec![0f64; thread_counts.len()]; decoders.len()];
    let mut pillow = vec![None; thread_counts.len()];
    let mut pillow_note = None;
    let rounds = args.rounds.max(1);
    for round in 0..rounds {
        eprint!("\rbench decoders: round {}/{rounds}", round + 1);
        for (t, &threads) in thread_counts.iter().enumerate() {
            for (d, &decoder) in decoders.iter().enumerate() {
                let rate = measure(&images, &files, &pipeline, decoder, threads)?;
                best[d][t] = f64::max(best[d][t], rate);
            }
            match pillow_rate(&files, threads) {
                Ok(rate) => pillow[t] = Some(f64::max(pillow[t].unwrap_or(0.0), rate)),
                Err(why) => pillow_note = Some(why),
            }
        }
    }
    eprintln!();

    if args.json {
        let mut rows: Vec<serde_json::Value> = decoders
            .iter()
            .zip(&best)
            .map(|(d, rates)| serde_json::json!({ "decoder": d.name(), "images_per_s": rates }))
            .collect();
        rows.push(serde_json::json!({
            "decoder": "Pillow (libjpeg-turbo), whole image",
            "images_per_s": pillow,
            "error": pillow_note,
        }));
        let out = serde_json::json!({
            "images": images.len(),
            "root": root.display().to_string(),
            "jpeg_decoder_auto": jpeg_decoder_summary(),
            "threads": thread_counts,
            "decoders": rows,
        });
        println!("{out}");
        return Ok(());
    }

    println!(
        "{} JPEGs in {} (decoded from memory); region rows decode what {CROP} reads",
        images.len(),
        root.display()
    );
    println!(
        "jpeg_decoder=auto in this build: {}",
        jpeg_decoder_summary()
    );
    print!("{:<38}", "decoder");
    for threads in &thread_counts {
        print!(
            " {:>10}",
            format!("{threads} thread{}", if *threads == 1 { "" } else { "s" })
        );
    }
    println!("   images/s; 1 thread vs zune-jpeg whole");
    let zune = best[0][0].max(1e-9);
    for (d, decoder) in decoders.iter().enumerate() {
        print!("{:<38}", decoder.name());
        for rate in &best[d] {
            print!(" {rate:>10.0}");
        }
        println!("   {:.2}x", best[d][0] / zune);
    }
    print!("{:<38}", "Pillow (libjpeg-turbo), whole image");
    for rate in &pillow {
        match rate {
            Some(r) => print!(" {r:>10.0}"),
            None => print!(" {:>10}", "-"),
        }
    }
    match pillow[0] {
        Some(r) => println!("   {:.2}x", r / zune),
        None => println!(),
    }
    if let Some(why) = pillow_note {
        println!("Pillow not measured: {why}");
    }
    if !turbo_available() {
        println!("libjpeg-turbo rows missing: this build has no `turbojpeg` feature");
    }
    Ok(())
}

/// Decodes every image once with `decoder` on `threads` threads; images per second.
fn measure(
    images: &[Vec<u8>],
    files: &[PathBuf],
    pipeline: &Pipeline,
    decoder: Decoder,
    threads: usize,
) -> Result<f64, String> {
    let chunk = images.len().div_ceil(threads).max(1);
    let start = Instant::now();
    std::thread::scope(|s| {
        let handles: Vec<_> = images
            .chunks(chunk)
            .zip(files.chunks(chunk))
            .enumerate()
            .map(|(part, (images, files))| {
                s.spawn(move || -> Result<(), String> {
                    let mut bufs = DecodeBuffers::default();
                    for (i, (bytes, path)) in images.iter().zip(files).enumerate() {
                        decode_one(
                            bytes,
                            pipeline,
                            decoder,
                            (part * chunk + i) as u64,
                            &mut bufs,
                        )
                        .map_err(|e| format!("{}: {e}", path.display()))?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .map_err(|_| "a decode thread panicked".to_string())?
        })
    })?;
    Ok(images.len() as f64 / start.elapsed().as_secs_f64())
}

fn decode_one(
    bytes: &[u8],
    pipeline: &Pipeline,
    decoder: Decoder,
    index: u64,
    bufs: &mut DecodeBuffers,
) -> Result<(), String> {
    match decoder {
        Decoder::ZuneWhole => decode_rgb_with(bytes, u64::MAX, JpegDecoder::Zune, bufs).map(|_| ()),
        Decoder::TurboWhole => {
            decode_rgb_with(bytes, u64::MAX, JpegDecoder::Turbo, bufs).map(|_| ())
        }
        Decoder::TurboRegion | Decoder::TurboRegionScaled => {
            let header = read_header(bytes, u64::MAX, JpegDecoder::Turbo, bufs)?;
            let mut rng = Rng::for_key(0, Stream::Augment, 0, index);
            let plan = pipeline.plan(header.dims.width, header.dims.height, &mut rng)?;
            // The loader's window: the crop's region, shrunk in the DCT domain only where the
            // resample after it still shrinks 3x (crop >= 6x the output).
            let mut window: Window = pipeline.window(&plan);
            if decoder == Decoder::TurboRegionScaled {
                // The faster, less exact rule: shrink whenever the crop is at least twice the
                // output (1/2 at 2x, 1/4 at 4x, 1/8 at 8x).
                let [_, _, w, h] = plan.rect;
                let ratio = (w / plan.width as f64).min(h / plan.height as f64);
                window.max_scale = [8, 4, 2, 1]
                    .into_iter()
                    .find(|&s| ratio >= s as f64)
                    .unwrap_or(1);
            }
            decode(bytes, &header, Some(window), bufs).map(|_| ())
        }
    }
}

/// Pillow's `Image.open(f).convert("RGB")` on the same files from memory, in `threads`
/// processes (Python decodes one image at a time per process); images per second.
fn pillow_rate(files: &[PathBuf], threads: usize) -> Result<f64, String> {
    const SCRIPT: &str = r#"
import io, sys, time
from multiprocessing import Pool
from PIL import Image

def work(paths):
    data = [open(p, "rb").read() for p in paths]
    start = time.perf_counter()
    for d in data:
        Image.open(io.BytesIO(d)).convert("RGB")
    return time.perf_counter() - start

paths = sys.stdin.read().splitlines()
n = int(sys.argv[1])
parts = [paths[i::n] for i in range(n)]
with Pool(n) as pool:
    secs = pool.map(work, parts)
print(len(paths) / max(secs))
"#;
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let mut child = Command::new(&python)
        .args(["-c", SCRIPT, &threads.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{python}: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        for f in files {
            writeln!(stdin, "{}", f.display()).map_err(|e| format!("{python}: {e}"))?;
        }
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{python}: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().last().unwrap_or("").to_string();
        return Err(format!(
            "{python} failed ({last}); set PYTHON to a Python with Pillow"
        ));
    }
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse::<f64>()
        .map_err(|e| format!("{python} printed no rate: {e}"))
}
