//! What reading a `parquet:` table's rows costs on one thread, without decoding: every row read
//! shuffled, twice, then in `order=quasi_random`'s order, twice, then in row order, twice, with
//! `parquet_cache` set to each size given.
//!
//! `cargo run --release -p stoker-core --example parquet_reads -- FILE.parquet [BYTES ...]`
//!
//! BYTES default to `0 1073741824 50000000` (none, the default, and a cache smaller than the
//! table); each size runs in a fresh source, in that order. A Hugging Face-style file of `N`
//! rows of 100 KB (random bytes stand in for JPEGs, which snappy cannot shrink either), written
//! with pyarrow's defaults in row groups of 100, as earlier releases of `datasets` wrote image
//! datasets, so a page per row group; or, with `CDC = True`, as `datasets` 5.2.0 writes them:
//! row groups of 100 MB, content-defined pages of 256 KiB to 1 MiB and a page index. The docs'
//! figures are for N = 2,000 and, larger than the cache, 16,000:
//!
//! ```python
//! import numpy as np, pyarrow as pa, pyarrow.parquet as pq
//! N, CDC = 2000, False
//! rng = np.random.default_rng(0)
//! schema = pa.schema([("image", pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
//!                     ("label", pa.int64())])
//! options = dict(use_content_defined_chunking=True, write_page_index=True) if CDC else {}
//! with pq.ParquetWriter("hf.parquet", schema, **options) as w:
//!     for start in range(0, N, 1000):
//!         rows = range(start, min(start + 1000, N))
//!         images = [{"bytes": rng.bytes(100_000), "path": f"{i}.jpg"} for i in rows]
//!         labels = pa.array([i % 1000 for i in rows], pa.int64())
//!         w.write_table(pa.table({"image": images, "label": labels}, schema=schema),
//!                       row_group_size=1000 if CDC else 100)
//! ```

#[cfg(feature = "parquet")]
use std::time::Instant;

#[cfg(feature = "parquet")]
use stoker_core::options::QUASI_RANDOM_WINDOW_PAGES;
#[cfg(feature = "parquet")]
use stoker_core::source::{ParquetSource, Source};
#[cfg(feature = "parquet")]
use stoker_core::{Sampler, SamplerKind};

/// Without the `parquet` feature there is no table to read. (Not `required-features`: the sdist
/// leaves the examples out, and Cargo refuses a manifest naming a missing example.)
#[cfg(not(feature = "parquet"))]
fn main() {
    eprintln!("parquet_reads needs stoker-core's `parquet` feature (on by default)");
}

#[cfg(feature = "parquet")]
fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: parquet_reads FILE.parquet [BYTES ...]")?;
    let mut sizes: Vec<u64> = args
        .map(|a| a.parse().map_err(|_| format!("{a}: not a byte count")))
        .collect::<Result<_, _>>()?;
    if sizes.is_empty() {
        sizes = vec![0, 1 << 30, 50_000_000];
    }
    for cache in sizes {
        let source = ParquetSource::open(&path, None, &Default::default())
            .map_err(|e| e.to_string())?
            .with_cache(cache);
        let n = source.len();
        let in_order: Vec<usize> = (0..n).collect();
        // A fixed xorshift shuffle: the same order for every size.
        let mut shuffled = in_order.clone();
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        for i in (1..n).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            shuffled.swap(i, (x % (i as u64 + 1)) as usize);
        }
        let pages = source.pages().ok_or("a parquet table has pages")?;
        let kind = SamplerKind::QuasiRandom {
            pages,
            window: QUASI_RANDOM_WINDOW_PAGES,
        };
        let quasi_random = Sampler::new(kind, n, 0)
            .map_err(|e| e.to_string())?
            .epoch_indices(0);
        let mut scratch = Vec::new();
        for (name, order) in [
            ("shuffled", &shuffled),
            ("quasi_random", &quasi_random),
            ("in order", &in_order),
        ] {
            for pass in 1..=2 {
                let start = Instant::now();
                let mut bytes = 0;
                for &i in order {
                    bytes += source
                        .read(i, &mut scratch)
                        .map_err(|e| e.to_string())?
                        .get(0)
                        .len();
                }
                let s = start.elapsed().as_secs_f64();
                println!(
                    "parquet_cache={cache}: {name}, pass {pass}: {n} rows ({} MB) in {s:.3} s, \
                     {:.1} us a row",
                    bytes >> 20,
                    s * 1e6 / n as f64
                );
            }
        }
    }
    Ok(())
}
