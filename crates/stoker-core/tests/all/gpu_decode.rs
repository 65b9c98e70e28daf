//! GPU decoding (`jpeg_decoder=gpu`, `gpu_decode_share`) against the fake device: the workers
//! plan a routed sample's crop and leave its JPEG to the prefetch thread, which decodes it on
//! the device (the fake's decoder is the CPU's), resizes it with the taps the worker computed
//! (the kernel's host reference) into the sample's slot, and casts it as `gpu_normalize` does.
//!
//! Agreement with the CPU path is stated in levels of the uint8 image: a routed image is
//! decoded whole and resampled in f32 from the CPU's filter, while the CPU decodes the crop's
//! region, shrinks it in the DCT domain when the crop is 6x the output or more, and resamples
//! with fixed-point weights. Measured on the test photos at 32x32: at most 7 levels off, and
//! under 0.1 on average over a batch (11 at most at 16x16, `stoker-capi`'s test, where the
//! CPU's DCT shrink weighs more); the bounds below leave room. nvJPEG's IDCT adds a few levels
//! on a real device.

use std::sync::Arc;

use stoker_core::testing::{damaged_jpegs, levels, FakeDevice};
use stoker_core::{ErrorKind, Loader, LoaderOptions};

use crate::support::device_bytes;
use crate::support::files::{test_image, tmp, write_tar};

/// The largest difference, in levels, between a device-decoded sample and the CPU's.
const MAX_LEVELS: u8 = 16;
/// The largest mean difference, in levels, over a batch.
const MAX_MEAN_LEVELS: f64 = 0.5;

/// Files the device takes (baseline 4:2:0, 4:4:4, grayscale) and files it leaves to the CPU
/// (progressive, CMYK, PNG), in turn.
const KINDS: [(&str, bool); 6] = [
    ("photo_baseline.jpg", true),
    ("photo_444.jpg", true),
    ("photo_gray.jpg", true),
    ("photo_progressive.jpg", false),
    ("photo_cmyk.jpg", false),
    ("photo_png.png", false),
];

/// A shard of `n` samples of [`KINDS`] in turn, each with a label.
fn shard(name: &str, n: usize) -> String {
    shard_with_damage(name, n, &[])
}

/// A baseline JPEG whose header reads and whose Huffman table does not: the device takes it,
/// and no decoder can decode it.
fn undecodable_jpeg() -> Vec<u8> {
    damaged_jpegs(&test_image("photo_baseline.jpg"))
        .into_iter()
        .find(|d| d.name == "bad Huffman table")
        .expect("a damaged table")
        .bytes
}

/// [`shard`], with the samples `damaged` an [`undecodable_jpeg`].
fn shard_with_damage(name: &str, n: usize, damaged: &[usize]) -> String {
    let dir = tmp(name);
    let bad = undecodable_jpeg();
    let members: Vec<(String, Vec<u8>)> = (0..n)
        .flat_map(|i| {
            let (file, _) = KINDS[i % KINDS.len()];
            let ext = if file.ends_with(".png") { "png" } else { "jpg" };
            let image = if damaged.contains(&i) {
                bad.clone()
            } else {
                test_image(file)
            };
            [
                (format!("{i:04}.{ext}"), image),
                (format!("{i:04}.cls"), (i % 3).to_string().into_bytes()),
            ]
        })
        .collect();
    let path = dir.join("kinds.tar");
    write_tar(&path, &members);
    format!("tar:{}", path.display())
}

fn options(source: &str, kv: &[(&str, &str)]) -> LoaderOptions {
    let mut o = LoaderOptions::new();
    o.set("source", source).unwrap();
    for (k, v) in [
        ("batch_size", "6"),
        ("seed", "5"),
        ("num_workers", "2"),
        ("transform", "random_resized_crop(32) | hflip"),
        ("dtype", "uint8"),
    ]
    .iter()
    .chain(kv)
    {
        o.set(k, v).unwrap_or_else(|e| panic!("{k}={v}: {e}"));
    }
    o
}

/// A batch's fields as bytes.
type Fields = Vec<Vec<u8>>;

/// One epoch of a loader, device and CPU side by side: per batch, the device's fields and the
/// CPU's. Also the device loader's stats after it was dropped.
struct Run {
    batches: Vec<(Fields, Fields)>,
    stats: stoker_core::Stats,
}

impl Run {
    fn device(&self) -> Vec<&Fields> {
        self.batches.iter().map(|(d, _)| d).collect()
    }
}

fn run(fake: &Arc<FakeDevice>, o: &LoaderOptions) -> Run {
    let mut dev = Loader::with_device_backend(o, fake.clone()).unwrap();
    let stats = dev.stats_handle();
    let mut cpu_options = o.clone();
    cpu_options.set("device", "cpu").unwrap();
    cpu_options.set("jpeg_decoder", "auto").unwrap();
    cpu_options.set("gpu_decode_share", "auto").unwrap();
    let mut cpu = Loader::new(&cpu_options).unwrap();
    let mut batches = Vec::new();
    while let Some(h) = cpu.next().unwrap() {
        let d = dev
            .next()
            .unwrap()
            .expect("as many device batches as host ones");
        let host: Vec<Vec<u8>> = h.fields().map(|f| f.data.unwrap().to_vec()).collect();
        batches.push((device_bytes(fake, &d), host));
    }
    assert!(dev.next().unwrap().is_none());
    drop(dev);
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
    Run {
        batches,
        stats: stats.snapshot(),
    }
}

/// Asserts every batch's image agrees with the CPU's within the stated tolerance, the labels
/// exactly, and that samples the device does not take are the CPU's bit for bit.
fn assert_agree(batches: &[(Fields, Fields)], routed_kinds_only: bool) {
    for (i, (dev, cpu)) in batches.iter().enumerate() {
        assert_eq!(dev[1], cpu[1], "batch {i}: labels");
        let per_sample = cpu[0].len() / 6;
        let (max, mean) = levels(&dev[0], &cpu[0]);
        assert!(
            max <= MAX_LEVELS && mean <= MAX_MEAN_LEVELS,
            "batch {i}: {max} levels at most, {mean:.2} on average"
        );
        if routed_kinds_only {
            for (s, (d, c)) in dev[0]
                .chunks(per_sample)
                .zip(cpu[0].chunks(per_sample))
                .enumerate()
            {
                let (_, device_takes) = KINDS[(i * 6 + s) % KINDS.len()];
                if !device_takes {
                    assert_eq!(d, c, "batch {i} sample {s}: decoded by the workers");
                }
            }
        }
    }
}

#[test]
fn the_device_decodes_what_it_can_within_a_few_levels_of_the_cpu_and_leaves_odd_files_to_it() {
    let source = shard("gpu-decode-kinds", 36);
    for layout in ["nhwc", "nchw"] {
        let fake = FakeDevice::new(0).unwrap();
        let o = options(&source, &[("jpeg_decoder", "gpu"), ("layout", layout)]);
        let Run { batches, stats } = run(&fake, &o);
        assert_eq!(batches.len(), 6);
        assert_agree(&batches, true);
        // Half the files are of kinds the device takes; the prefetch thread may have run
        // ahead into the next epoch, never behind.
        assert!(stats.decoded_device >= 18, "{}", stats.decoded_device);
        assert!(fake.counters().jpegs_decoded >= 18);
        assert_eq!(fake.counters().resizes_done, fake.counters().jpegs_decoded);
        assert_eq!(stats.gpu_decode_share, 1.0);
        assert_eq!(
            fake.counters().live_bytes,
            0,
            "the scratch is freed with the loader"
        );
    }
}

#[test]
fn normalized_float_batches_are_decoded_on_the_device_then_cast_by_the_cpus_table() {
    let source = shard("gpu-decode-float", 12);
    let fake = FakeDevice::new(0).unwrap();
    let uint8 = run(&fake, &options(&source, &[("jpeg_decoder", "gpu")])).batches;
    let floats = options(
        &source,
        &[
            ("jpeg_decoder", "gpu"),
            ("dtype", "float32"),
            (
                "transform",
                "random_resized_crop(32) | hflip | normalize(imagenet)",
            ),
        ],
    );
    let Run { batches, stats } = run(&fake, &floats);
    assert!(stats.decoded_device > 0);
    // The float output is the uint8 output looked up in the CPU's table: the same sample
    // agrees as its uint8 form does, here within the tolerance scaled by 1/std.
    for ((dev, cpu), (dev8, _)) in batches.iter().zip(&uint8) {
        let as_f32 = |b: &[u8]| -> Vec<f32> {
            b.chunks_exact(4)
                .map(|w| f32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
                .collect()
        };
        let (d, c) = (as_f32(&dev[0]), as_f32(&cpu[0]));
        let worst = d
            .iter()
            .zip(&c)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(
            worst <= f32::from(MAX_LEVELS) / 255.0 / 0.224 + 1e-4,
            "{worst}"
        );
        assert_eq!(d.len(), dev8[0].len(), "one float per uint8 element");
    }
}

#[test]
fn the_share_picks_samples_by_index_so_a_run_is_the_same_for_any_worker_count() {
    let source = shard("gpu-decode-share", 48);
    let fake = FakeDevice::new(0).unwrap();
    let runs: Vec<Run> = ["1", "3"]
        .iter()
        .map(|workers| {
            let o = options(
                &source,
                &[("gpu_decode_share", "0.5"), ("num_workers", workers)],
            );
            run(&fake, &o)
        })
        .collect();
    // The share in use is in the trace too, as a counter on the prefetch thread's track.
    let trace = tmp("gpu-decode-share-trace").join("trace.json");
    let traced = options(
        &source,
        &[
            ("gpu_decode_share", "0.5"),
            ("trace", trace.to_str().unwrap()),
        ],
    );
    let mut loader = Loader::with_device_backend(&traced, fake.clone()).unwrap();
    while loader.next().unwrap().is_some() {}
    drop(loader);
    let written = std::fs::read_to_string(&trace).unwrap();
    assert!(
        written.contains(r#""name":"gpu_decode_share","pid""#)
            && written.contains(r#""args":{"share":0.50}"#),
        "{written}"
    );
    assert!(
        runs[0].device() == runs[1].device(),
        "1 and 3 workers differ"
    );
    assert_agree(&runs[0].batches, false);
    let stats = &runs[0].stats;
    assert_eq!(stats.gpu_decode_share, 0.5);
    // About half of the 24 files the device takes go to it (a hash decides which).
    assert!(
        (4..=22).contains(&stats.decoded_device),
        "{}",
        stats.decoded_device
    );
}

#[test]
fn a_jpeg_the_device_refuses_is_decoded_by_the_prefetch_thread_with_the_workers_plan() {
    let source = shard("gpu-decode-refused", 24);
    let fake = FakeDevice::new(0).unwrap();
    fake.refuse_jpegs(2);
    let batches = run(&fake, &options(&source, &[("jpeg_decoder", "gpu")])).batches;
    assert!(fake.counters().jpegs_refused >= 6, "{:?}", fake.counters());
    assert!(fake.counters().jpegs_decoded >= 6);
    assert_agree(&batches, true);
}

#[test]
fn a_jpeg_no_decoder_can_read_is_replaced_under_skip_as_the_workers_replace_it() {
    // Samples 6 and 19: JPEGs the device takes by their headers, whose data neither it nor the
    // CPU can decode. Found by the prefetch thread, after their batches were built.
    let damaged = [6, 19];
    let source = shard_with_damage("gpu-decode-corrupt", 24, &damaged);
    let fake = FakeDevice::new(0).unwrap();
    // Indexed, and streamed (in the shard's order: one shard, a buffer of one), where the
    // candidates are the batch's own samples.
    for buffer in ["0", "1"] {
        let o = options(
            &source,
            &[
                ("jpeg_decoder", "gpu"),
                ("on_error", "skip"),
                ("shuffle_buffer", buffer),
            ],
        );
        let Run { batches, stats } = run(&fake, &o);
        assert_eq!(batches.len(), 4);
        assert_eq!(stats.samples_skipped, 2, "shuffle_buffer={buffer}");
        // The replacement is the sample the workers chose (the labels agree), written with the
        // replaced sample's draw on the CPU: bit for bit the CPU path's.
        assert_agree(&batches, false);
        for &i in &damaged {
            let (dev, cpu) = &batches[i / 6];
            let bytes = cpu[0].len() / 6;
            let slot = (i % 6) * bytes..(i % 6 + 1) * bytes;
            assert_eq!(
                dev[0][slot.clone()],
                cpu[0][slot],
                "sample {i}, shuffle_buffer={buffer}"
            );
        }
    }

    // A batch with a ragged field has a layout its own samples fixed: it fails, saying why.
    let bad = undecodable_jpeg();
    let captioned = tmp("gpu-decode-corrupt-ragged").join("captioned.tar");
    let members: Vec<(String, Vec<u8>)> = (0..6)
        .flat_map(|i| {
            let image = if i == 2 {
                bad.clone()
            } else {
                test_image("photo_baseline.jpg")
            };
            [
                (format!("{i:04}.jpg"), image),
                (format!("{i:04}.cls"), b"1".to_vec()),
                (
                    format!("{i:04}.txt"),
                    "a caption".repeat(i + 1).into_bytes(),
                ),
            ]
        })
        .collect();
    write_tar(&captioned, &members);
    let o = options(
        &format!("tar:{}", captioned.display()),
        &[
            ("jpeg_decoder", "gpu"),
            ("on_error", "skip"),
            ("fields", "jpg:image,cls:label,txt:caption"),
        ],
    );
    let mut dev = Loader::with_device_backend(&o, fake.clone()).unwrap();
    let e = dev.next().expect_err("not replaced").to_string();
    assert!(
        e.contains("sample 0002") && e.contains("field `caption` is ragged"),
        "{e}"
    );

    // Without on_error=skip the batch fails, naming the sample and both decoders.
    let o = options(&source, &[("jpeg_decoder", "gpu")]);
    let mut dev = Loader::with_device_backend(&o, fake.clone()).unwrap();
    assert!(dev.next().unwrap().is_some());
    let e = dev
        .next()
        .expect_err("sample 6 fails its batch")
        .to_string();
    assert!(
        e.contains("sample 0006") && e.contains("the CPU could not decode it either"),
        "{e}"
    );
}

#[test]
fn options_that_cannot_decode_on_the_device_say_why() {
    let source = shard("gpu-decode-options", 6);
    let fake = FakeDevice::new(0).unwrap();
    let refused = |kv: &[(&str, &str)], fake: &Arc<FakeDevice>| {
        let e =
            Loader::with_device_backend(&options(&source, kv), fake.clone()).expect_err("refused");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        e.to_string()
    };
    let e = refused(
        &[
            ("jpeg_decoder", "gpu"),
            (
                "transform",
                "random_resized_crop(32) | color_jitter(brightness=0.4)",
            ),
        ],
        &fake,
    );
    assert!(
        e.contains("color_jitter") && e.contains("jpeg_decoder"),
        "{e}"
    );
    let e = refused(
        &[
            ("jpeg_decoder", "gpu"),
            ("dtype", "float32"),
            ("gpu_normalize", "false"),
            ("transform", "random_resized_crop(32) | normalize(imagenet)"),
        ],
        &fake,
    );
    assert!(e.contains("gpu_normalize"), "{e}");
    let e = refused(
        &[
            ("jpeg_decoder", "gpu"),
            ("dtype", "float32"),
            (
                "transform",
                "random_resized_crop(32) | normalize(imagenet) | mixup(alpha=0.2, num_classes=3)",
            ),
        ],
        &fake,
    );
    assert!(e.contains("mixup"), "{e}");
    let e = refused(
        &[("jpeg_decoder", "zune"), ("gpu_decode_share", "0.3")],
        &fake,
    );
    assert!(e.contains("gpu_decode_share"), "{e}");

    let mut o = options(&source, &[("jpeg_decoder", "gpu")]);
    o.set("device", "cpu").unwrap();
    let e = Loader::new(&o).expect_err("no device").to_string();
    assert!(
        e.contains("jpeg_decoder") && e.contains("device=cuda"),
        "{e}"
    );

    let e = LoaderOptions::new()
        .set("gpu_decode_share", "1.5")
        .expect_err("out of range")
        .to_string();
    assert!(e.contains("gpu_decode_share"), "{e}");

    let without = FakeDevice::new(0).unwrap();
    without.remove_jpeg_decoder();
    let e = refused(&[("jpeg_decoder", "gpu")], &without);
    assert!(e.contains("cannot decode JPEGs"), "{e}");
    // A share left to `auto` decodes on the CPU instead.
    let o = options(&source, &[]);
    let loader = Loader::with_device_backend(&o, without.clone()).unwrap();
    assert_eq!(loader.stats().gpu_decode_share, 0.0);
}

#[test]
fn the_decode_scratch_and_the_decoders_buffers_are_device_memory_the_loader_counts() {
    let source = shard("gpu-decode-memory", 12);
    let fake = FakeDevice::new(0).unwrap();
    let mut dev =
        Loader::with_device_backend(&options(&source, &[("jpeg_decoder", "gpu")]), fake.clone())
            .unwrap();
    let batch = dev.next().unwrap().unwrap();
    batch.synchronize().unwrap();
    let held = dev.stats().device_memory_bytes;
    let scratch = stoker_core::DEVICE_DECODE_SCRATCH as u64;
    let decoder = stoker_core::cuda::FAKE_DECODER_BYTES;
    assert!(
        held >= scratch + decoder,
        "{held} bytes held; the scratch alone is {scratch}, the decoder's buffers {decoder}"
    );
    // Once the prefetch thread stopped, what is left is the buffer of the batch still held: the
    // scratch and the decoder's buffers went with the loader.
    let stats = dev.stats_handle();
    drop(dev);
    let left = stats.snapshot().device_memory_bytes;
    assert_eq!(left, fake.counters().live_bytes);
    assert!(left > 0 && left < scratch, "{left}");
    drop(batch);
    assert_eq!(fake.counters().live_bytes, 0);
}

#[test]
fn the_decoders_device_memory_counts_against_what_the_budget_lets_the_ring_grow_by() {
    // Device batches of about 6 MiB (with room for the taps), more than the fake decoder's
    // 3 MiB of buffers: once the decoder holds them, the ring may grow by one buffer fewer. The
    // budget holds the host batches in flight, the 256 MiB scratch and a few device buffers.
    let source = shard("gpu-decode-budget", 60);
    let budget = ((256 + 16 + 5 * 6) << 20).to_string();
    let held_at_most = |share: &str| -> usize {
        let fake = FakeDevice::new(0).unwrap();
        let o = options(
            &source,
            &[
                ("gpu_decode_share", share),
                ("transform", "random_resized_crop(512) | hflip"),
                ("num_workers", "1"),
                ("prefetch_factor", "1"),
                ("memory_budget", &budget),
            ],
        );
        let mut loader = Loader::with_device_backend(&o, fake.clone()).unwrap();
        let mut held = Vec::new();
        loop {
            match loader.next() {
                Ok(Some(batch)) => held.push(batch),
                Ok(None) => panic!("the budget let the ring grow past the epoch"),
                Err(e) => {
                    assert!(e.to_string().contains("memory_budget"), "{e}");
                    assert_eq!(fake.counters().jpegs_decoded > 0, share != "0");
                    return held.len();
                }
            }
        }
    };
    let (cpu, device) = (held_at_most("0"), held_at_most("1"));
    assert!(cpu >= 4, "{cpu} device batches held with the CPU decoding");
    assert_eq!(
        device,
        cpu - 1,
        "the decoder's buffers take one device buffer"
    );
}
