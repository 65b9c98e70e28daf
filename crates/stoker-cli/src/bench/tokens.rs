//! `stoker bench tokens`: a token source's startup and throughput on a Megatron dataset of many
//! files, beside the machine's limit for the same work, in one run.
//!
//! - **Startup**: opening `--files` Megatron `.idx`/`.bin` pairs of `--docs` documents each
//!   (`TokenSource::open`): the first open (every index mapped and checked, its tables built and
//!   cached beside it) and later ones (the cached tables mapped), each with the files evicted
//!   from the page cache (`POSIX_FADV_DONTNEED`, as after a reboot or on a new node) and with
//!   them cached; the index tables an opened source keeps per document, and the heap a later
//!   open keeps (`RssAnon` before and after).
//! - **Throughput**: shuffled `seq_len + 1`-token windows as int64 `input_ids`/`labels` in
//!   pinned batches, with one worker and with every usable core: input tokens per second and per
//!   CPU-second of the process (per core). Beside it, nanoGPT's `get_batch` done natively in this
//!   process (one thread: random windows of the same files, widened to int64 into two buffers),
//!   the most a loader could deliver per core without doing anything else.

use std::path::{Path, PathBuf};
use std::time::Instant;

use stoker_core::autotune::process_cpu_ns;
use stoker_core::rng::{Rng, Stream};
use stoker_core::source::mapped::Mapping;
use stoker_core::source::tokens::megatron::with_extension;
use stoker_core::source::tokens::MegatronWriter;
use stoker_core::source::tokens::{Boundaries, Packing, TokenType};
use stoker_core::source::{TokenConfig, TokenSource, TokenSpec};
use stoker_core::{DType, Loader, LoaderOptions};

/// GPT-2's vocabulary: the generated token ids are below it (and fit uint16).
const VOCAB: u64 = 50_257;

/// `stoker bench tokens`'s arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct TokensBenchArgs {
    /// Megatron datasets (`.idx` + `.bin` pairs) in the generated data.
    #[arg(long, value_name = "N", default_value_t = 2500)]
    pub(crate) files: usize,
    /// Documents per dataset (16 to 112 uint16 tokens each, 64 on average).
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub(crate) docs: usize,
    /// Tokens per sample (windows are one longer, for the labels).
    #[arg(long, value_name = "N", default_value_t = 2048)]
    pub(crate) seq_len: usize,
    /// Samples per batch.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub(crate) batch_size: usize,
    /// Batches measured per loader run (as many again run first, to warm up).
    #[arg(long, value_name = "N", default_value_t = 400)]
    pub(crate) batches: usize,
    /// Where the data is built, once (default: $XDG_CACHE_HOME/stoker or ~/.cache/stoker).
    #[arg(long, value_name = "DIR")]
    pub(crate) data_dir: Option<PathBuf>,
}

pub(crate) fn run(args: &TokensBenchArgs) -> Result<(), String> {
    if args.files == 0 || args.docs == 0 || args.seq_len == 0 || args.batch_size == 0 {
        return Err("--files, --docs, --seq-len and --batch-size must be at least 1".into());
    }
    let dir = args
        .data_dir
        .clone()
        .unwrap_or_else(crate::photos::cache_dir)
        .join(format!("bench-tokens-{}x{}", args.files, args.docs));
    let prefixes = generated(&dir, args.files, args.docs)?;
    let pattern = format!("{}/part-{{00000..{:05}}}", dir.display(), args.files - 1);
    let documents = args.files * args.docs;

    // Startup: the first open (indexes read, checked, their tables cached beside them), then
    // later opens (the cached tables mapped), each with the files evicted and then cached.
    let caches: Vec<PathBuf> = prefixes.iter().map(|p| index_cache(p)).collect();
    for cache in &caches {
        match std::fs::remove_file(cache) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(format!("{}: {e}", cache.display()))
            }
            _ => {}
        }
    }
    let evict_all = |with_caches: bool| -> Result<(), String> {
        for prefix in &prefixes {
            for ext in [".idx", ".bin"] {
                evict(&with_extension(prefix, ext))?;
            }
        }
        if with_caches {
            for cache in &caches {
                evict(cache)?;
            }
        }
        Ok(())
    };
    evict_all(false)?;
    let config = TokenConfig {
        seq_len: args.seq_len,
        boundaries: Boundaries::Ignore,
        output: DType::I64,
        raw: None,
        eos: None,
        vocab_size: None,
        tokenizer: None,
        text_column: "text".into(),
        packing: Packing::Concat,
        pad_token: 0,
    };
    let spec = TokenSpec::Megatron(pattern.clone());
    let timed = || -> Result<(f64, TokenSource), String> {
        let started = Instant::now();
        let source = TokenSource::open(&spec, &config).map_err(|e| e.to_string())?;
        Ok((started.elapsed().as_secs_f64(), source))
    };
    let (first_cold, source) = timed()?;
    drop(source);
    if let Some(missing) = caches.iter().find(|c| !c.exists()) {
        return Err(format!(
            "{}: the first open wrote no index cache (is {} writable?)",
            missing.display(),
            dir.display()
        ));
    }
    for cache in &caches {
        std::fs::remove_file(cache).map_err(|e| format!("{}: {e}", cache.display()))?;
    }
    let (first_warm, source) = timed()?;
    drop(source);
    evict_all(true)?;
    let (later_cold, source) = timed()?;
    drop(source);
    let heap_before = rss_anon_bytes();
    let (later_warm, source) = timed()?;
    let heap = rss_anon_bytes()
        .zip(heap_before)
        .map(|(after, before)| after.saturating_sub(before));
    let resident = source.index_bytes();
    let tokens = source.total_tokens();
    drop(source);

    // Throughput.
    let cores = stoker_core::launch::usable_cores();
    let mut rows = Vec::new();
    for workers in [1, cores] {
        if rows.iter().any(|(w, _, _)| *w == workers) {
            continue;
        }
        let (per_s, per_cpu_s) = loader_rate(&pattern, args, workers)?;
        rows.push((workers, per_s, per_cpu_s));
    }
    let limit = get_batch_rate(&prefixes, args)?;

    println!();
    println!(
        "{} Megatron datasets, {documents} documents, {:.0} M uint16 tokens, {} cores",
        args.files,
        tokens as f64 / 1e6,
        cores
    );
    println!("startup (TokenSource::open)");
    println!("  first open: every index read, checked, its tables cached beside it");
    println!("    files not in the page cache   {first_cold:>8.2} s");
    println!("    files in the page cache       {first_warm:>8.2} s");
    println!("  later opens: the cached tables mapped");
    println!("    files not in the page cache   {later_cold:>8.2} s");
    println!("    files in the page cache       {later_warm:>8.2} s");
    println!(
        "  index tables kept             {:>8.1} bytes per document ({:.1} MB, mapped)",
        resident as f64 / documents as f64,
        resident as f64 / 1e6
    );
    match heap {
        Some(bytes) => println!(
            "  heap kept by a later open     {:>8.1} bytes per document ({:.1} MB)",
            bytes as f64 / documents as f64,
            bytes as f64 / 1e6
        ),
        None => println!("  heap kept                     (no /proc/self/status here)"),
    }
    println!(
        "throughput: shuffled windows of {} tokens, int64, pinned batches of {}",
        args.seq_len + 1,
        args.batch_size
    );
    println!(
        "  {:<34} {:>14} {:>16} {:>8}",
        "", "tokens/s", "tokens/CPU-s", "vs limit"
    );
    for (workers, per_s, per_cpu_s) in &rows {
        println!(
            "  {:<34} {:>14.0} {:>16.0} {:>8.2}",
            format!("stoker, num_workers={workers}"),
            per_s,
            per_cpu_s,
            per_cpu_s / limit.max(1e-9)
        );
    }
    println!(
        "  {:<34} {:>14.0} {:>16.0} {:>8.2}",
        "get_batch (nanoGPT's), 1 thread", limit, limit, 1.0
    );
    Ok(())
}

/// Input tokens per second and per CPU-second of the process, from a loader with `workers`.
fn loader_rate(
    pattern: &str,
    args: &TokensBenchArgs,
    workers: usize,
) -> Result<(f64, f64), String> {
    let mut options = LoaderOptions::new();
    for (k, v) in [
        ("source", format!("megatron:{pattern}")),
        ("seq_len", args.seq_len.to_string()),
        ("batch_size", args.batch_size.to_string()),
        ("shuffle", "true".into()),
        ("pin_memory", "true".into()),
        ("num_workers", workers.to_string()),
    ] {
        options.set(k, &v).map_err(|e| format!("{k}={v}: {e}"))?;
    }
    let mut loader = Loader::new(&options).map_err(|e| e.to_string())?;
    let next = |loader: &mut Loader| -> Result<(), String> {
        for _ in 0..2 {
            if loader.next().map_err(|e| e.to_string())?.is_some() {
                return Ok(());
            }
        }
        Err("the source gives no batch".into())
    };
    for _ in 0..args.batches {
        next(&mut loader)?;
    }
    let (started, cpu) = (Instant::now(), process_cpu_ns());
    for _ in 0..args.batches {
        next(&mut loader)?;
    }
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    let cpu_secs = (process_cpu_ns().saturating_sub(cpu) as f64 / 1e9).max(1e-9);
    let tokens = (args.batches * args.batch_size * args.seq_len) as f64;
    Ok((tokens / secs, tokens / cpu_secs))
}

/// nanoGPT's `get_batch` on the same files, natively and on one thread: each row a random
/// window of `seq_len + 1` tokens of a random file, widened to int64 as `x` and, shifted by
/// one, `y`. Input tokens per second, the median of three rounds.
fn get_batch_rate(prefixes: &[PathBuf], args: &TokensBenchArgs) -> Result<f64, String> {
    let maps = prefixes
        .iter()
        .map(|p| {
            let path = with_extension(p, ".bin");
            let file =
                std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            Mapping::map(&file, &path).map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, String>>()?;
    let seq = args.seq_len;
    let window = 2 * (seq + 1);
    // Files too short for one window are passed over, as a `get_batch` over them could not draw.
    let usable: Vec<&Mapping> = maps.iter().filter(|m| m.len() >= window).collect();
    if usable.is_empty() {
        return Err(format!("no dataset holds {} tokens", seq + 1));
    }
    let mut x = vec![0i64; args.batch_size * seq];
    let mut y = vec![0i64; args.batch_size * seq];
    let mut rng = Rng::for_key(0, Stream::Order, 0, 0);
    let mut rates = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        for _ in 0..args.batches {
            for row in 0..args.batch_size {
                let m = usable[rng.below(usable.len() as u64) as usize];
                let start = rng.below(((m.len() - window) / 2 + 1) as u64) as usize * 2;
                let tokens = &m[start..start + window];
                let widen = |to: &mut [i64], from: &[u8]| {
                    for (v, t) in to.iter_mut().zip(from.chunks_exact(2)) {
                        *v = i64::from(u16::from_le_bytes([t[0], t[1]]));
                    }
                };
                widen(&mut x[row * seq..][..seq], &tokens[..2 * seq]);
                widen(&mut y[row * seq..][..seq], &tokens[2..]);
            }
            std::hint::black_box((&mut x, &mut y));
        }
        rates.push((args.batches * args.batch_size * seq) as f64 / started.elapsed().as_secs_f64());
    }
    rates.sort_by(f64::total_cmp);
    Ok(rates[1])
}

/// `files` Megatron datasets of `docs` documents each in `dir`, `part-00000` on, made once (a
/// file `complete` marks a whole set). Returns their prefixes.
fn generated(dir: &Path, files: usize, docs: usize) -> Result<Vec<PathBuf>, String> {
    let prefixes: Vec<PathBuf> = (0..files)
        .map(|f| dir.join(format!("part-{f:05}")))
        .collect();
    let complete = dir.join("complete");
    if complete.exists() {
        return Ok(prefixes);
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    eprintln!(
        "writing {files} Megatron datasets of {docs} documents into {} ...",
        dir.display()
    );
    let mut doc = Vec::new();
    for (f, prefix) in prefixes.iter().enumerate() {
        let mut rng = Rng::for_key(0, Stream::Order, 1, f as u64);
        let mut writer =
            MegatronWriter::create(prefix, TokenType::U16).map_err(|e| e.to_string())?;
        for _ in 0..docs {
            let len = 16 + rng.below(97) as usize;
            doc.clear();
            doc.extend((0..len).map(|_| rng.below(VOCAB) as i64));
            writer.add_document(&doc).map_err(|e| e.to_string())?;
        }
        writer.finish().map_err(|e| e.to_string())?;
    }
    std::fs::write(&complete, b"").map_err(|e| format!("{}: {e}", complete.display()))?;
    Ok(prefixes)
}

/// Drops `path`'s pages from the page cache, so the next read comes from the disk.
/// The index cache the first open writes beside a dataset's index (`.NAME.idx.stkidx`).
fn index_cache(prefix: &Path) -> PathBuf {
    let name = prefix.file_name().unwrap_or_default().to_string_lossy();
    prefix.with_file_name(format!(".{name}.idx.stkidx"))
}

fn evict(path: &Path) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    // Dirty pages are not dropped: write them first.
    file.sync_all()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: the descriptor is open for the call; the advice changes no memory of ours.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(format!(
            "{}: posix_fadvise: {}",
            path.display(),
            std::io::Error::from_raw_os_error(rc)
        ));
    }
    Ok(())
}

/// This process's anonymous resident memory (`RssAnon` of `/proc/self/status`), where Linux
/// says it.
fn rss_anon_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("RssAnon:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
