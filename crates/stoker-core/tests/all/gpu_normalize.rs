//! `gpu_normalize` against the fake device: image fields cross as uint8 and are cast on the
//! device by the CPU path's table, so device batches hold the very bytes host batches do, for
//! every float type and layout, encoded and tensor images, indexed and streamed sources. The fake
//! runs the kernel's host reference in stream order; the kernel itself runs in `cuda_gpu.rs`.

use std::sync::Arc;

use stoker_core::testing::FakeDevice;
use stoker_core::{Batch, DType, ErrorKind, Loader, LoaderOptions, MemorySource, SourceSpec};

use crate::support::device_bytes;
use crate::support::files::{photo_shard, tmp};

const AUGMENT: &str = "random_resized_crop(24) | hflip | color_jitter(brightness=0.4, contrast=0.4, saturation=0.4) | \
                       normalize(imagenet)";

fn options(source: &str, kv: &[(&str, &str)]) -> LoaderOptions {
    let mut o = LoaderOptions::new();
    o.set("source", source).unwrap();
    for (k, v) in [("batch_size", "4"), ("seed", "11"), ("num_workers", "2")]
        .iter()
        .chain(kv)
    {
        o.set(k, v).unwrap_or_else(|e| panic!("{k}={v}: {e}"));
    }
    o
}

fn host_bytes(b: &Batch) -> Vec<Vec<u8>> {
    b.fields().map(|f| f.data.unwrap().to_vec()).collect()
}

/// What one run of [`same_as_cpu`] saw.
struct Run {
    /// The device loader's stats after it was dropped: every copy it queued has completed.
    stats: stoker_core::Stats,
    /// Bytes of each field of the first host batch (every batch has the same size here).
    field_bytes: Vec<(String, u64)>,
}

impl Run {
    fn bytes(&self, field: &str) -> u64 {
        self.field_bytes
            .iter()
            .find(|(name, _)| name == field)
            .map_or(0, |(_, b)| *b)
    }

    fn batch_bytes(&self) -> u64 {
        self.field_bytes.iter().map(|(_, b)| b).sum()
    }
}

/// Runs `epochs` epochs of `o` on the fake device and on the CPU side by side, asserting the
/// device batches hold the host batches' bytes with the same types and shapes. The prefetch
/// thread runs ahead into the next epoch, so what the device did is counted after the loader is
/// dropped, in whole batches.
fn same_as_cpu(fake: &Arc<FakeDevice>, o: &LoaderOptions, epochs: u64) -> Run {
    let mut dev = Loader::with_device_backend(o, fake.clone()).unwrap();
    let stats = dev.stats_handle();
    let mut cpu_options = o.clone();
    cpu_options.set("device", "cpu").unwrap();
    let mut cpu = Loader::new(&cpu_options).unwrap();
    let mut field_bytes = Vec::new();
    for epoch in 0..epochs {
        while let Some(h) = cpu.next().unwrap() {
            let d = dev
                .next()
                .unwrap()
                .expect("as many device batches as host ones");
            let at = format!("epoch {epoch} batch {}", h.position());
            let shapes = |b: &Batch| -> Vec<(String, DType, Vec<usize>)> {
                b.fields()
                    .map(|f| (f.name.to_string(), f.dtype, f.shape.to_vec()))
                    .collect()
            };
            assert_eq!(shapes(&d), shapes(&h), "{at}");
            assert!(
                device_bytes(fake, &d) == host_bytes(&h),
                "{at}: the device batch differs from the host batch"
            );
            if field_bytes.is_empty() {
                field_bytes = h
                    .fields()
                    .map(|f| (f.name.to_string(), f.data.unwrap().len() as u64))
                    .collect();
            }
        }
        assert!(dev.next().unwrap().is_none(), "end of epoch {epoch}");
    }
    drop(dev);
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
    let stats = stats.snapshot();
    assert_eq!(
        stats.h2d_bytes,
        fake.counters().bytes_copied,
        "h2d_bytes counts what the device copied"
    );
    Run { stats, field_bytes }
}

#[test]
fn device_batches_are_the_cpu_batches_bit_for_bit_in_every_float_type_and_layout() {
    let dir = tmp("gpu-normalize-types");
    let shard = photo_shard(&dir, 12);
    for (dtype, layout) in [
        ("float32", "nchw"),
        ("bfloat16", "nhwc"),
        ("float16", "nchw"),
    ] {
        let fake = FakeDevice::new(0).unwrap();
        let o = options(
            &shard,
            &[
                ("device", "cuda"),
                ("transform", AUGMENT),
                ("dtype", dtype),
                ("layout", layout),
                ("shuffle_buffer", "4"),
            ],
        );
        let run = same_as_cpu(&fake, &o, 2);
        // Three batches of 4 an epoch, the image field of each cast once (the prefetch thread
        // may have run ahead into a third epoch).
        let casts = fake.counters().casts_done;
        assert!(casts >= 6, "{dtype} {layout}: {casts} casts");
        // What crossed per batch: the uint8 images, their table, the other fields as they are.
        let element = if dtype == "float32" { 4 } else { 2 };
        let image = run.bytes("image");
        assert_eq!(image, (4 * 3 * 24 * 24 * element) as u64);
        let per_batch =
            image / element as u64 + (3 * 256 * element) as u64 + run.batch_bytes() - image;
        assert_eq!(run.stats.h2d_bytes, casts * per_batch, "{dtype} {layout}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tensor_images_of_an_indexed_source_are_cast_too() {
    // RGB uint8 tensors [H, W, 3], delivered float32 NCHW normalized: no decode, the tensor
    // pipeline's twin writes uint8.
    let (n, h, w) = (8, 6, 5);
    let pixels: Vec<u8> = (0..n * h * w * 3).map(|i| (i * 37 % 251) as u8).collect();
    let source = MemorySource::new()
        .with_tensor("image", DType::U8, &[h, w, 3], pixels)
        .unwrap()
        .with_tensor(
            "label",
            DType::I64,
            &[],
            (0..n as i64).flat_map(i64::to_ne_bytes).collect(),
        )
        .unwrap();
    let mut o = LoaderOptions::new().with_source(SourceSpec::Custom(Arc::new(source)));
    for (k, v) in [
        ("batch_size", "4"),
        ("shuffle", "true"),
        ("device", "cuda"),
        ("transform", "hflip | normalize(mean=0.5, std=0.25)"),
    ] {
        o.set(k, v).unwrap();
    }
    let fake = FakeDevice::new(0).unwrap();
    let run = same_as_cpu(&fake, &o, 2);
    assert_eq!(run.bytes("image"), (4 * 3 * h * w * 4) as u64);
    assert!(fake.counters().casts_done >= 4);
}

#[test]
fn a_transform_that_is_no_table_lookup_converts_on_the_cpu_unless_gpu_normalize_insists() {
    let dir = tmp("gpu-normalize-refused");
    let shard = photo_shard(&dir, 6);
    let erasing = "random_resized_crop(16) | normalize(imagenet) | random_erasing(p=1, value=0)";
    let mixing = "random_resized_crop(16) | normalize(imagenet) | mixup(alpha=0.4, num_classes=3)";
    let cases = [
        (erasing, "random_erasing"),
        (mixing, "mixup"),
        ("random_resized_crop(16)", "uint8 already"),
    ];
    for (spec, why) in cases {
        let fake = FakeDevice::new(0).unwrap();
        let o = options(&shard, &[("device", "cuda"), ("transform", spec)]);
        same_as_cpu(&fake, &o, 1);
        assert_eq!(fake.counters().casts_done, 0, "{spec}");

        let mut insisted = o.clone();
        insisted.set("gpu_normalize", "true").unwrap();
        let e = Loader::with_device_backend(&insisted, fake.clone())
            .err()
            .unwrap();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        let text = e.to_string();
        assert!(
            text.contains("gpu_normalize") && text.contains("`image`") && text.contains(why),
            "{text}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn gpu_normalize_false_copies_floats_and_true_needs_a_device() {
    let dir = tmp("gpu-normalize-off");
    let shard = photo_shard(&dir, 8);
    let on = options(&shard, &[("device", "cuda"), ("transform", AUGMENT)]);
    let mut off = on.clone();
    off.set("gpu_normalize", "false").unwrap();
    let fake = FakeDevice::new(0).unwrap();
    let run = same_as_cpu(&fake, &off, 1);
    let counters = fake.counters();
    assert_eq!(counters.casts_done, 0);
    let batches = counters.bytes_copied / run.batch_bytes();
    assert!(batches >= 2);
    assert_eq!(
        counters.bytes_copied,
        batches * run.batch_bytes(),
        "whole batches crossed as the host holds them"
    );
    let fake = FakeDevice::new(0).unwrap();
    same_as_cpu(&fake, &on, 1);
    let counters = fake.counters();
    // The uint8 image is a quarter of the float32 one; its table (3 KB) crosses beside it.
    let image = run.bytes("image");
    assert_eq!(
        counters.bytes_copied,
        counters.casts_done * (run.batch_bytes() - image + image / 4 + 3 * 256 * 4)
    );

    let mut cpu = on.clone();
    cpu.set("device", "cpu").unwrap();
    cpu.set("gpu_normalize", "true").unwrap();
    let e = Loader::new(&cpu).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(e.to_string().contains("device=cuda"), "{e}");
    cpu.set("gpu_normalize", "false").unwrap();
    assert!(Loader::new(&cpu).is_ok(), "false is fine anywhere");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn device_memory_bytes_is_the_ring_with_its_staging_and_returns_to_zero() {
    let dir = tmp("gpu-normalize-memory");
    let shard = photo_shard(&dir, 12);
    let fake = FakeDevice::new(0).unwrap();
    let o = options(&shard, &[("device", "cuda"), ("transform", AUGMENT)]);
    let mut loader = Loader::with_device_backend(&o, fake.clone()).unwrap();
    let stats = loader.stats_handle();
    let mut held = Vec::new();
    while let Some(b) = loader.next().unwrap() {
        held.push(b);
    }
    assert!(stats.snapshot().device_memory_bytes > 0);
    // The prefetch thread runs ahead, so the two counts are compared once it has stopped: what
    // is left is the buffers of the batches still held.
    drop(loader);
    let left = stats.snapshot().device_memory_bytes;
    assert_eq!(
        left,
        fake.counters().live_bytes,
        "the ring's buffers are all the device memory the loader holds"
    );
    // Each buffer holds a float32 batch, its uint8 input and its table.
    let per_batch = (4 * 3 * 24 * 24 * (4 + 1) + 3 * 256 * 4) as u64;
    assert!(left >= held.len() as u64 * per_batch);
    drop(held);
    assert_eq!(fake.counters().live_bytes, 0);
    assert_eq!(stats.snapshot().device_memory_bytes, 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An in-memory source of `n` samples: `image`, `stored` shape of uint8 or uint16, and an
/// int64 `label`; pixel values follow a fixed pattern.
fn tensor_source(n: usize, stored: &[usize], dtype: DType, kv: &[(&str, &str)]) -> LoaderOptions {
    let elements = n * stored.iter().product::<usize>();
    let pixels: Vec<u8> = match dtype {
        DType::U16 => (0..elements)
            .flat_map(|i| ((i * 977 % 65_521) as u16).to_ne_bytes())
            .collect(),
        _ => (0..elements).map(|i| (i * 37 % 251) as u8).collect(),
    };
    let labels = (0..n as i64).flat_map(i64::to_ne_bytes).collect();
    let source = MemorySource::new()
        .with_tensor("image", dtype, stored, pixels)
        .unwrap()
        .with_tensor("label", DType::I64, &[], labels)
        .unwrap();
    let mut o = LoaderOptions::new().with_source(SourceSpec::Custom(Arc::new(source)));
    for (k, v) in [("batch_size", "4"), ("shuffle", "true"), ("device", "cuda")]
        .iter()
        .chain(kv)
    {
        o.set(k, v).unwrap_or_else(|e| panic!("{k}={v}: {e}"));
    }
    o
}

#[test]
fn uint8_images_of_any_channel_count_are_cast_with_a_table_per_channel() {
    // Five bands, as a multispectral stack: the plane-by-plane pipeline's uint8 twin and a
    // table of 5 x 256 entries.
    let spec = "random_resized_crop(6) | hflip | normalize(mean=0.1,0.2,0.3,0.4,0.5, std=0.2)";
    for (dtype, layout) in [("float32", "nchw"), ("bfloat16", "nhwc")] {
        let o = tensor_source(
            8,
            &[9, 7, 5],
            DType::U8,
            &[
                ("transform", spec),
                ("dtype", dtype),
                ("layout", layout),
                ("input_layout", "hwc"),
            ],
        );
        let fake = FakeDevice::new(0).unwrap();
        let run = same_as_cpu(&fake, &o, 2);
        let element = if dtype == "float32" { 4 } else { 2 };
        assert_eq!(run.bytes("image"), (4 * 5 * 6 * 6 * element) as u64);
        let c = fake.counters();
        assert!(
            c.casts_done >= 4,
            "{dtype} {layout}: {} casts",
            c.casts_done
        );
        let per_batch = 4 * 5 * 6 * 6 + 5 * 256 * element + 4 * 8;
        assert_eq!(
            c.bytes_copied,
            c.casts_done * per_batch as u64,
            "{dtype} {layout}"
        );
    }
}

#[test]
fn a_dense_task_casts_its_image_and_moves_its_mask_as_it_is() {
    // RGB uint8 with a mask under one draw: the image is cast, the int64 mask copied.
    let (n, s) = (8, 12);
    let pixels: Vec<u8> = (0..n * s * s * 3).map(|i| (i * 31 % 256) as u8).collect();
    let mask: Vec<u8> = (0..n * s * s).map(|i| (i % 5) as u8).collect();
    let source = MemorySource::new()
        .with_tensor("image", DType::U8, &[s, s, 3], pixels)
        .unwrap()
        .with_tensor("mask", DType::U8, &[s, s], mask)
        .unwrap();
    let mut o = LoaderOptions::new().with_source(SourceSpec::Custom(Arc::new(source)));
    let spec =
        "fields(image=image, mask=mask) | random_resized_crop(8) | hflip | normalize(imagenet)";
    for (k, v) in [("batch_size", "4"), ("device", "cuda"), ("transform", spec)] {
        o.set(k, v).unwrap();
    }
    let fake = FakeDevice::new(0).unwrap();
    let run = same_as_cpu(&fake, &o, 2);
    assert_eq!(run.bytes("mask"), 4 * 8 * 8, "uint8 labels, as stored");
    let c = fake.counters();
    assert!(c.casts_done >= 4);
    let per_batch = run.batch_bytes() - run.bytes("image") + run.bytes("image") / 4 + 3 * 256 * 4;
    assert_eq!(c.bytes_copied, c.casts_done * per_batch);
}

#[test]
fn a_uint16_image_is_no_table_of_bytes_and_converts_on_the_cpu() {
    let spec = "random_resized_crop(6) | normalize(mean=1000, std=500)";
    let o = tensor_source(
        8,
        &[9, 7, 2],
        DType::U16,
        &[("transform", spec), ("input_layout", "hwc")],
    );
    let fake = FakeDevice::new(0).unwrap();
    same_as_cpu(&fake, &o, 1);
    assert_eq!(fake.counters().casts_done, 0);
    let mut insisted = o.clone();
    insisted.set("gpu_normalize", "true").unwrap();
    let e = Loader::with_device_backend(&insisted, fake.clone())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("uint16") && e.contains("`image`"), "{e}");
}
