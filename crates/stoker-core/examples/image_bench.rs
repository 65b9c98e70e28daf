//! Single-core decode and pipeline throughput on the JPEG fixtures, and a loader run.
//!
//! `cargo run --release -p stoker-core --example image_bench [SECONDS_PER_CASE]`

use std::path::Path;
use std::time::{Duration, Instant};

use stoker_core::decode::{decode_rgb, DecodeBuffers};
use stoker_core::rng::{Rng, Stream};
use stoker_core::{DType, Layout, Loader, LoaderOptions, Pipeline};

const FIXTURES: &[&str] = &[
    "photo_baseline.jpg",
    "photo_progressive.jpg",
    "photo_gray.jpg",
    "photo_cmyk.jpg",
    "photo_444.jpg",
];

fn rate(budget: Duration, mut f: impl FnMut(usize)) -> f64 {
    let start = Instant::now();
    let mut n = 0;
    while start.elapsed() < budget {
        for _ in 0..50 {
            f(n);
            n += 1;
        }
    }
    n as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let budget = Duration::from_secs_f64(secs);
    let dir = std::env::var_os("STOKER_FIXTURES")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/images"));
    let files: Vec<Vec<u8>> = FIXTURES
        .iter()
        .map(|f| std::fs::read(dir.join(f)).unwrap())
        .collect();

    let mut bufs = DecodeBuffers::default();
    for (name, bytes) in FIXTURES.iter().zip(&files) {
        let r = rate(budget / 2, |_| {
            decode_rgb(bytes, u64::MAX, &mut bufs).unwrap();
        });
        println!("decode only, 1 core, {name} (500x375): {r:.0} images/s");
    }
    let r = rate(budget, |i| {
        decode_rgb(&files[i % files.len()], u64::MAX, &mut bufs).unwrap();
    });
    println!("decode only, 1 core, all JPEG fixtures: {r:.0} images/s");

    for (spec, dtype, layout) in [
        (
            "random_resized_crop(224) | hflip | normalize(imagenet)",
            DType::F32,
            Layout::Nchw,
        ),
        ("resize(256) | center_crop(224)", DType::U8, Layout::Nhwc),
        (
            "resize(256) | center_crop(224) | normalize(imagenet)",
            DType::BF16,
            Layout::Nchw,
        ),
    ] {
        let p = Pipeline::new(Some(spec), Some(dtype), layout).unwrap();
        let mut scratch = stoker_core::transform::Scratch::default();
        let mut out = vec![0u8; p.output_bytes()];
        let decoded: Vec<(Vec<u8>, usize, usize)> = files
            .iter()
            .map(|f| {
                let d = decode_rgb(f, u64::MAX, &mut bufs).unwrap();
                (bufs.rgb.clone(), d.width, d.height)
            })
            .collect();
        let r = rate(budget / 2, |i| {
            let mut rng = Rng::for_key(0, Stream::Augment, 0, i as u64);
            let (rgb, w, h) = &decoded[i % decoded.len()];
            p.apply(rgb, *w, *h, &mut rng, &mut out, &mut scratch)
                .unwrap();
        });
        println!(
            "transform only (decoded input), 1 core, `{spec}` {dtype} {layout:?}: {r:.0} images/s"
        );
        let r = rate(budget, |i| {
            let mut rng = Rng::for_key(0, Stream::Augment, 0, i as u64);
            let d = decode_rgb(&files[i % files.len()], u64::MAX, &mut bufs).unwrap();
            p.apply(
                &bufs.rgb,
                d.width,
                d.height,
                &mut rng,
                &mut out,
                &mut scratch,
            )
            .unwrap();
        });
        println!("full pipeline, 1 core, `{spec}` {dtype} {layout:?}: {r:.0} images/s");
    }

    // Loader over a folder: 10 classes x 64 files, batch 64, float32 NCHW.
    let root = std::env::temp_dir().join(format!("stoker-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    for c in 0..10 {
        let d = root.join(format!("class{c}"));
        std::fs::create_dir_all(&d).unwrap();
        for i in 0..64 {
            std::fs::write(d.join(format!("{i}.jpg")), &files[(c + i) % files.len()]).unwrap();
        }
    }
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    for w in [0, 1, workers] {
        let mut o = LoaderOptions::new();
        for (k, v) in [
            ("source", format!("image_folder:{}", root.display())),
            ("batch_size", "64".into()),
            ("shuffle", "true".into()),
            ("num_workers", w.to_string()),
            ("prefetch_factor", "4".into()),
            (
                "transform",
                "random_resized_crop(224) | hflip | normalize(imagenet)".into(),
            ),
        ] {
            o.set(k, &v).unwrap();
        }
        let mut l = Loader::new(&o).unwrap();
        let start = Instant::now();
        let mut n = 0;
        while start.elapsed() < budget {
            match l.next().unwrap() {
                Some(b) => n += b.len(),
                None => continue,
            }
        }
        let r = n as f64 / start.elapsed().as_secs_f64();
        println!("loader, image_folder -> RRC(224)+hflip+normalize f32 NCHW, batch 64, {w} worker(s): {r:.0} images/s");
    }
    let _ = std::fs::remove_dir_all(&root);
}
