//! stoker's packed format: `pack` then `source=packed:PATH`. Round trips of every field kind
//! and image mode, deterministic bytes, sharded and sliced packing joined by `merge`, the
//! loader's samplers, resume and `on_error` over packed data, and bad input (magic, version,
//! truncation, checksum, index mismatch, a corrupt sample).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use stoker_core::decode::{decode_rgb, dimensions, raw_pixels, DecodeBuffers};
use stoker_core::pack::{merge, pack, PackMode, PackOptions};
use stoker_core::source::packed::{format, PackedFile, PackedSource};
use stoker_core::source::{MemorySource, Source};
use stoker_core::{Batch, DType, Error, Loader, LoaderOptions, SourceSpec};

use crate::support::files::tmp;

/// The names of the files in `dir`.
fn file_names(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// A `w × h` JPEG of a smooth pattern that differs per `seed`.
fn jpeg(w: u16, h: u16, seed: usize) -> Vec<u8> {
    let mut px = Vec::with_capacity(w as usize * h as usize * 3);
    for y in 0..h as usize {
        for x in 0..w as usize {
            px.extend_from_slice(&[
                (x * 4 + seed * 13) as u8,
                (y * 3 + seed * 7) as u8,
                ((x + y) * 2 + seed) as u8,
            ]);
        }
    }
    let mut out = Vec::new();
    jpeg_encoder::Encoder::new(&mut out, 90)
        .encode(&px, w, h, jpeg_encoder::ColorType::Rgb)
        .unwrap();
    out
}

/// `n` samples: an image (sizes vary, some over 48 pixels a side), an int64 label and a
/// caption of varying length.
fn dataset(n: usize) -> Arc<dyn Source> {
    let images = (0..n)
        .map(|i| jpeg(24 + (i % 5) as u16 * 11, 20 + (i % 3) as u16 * 17, i))
        .collect();
    let labels = (0..n as i64).flat_map(|i| (i * 10).to_ne_bytes()).collect();
    let captions = (0..n)
        .map(|i| vec![b'a' + (i % 26) as u8; 1 + i % 7])
        .collect();
    Arc::new(
        MemorySource::new()
            .with_encoded_images("image", images)
            .unwrap()
            .with_tensor("label", DType::I64, &[], labels)
            .unwrap()
            .with_ragged("caption", DType::U8, &[], captions)
            .unwrap(),
    )
}

fn small_pages() -> PackOptions {
    PackOptions {
        page_size: 4096,
        ..PackOptions::default()
    }
}

fn no_progress(_: u64, _: u64) {}

/// Each component's sampling factors (horizontal << 4 | vertical) in a baseline JPEG's frame
/// header.
fn sampling_factors(jpeg: &[u8]) -> Vec<u8> {
    let sof = jpeg
        .windows(2)
        .position(|m| m == [0xFF, 0xC0])
        .expect("a baseline frame header");
    let components = jpeg[sof + 9] as usize;
    (0..components).map(|k| jpeg[sof + 11 + 3 * k]).collect()
}

/// Every field of every sample, as owned bytes.
fn all_samples(source: &dyn Source) -> Vec<Vec<Vec<u8>>> {
    let mut buf = Vec::new();
    (0..source.len())
        .map(|i| {
            let s = source.read(i, &mut buf).unwrap();
            (0..source.fields().len())
                .map(|f| s.get(f).to_vec())
                .collect()
        })
        .collect()
}

#[test]
fn jpeg_mode_keeps_every_field_and_records_image_sizes() {
    let dir = tmp("roundtrip");
    let src = dataset(23);
    let out = dir.join("d.stkpack");
    let report = pack(&*src, &out, &small_pages(), &no_progress).unwrap();
    assert_eq!((report.samples, report.files.len()), (23, 1));
    let packed = PackedSource::open(out.to_str().unwrap()).unwrap();
    assert_eq!(packed.fields(), src.fields());
    assert_eq!(all_samples(&packed), all_samples(&*src));
    let mut buf = Vec::new();
    for i in 0..packed.len() {
        let d = dimensions(packed.read(i, &mut buf).unwrap().get(0)).unwrap();
        assert_eq!(
            packed.image_size(i, 0),
            (d.width as u32, d.height as u32),
            "{i}"
        );
    }
    // The data region starts on a page and the file is exactly as long as the header says.
    let file = PackedFile::open(&out).unwrap();
    assert_eq!(file.header().data_offset % 4096, 0);
}

#[test]
fn max_side_shrinks_and_raw_mode_stores_the_decoded_pixels() {
    let dir = tmp("modes");
    let src = dataset(15);
    let raw = dir.join("raw.stkpack");
    let opts = PackOptions {
        mode: PackMode::Raw,
        ..small_pages()
    };
    pack(&*src, &raw, &opts, &no_progress).unwrap();
    let packed = PackedSource::open(raw.to_str().unwrap()).unwrap();
    let (mut buf, mut a, mut b) = (Vec::new(), Vec::new(), DecodeBuffers::default());
    for i in 0..src.len() {
        let original = src.read(i, &mut a).unwrap().get(0).to_vec();
        let dims = decode_rgb(&original, u64::MAX, &mut b).unwrap();
        let stored = packed.read(i, &mut buf).unwrap().get(0);
        let (got, pixels) = raw_pixels(stored, u64::MAX).unwrap().unwrap();
        assert_eq!(got, dims);
        assert_eq!(
            pixels,
            &b.rgb[..],
            "sample {i}: raw pixels are the decoded image"
        );
    }

    let small = dir.join("small.stkpack");
    let opts = PackOptions {
        max_side: Some(32),
        quality: 85,
        ..small_pages()
    };
    pack(&*src, &small, &opts, &no_progress).unwrap();
    let packed = PackedSource::open(small.to_str().unwrap()).unwrap();
    for i in 0..packed.len() {
        let (w, h) = packed.image_size(i, 0);
        let d = dimensions(packed.read(i, &mut buf).unwrap().get(0)).unwrap();
        assert_eq!((w, h), (d.width as u32, d.height as u32));
        assert!(w.max(h) <= 32, "sample {i} is {w}x{h}");
        let o = dimensions(src.read(i, &mut a).unwrap().get(0)).unwrap();
        if o.width.max(o.height) <= 32 {
            assert_eq!(
                packed.read(i, &mut buf).unwrap().get(0),
                src.read(i, &mut a).unwrap().get(0),
                "an image within max_side is kept as it is"
            );
        }
    }

    // Re-encoded images are 4:2:0 JPEGs, as Pillow, OpenCV and FFCV's writer store them, and
    // decode close to the shrunk pixels themselves (what `raw` stores at the same max_side).
    let small_raw = dir.join("small-raw.stkpack");
    let raw_opts = PackOptions {
        mode: PackMode::Raw,
        ..opts
    };
    pack(&*src, &small_raw, &raw_opts, &no_progress).unwrap();
    let exact = PackedSource::open(small_raw.to_str().unwrap()).unwrap();
    let (mut shrunk, mut errors) = (Vec::new(), Vec::new());
    for i in 0..packed.len() {
        let stored = packed.read(i, &mut buf).unwrap().get(0).to_vec();
        if stored == src.read(i, &mut a).unwrap().get(0) {
            continue; // kept as it was
        }
        assert_eq!(
            sampling_factors(&stored),
            [0x22, 0x11, 0x11],
            "sample {i}: luma 2x2, chroma 1x1"
        );
        decode_rgb(&stored, u64::MAX, &mut b).unwrap();
        let (_, pixels) = raw_pixels(exact.read(i, &mut shrunk).unwrap().get(0), u64::MAX)
            .unwrap()
            .unwrap();
        let total: u64 = b
            .rgb
            .iter()
            .zip(pixels)
            .map(|(x, y)| x.abs_diff(*y) as u64)
            .sum();
        errors.push(total as f64 / pixels.len() as f64);
    }
    assert!(!errors.is_empty(), "some samples are shrunk");
    let worst = errors.iter().cloned().fold(0.0, f64::max);
    assert!(worst < 8.0, "mean absolute error per sample: {errors:?}");

    // smart: raw when small enough, JPEG otherwise.
    let big = Arc::new(
        MemorySource::new()
            .with_encoded_images("image", vec![jpeg(16, 16, 1), jpeg(300, 260, 2)])
            .unwrap(),
    );
    let smart = dir.join("smart.stkpack");
    let opts = PackOptions {
        mode: PackMode::Smart,
        ..small_pages()
    };
    pack(&*big, &smart, &opts, &no_progress).unwrap();
    let packed = PackedSource::open(smart.to_str().unwrap()).unwrap();
    assert!(raw_pixels(packed.read(0, &mut buf).unwrap().get(0), u64::MAX).is_some());
    assert_eq!(
        packed.read(1, &mut buf).unwrap().get(0),
        big.read(1, &mut a).unwrap().get(0)
    );
}

fn loader(spec: &str, kv: &[(&str, &str)]) -> Result<Loader, Error> {
    let mut o = LoaderOptions::new();
    o.set("source", spec)?;
    for (k, v) in kv {
        o.set(k, v)?;
    }
    Loader::new(&o)
}

fn epoch(l: &mut Loader) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(b) = l.next().unwrap() {
        out.push(bytes_of(&b));
    }
    out
}

fn bytes_of(b: &Batch) -> Vec<u8> {
    b.fields().flat_map(|f| f.data.unwrap().to_vec()).collect()
}

#[test]
fn raw_and_jpeg_packs_give_the_same_batches_as_the_original_images() {
    let dir = tmp("batches");
    let src = dataset(20);
    let kept = dir.join("kept.stkpack");
    pack(&*src, &kept, &small_pages(), &no_progress).unwrap();
    let raw = dir.join("raw.stkpack");
    let opts = PackOptions {
        mode: PackMode::Raw,
        ..small_pages()
    };
    pack(&*src, &raw, &opts, &no_progress).unwrap();
    let kv = [
        ("batch_size", "4"),
        ("shuffle", "true"),
        ("seed", "7"),
        ("num_workers", "2"),
        ("pad", "0"),
        (
            "transform",
            "random_resized_crop(16) | hflip | normalize(imagenet)",
        ),
    ];
    let mut a = loader(&format!("packed:{}", kept.display()), &kv).unwrap();
    let mut b = loader(&format!("packed:{}", raw.display()), &kv).unwrap();
    let mut batches = 0;
    while let Some(ba) = a.next().unwrap() {
        let bb = b.next().unwrap().expect("as many batches");
        batches += 1;
        for (fa, fb) in ba.fields().zip(bb.fields()) {
            let (da, db) = (fa.data.unwrap(), fb.data.unwrap());
            if fa.name != "image" {
                assert_eq!(da, db, "field {}", fa.name);
                continue;
            }
            // The kept JPEGs are decoded for the crop (only its region, shrunk in the DCT
            // domain when the crop is at least twice the output); the raw pack holds whole
            // decodes. The same crops and flips; pixels within 1 level on average and 12 at
            // most on these small synthetic images (sharp-edged, 24-68 pixels wide), in
            // levels of 1/255 divided by the smallest std (0.225).
            let floats = |d: &[u8]| -> Vec<f32> {
                d.chunks_exact(4)
                    .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
                    .collect()
            };
            let diffs: Vec<f32> = floats(da)
                .iter()
                .zip(floats(db))
                .map(|(x, y)| (x - y).abs() * 0.225 * 255.0)
                .collect();
            let worst = diffs.iter().copied().fold(0f32, f32::max);
            let mean = diffs.iter().sum::<f32>() / diffs.len() as f32;
            assert!(
                mean <= 1.0 && worst <= 12.0,
                "pixels differ by {mean} on average, {worst} at most"
            );
        }
    }
    assert_eq!(batches, 5);
    assert!(b.next().unwrap().is_none());

    // Resume mid-epoch gives the rest of the epoch.
    let eb = epoch(&mut loader(&format!("packed:{}", raw.display()), &kv).unwrap());
    let mut l = loader(&format!("packed:{}", raw.display()), &kv).unwrap();
    let first: Vec<Vec<u8>> = (0..2)
        .map(|_| bytes_of(&l.next().unwrap().unwrap()))
        .collect();
    let state = l.save_state();
    let mut kv2 = kv.to_vec();
    kv2.push(("resume_state", &state));
    let mut resumed = loader(&format!("packed:{}", raw.display()), &kv2).unwrap();
    let mut got = first;
    got.extend(epoch(&mut resumed));
    assert_eq!(got, eb);
}

#[test]
fn packing_is_deterministic_and_slices_merge_into_the_same_dataset() {
    let dir = tmp("determinism");
    let src = dataset(41);
    let opts = PackOptions {
        max_side: Some(30),
        ..small_pages()
    };
    let (a, b) = (dir.join("a.stkpack"), dir.join("b.stkpack"));
    pack(&*src, &a, &opts, &no_progress).unwrap();
    pack(&*src, &b, &opts, &no_progress).unwrap();
    assert_eq!(fs::read(&a).unwrap(), fs::read(&b).unwrap());
    let whole = all_samples(&PackedSource::open(a.to_str().unwrap()).unwrap());

    // Three slices, each split into shards of at most ~4 KiB of data, then merged.
    let sliced = dir.join("sliced");
    for i in 0..3 {
        let opts = PackOptions {
            shard_size: Some(4096),
            slice: Some((i, 3)),
            ..opts.clone()
        };
        let report = pack(&*src, &sliced, &opts, &no_progress).unwrap();
        assert!(report.index.is_none(), "a slice does not write the index");
    }
    let e = PackedSource::open(sliced.to_str().unwrap()).err().unwrap();
    assert!(e.to_string().contains("--merge"), "{e}");
    merge(&sliced).unwrap();
    let merged = PackedSource::open(sliced.to_str().unwrap()).unwrap();
    assert!(merged.shards().len() > 3, "shard_size split the slices");
    assert_eq!(all_samples(&merged), whole);

    // One sharded pack writes its index itself; a pattern of shards reads the same.
    let sharded = dir.join("sharded");
    let opts2 = PackOptions {
        shard_size: Some(4096),
        ..opts.clone()
    };
    let report = pack(&*src, &sharded, &opts2, &no_progress).unwrap();
    assert!(report.index.is_some());
    assert_eq!(
        all_samples(&PackedSource::open(sharded.to_str().unwrap()).unwrap()),
        whole
    );
    let pattern = format!("{}/part-00000-of-00001-*.stkpack", sharded.display());
    assert_eq!(all_samples(&PackedSource::open(&pattern).unwrap()), whole);

    // A missing slice is named.
    let partial = dir.join("partial");
    let opts3 = PackOptions {
        slice: Some((1, 3)),
        ..opts
    };
    pack(&*src, &partial, &opts3, &no_progress).unwrap();
    let e = merge(&partial).err().unwrap().to_string();
    assert!(e.contains("[0, 2]") && e.contains("missing"), "{e}");
}

/// A slice whose pack fails leaves none of its shards, and one whose pack was stopped (its
/// shards there, its record not) is refused by a merge: indexing its shards read 20 samples of
/// 46 as if they were the dataset.
#[test]
fn a_merge_refuses_a_slice_that_did_not_finish() {
    let dir = tmp("unfinished");
    let mut images: Vec<Vec<u8>> = (0..24).map(|i| jpeg(24, 20, i)).collect();
    images[20] = b"not an image".to_vec();
    let bad: Arc<dyn Source> = Arc::new(
        MemorySource::new()
            .with_encoded_images("image", images)
            .unwrap(),
    );
    let opts = |slice| PackOptions {
        shard_size: Some(2000),
        slice: Some((slice, 2)),
        ..small_pages()
    };
    let out = dir.join("sliced");
    pack(&*bad, &out, &opts(0), &no_progress).unwrap();
    let e = pack(&*bad, &out, &opts(1), &no_progress).err().unwrap();
    assert!(e.to_string().contains("sample 20"), "{e}");
    let left: Vec<String> = file_names(&out)
        .into_iter()
        .filter(|name| name.starts_with("part-00001"))
        .collect();
    assert!(
        left.is_empty(),
        "the failed slice's shards are gone: {left:?}"
    );
    let e = merge(&out).err().unwrap().to_string();
    assert!(e.contains("[1]") && e.contains("missing"), "{e}");

    // Stopped after its shards were written, before its record: the shards are not the slice.
    let good = dataset(24);
    let out = dir.join("stopped");
    for slice in 0..2 {
        pack(&*good, &out, &opts(slice), &no_progress).unwrap();
    }
    fs::remove_file(out.join("part-00001-of-00002.done")).unwrap();
    let e = merge(&out).err().unwrap().to_string();
    assert!(
        e.contains("slice 1 of 2 did not finish") && e.contains("--shard-index 1 --num-shards 2"),
        "{e}"
    );
    // A shard lost since: the record says how many there were.
    pack(&*good, &out, &opts(1), &no_progress).unwrap();
    merge(&out).unwrap();
    fs::remove_file(out.join("part-00000-of-00002-00001.stkpack")).unwrap();
    let e = merge(&out).err().unwrap().to_string();
    assert!(
        e.contains("slice 0 of 2 wrote") && e.contains("are here"),
        "{e}"
    );

    // The output path's directory must exist, and is named, not the temporary file.
    let e = pack(
        &*good,
        &dir.join("no/such/d.stkpack"),
        &small_pages(),
        &no_progress,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("no/such/d.stkpack: cannot be created: its directory does not exist"),
        "{e}"
    );
}

/// Packs a small dataset and returns the file.
fn packed_file(dir: &Path) -> PathBuf {
    let out = dir.join("d.stkpack");
    pack(&*dataset(6), &out, &small_pages(), &no_progress).unwrap();
    out
}

fn open_err(path: &Path) -> String {
    PackedSource::open(path.to_str().unwrap())
        .err()
        .unwrap()
        .to_string()
}

#[test]
fn bad_files_are_refused_at_open_naming_the_file_and_what_differs() {
    let dir = tmp("bad");
    let good = packed_file(&dir);
    let bytes = fs::read(&good).unwrap();
    let name = good.display().to_string();

    let mut magic = bytes.clone();
    magic[0] = b'X';
    fs::write(&good, &magic).unwrap();
    let e = open_err(&good);
    assert!(e.contains(&name) && e.contains("magic"), "{e}");

    let mut version = bytes.clone();
    version[8] = 9;
    fs::write(&good, &version).unwrap();
    let e = open_err(&good);
    assert!(e.contains(&name) && e.contains("version 9"), "{e}");

    fs::write(&good, &bytes[..bytes.len() - 10]).unwrap();
    let e = open_err(&good);
    assert!(e.contains(&name) && e.contains("truncated"), "{e}");
    fs::write(&good, &bytes[..30]).unwrap();
    let e = open_err(&good);
    assert!(e.contains(&name) && e.contains("truncated"), "{e}");

    // A flipped bit in the metadata table.
    let mut table = bytes.clone();
    let at = table.len() - 5;
    table[at] ^= 1;
    fs::write(&good, &table).unwrap();
    let e = open_err(&good);
    assert!(e.contains(&name) && e.contains("checksum mismatch"), "{e}");

    // An index that no longer matches its shard.
    fs::write(&good, &bytes).unwrap();
    let set = dir.join("set");
    let opts = PackOptions {
        shard_size: Some(1 << 20),
        ..small_pages()
    };
    pack(&*dataset(6), &set, &opts, &no_progress).unwrap();
    let shard = set.join("part-00000-of-00001-00000.stkpack");
    pack(&*dataset(5), &shard, &small_pages(), &no_progress).unwrap();
    let e = open_err(&set);
    assert!(
        e.contains("part-00000-of-00001-00000.stkpack")
            && e.contains("does not match the dataset index"),
        "{e}"
    );
}

#[test]
fn a_corrupt_sample_is_that_samples_error_or_skipped() {
    let dir = tmp("corrupt");
    let out = packed_file(&dir);
    let file = PackedFile::open(&out).unwrap();
    let entry = file.entry(3, 0);
    drop(file);
    let mut bytes = fs::read(&out).unwrap();
    bytes[entry.offset as usize + 40] ^= 0xFF;
    fs::write(&out, &bytes).unwrap();

    let spec = format!("packed:{}", out.display());
    let kv = [
        ("batch_size", "6"),
        ("pad", "0"),
        ("transform", "resize(8) | center_crop(8)"),
    ];
    let mut l = loader(&spec, &kv).unwrap();
    let e = l.next().err().unwrap().to_string();
    assert!(
        e.contains("sample 3") && e.contains("corrupt") && e.contains("d.stkpack"),
        "{e}"
    );

    let mut kv2 = kv.to_vec();
    kv2.push(("on_error", "skip"));
    let mut l = loader(&spec, &kv2).unwrap();
    let b = l.next().unwrap().unwrap();
    assert_eq!((b.len(), b.skipped()), (6, 1));
}

/// Rewrites the stored width of image field 0 of sample `i` and the file's checksum: a table
/// that is internally consistent but wrong about the image.
fn forge_stored_width(path: &Path, i: usize, width: u32) {
    let mut bytes = fs::read(path).unwrap();
    let header = format::Header::decode(&bytes).unwrap();
    let at = header.table_offset as usize + i * header.num_fields as usize * format::ENTRY_BYTES;
    let mut entry = format::Entry::decode(&bytes[at..], 0);
    entry.width = width;
    let mut encoded = Vec::new();
    entry.encode(&mut encoded);
    bytes[at..at + format::ENTRY_BYTES].copy_from_slice(&encoded);
    let schema_end = format::HEADER_BYTES + header.schema_len as usize;
    let table = &bytes[header.table_offset as usize..];
    let sum = format::checksum(&header, &bytes[format::HEADER_BYTES..schema_end], table);
    let fixed = format::Header {
        checksum: sum,
        ..header
    };
    bytes[..format::HEADER_BYTES].copy_from_slice(&fixed.encode());
    fs::write(path, &bytes).unwrap();
}

#[test]
fn crops_are_planned_from_the_stored_size_which_decoding_checks() {
    let dir = tmp("stored_size");
    let out = packed_file(&dir);
    let spec = format!("packed:{}", out.display());
    let file = PackedFile::open(&out).unwrap();
    let real = file.entry(2, 0);
    drop(file);
    let decoders: &[&str] = if stoker_core::decode::turbo_available() {
        &["turbo", "zune"]
    } else {
        &["zune"]
    };
    for &decoder in decoders {
        let kv = [
            ("batch_size", "6"),
            ("pad", "0"),
            ("seed", "3"),
            ("transform", "random_resized_crop(16) | hflip"),
            ("jpeg_decoder", decoder),
        ];
        // Planned from the table, the crops are those planned from the JPEGs' own headers.
        let mut o = LoaderOptions::new().with_source(SourceSpec::Custom(dataset(6)));
        for (k, v) in kv {
            o.set(k, v).unwrap();
        }
        let from_headers = epoch(&mut Loader::new(&o).unwrap());
        assert_eq!(
            epoch(&mut loader(&spec, &kv).unwrap()),
            from_headers,
            "{decoder}"
        );
        // A table that is wrong about an image's size makes that sample's error, not a
        // crop of the wrong pixels.
        forge_stored_width(&out, 2, real.width + 8);
        let e = loader(&spec, &kv)
            .unwrap()
            .next()
            .err()
            .unwrap()
            .to_string();
        let expected = format!(
            "the image is {}x{}, not the {}x{}",
            real.width,
            real.height,
            real.width + 8,
            real.height
        );
        assert!(
            e.contains("sample 2") && e.contains("d.stkpack") && e.contains(&expected),
            "{decoder}: {e}"
        );
        forge_stored_width(&out, 2, real.width);
    }
}

fn labels(b: &Batch) -> Vec<i64> {
    b.field_by_name("label")
        .unwrap()
        .data
        .unwrap()
        .chunks_exact(8)
        .map(|c| i64::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn quasi_random_order_covers_the_epoch_and_resumes() {
    let dir = tmp("quasi");
    let out = dir.join("d.stkpack");
    // Raw images of at most 20x20: a few samples per 4 KiB page, many pages.
    let opts = PackOptions {
        mode: PackMode::Raw,
        max_side: Some(20),
        ..small_pages()
    };
    pack(&*dataset(60), &out, &opts, &no_progress).unwrap();
    let spec = format!("packed:{}", out.display());
    let kv = [
        ("batch_size", "8"),
        ("shuffle", "true"),
        ("order", "quasi_random"),
        ("seed", "3"),
        ("pad", "0"),
        ("num_workers", "2"),
        ("transform", "resize(8) | center_crop(8)"),
    ];
    let run = |kv: &[(&str, &str)]| {
        let mut l = loader(&spec, kv).unwrap();
        let mut got = Vec::new();
        while let Some(b) = l.next().unwrap() {
            got.extend(labels(&b));
        }
        got
    };
    let order = run(&kv);
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..60).map(|i| i * 10).collect::<Vec<i64>>());
    assert_ne!(order, sorted, "shuffled");
    assert_eq!(order, run(&kv), "deterministic");

    let mut l = loader(&spec, &kv).unwrap();
    let mut got = labels(&l.next().unwrap().unwrap());
    let state = l.save_state();
    let mut kv2 = kv.to_vec();
    kv2.push(("resume_state", &state));
    let mut resumed = loader(&spec, &kv2).unwrap();
    while let Some(b) = resumed.next().unwrap() {
        got.extend(labels(&b));
    }
    assert_eq!(got, order, "resumed mid-epoch");

    // quasi_random shuffles, and needs page-organised data.
    let e = loader(
        &spec,
        &[
            ("order", "quasi_random"),
            ("pad", "0"),
            ("transform", "resize(8) | center_crop(8)"),
        ],
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("shuffle=true"), "{e}");
    let npy = dir.join("x.npy");
    stoker_core::source::write_npy(&npy, DType::U8, &[4, 2], &[0; 8]).unwrap();
    let e = loader(
        &format!("npy:{}", npy.display()),
        &[("order", "quasi_random"), ("shuffle", "true")],
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("packed"), "{e}");
}

#[test]
fn a_bad_source_sample_fails_the_pack_naming_it_and_leaves_no_file() {
    let dir = tmp("badsource");
    let mut images: Vec<Vec<u8>> = (0..300).map(|i| jpeg(20, 20, i)).collect();
    images[290] = b"not an image".to_vec();
    let src = Arc::new(
        MemorySource::new()
            .with_encoded_images("image", images)
            .unwrap(),
    );
    let e = pack(&*src, &dir.join("d.stkpack"), &small_pages(), &no_progress)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("sample 290") && e.contains("field `image`"),
        "{e}"
    );
    let left = file_names(&dir);
    assert!(
        left.is_empty(),
        "nothing written, no temporary file: {left:?}"
    );

    // A truncated JPEG is kept without a decode in jpeg mode: the reader's check runs at pack.
    let whole = jpeg(20, 20, 7);
    let cut = whole[..whole.len() - 30].to_vec();
    let src = MemorySource::new()
        .with_encoded_images("image", vec![whole, cut])
        .unwrap();
    let e = pack(&src, &dir.join("t.stkpack"), &small_pages(), &no_progress)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("sample 1") && e.contains("truncated JPEG"),
        "{e}"
    );
}

#[test]
fn repacking_a_directory_with_fewer_shards_removes_the_stale_ones() {
    let dir = tmp("repack");
    let src = dataset(30);
    let out = dir.join("set");
    let many = PackOptions {
        shard_size: Some(2048),
        ..small_pages()
    };
    let first = pack(&*src, &out, &many, &no_progress).unwrap();
    assert!(first.files.len() > 2);
    let one = PackOptions {
        shard_size: Some(1 << 30),
        ..small_pages()
    };
    let second = pack(&*src, &out, &one, &no_progress).unwrap();
    assert_eq!(second.files.len(), 1);
    let shards = file_names(&out)
        .iter()
        .filter(|name| name.ends_with(".stkpack"))
        .count();
    assert_eq!(shards, 1);
    let packed = PackedSource::open(out.to_str().unwrap()).unwrap();
    assert_eq!(all_samples(&packed), all_samples(&*src));
}

#[test]
fn a_uint16_tensor_field_packs_with_its_dtype_and_transforms_as_its_npy_array() {
    let dir = tmp("packed_u16");
    // Five [16, 16, 4] uint16 images over the whole 16-bit range.
    let (n, s, c) = (5usize, 16usize, 4usize);
    let values: Vec<u16> = (0..n * s * s * c)
        .map(|i| ((i * 2477 + (i / 7) * 131) % 65536) as u16)
        .collect();
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    let src = MemorySource::new()
        .with_tensor("image", DType::U16, &[s, s, c], bytes.clone())
        .unwrap();
    let out = dir.join("u16.stkpack");
    pack(&src, &out, &small_pages(), &no_progress).unwrap();
    let packed = PackedSource::open(out.to_str().unwrap()).unwrap();
    assert_eq!(packed.fields(), src.fields());
    assert_eq!(
        packed.fields()[0],
        stoker_core::source::FieldSpec::tensor("image", DType::U16, &[s, s, c])
    );
    assert_eq!(all_samples(&packed), all_samples(&src));
    let npy = dir.join("u16.npy");
    stoker_core::source::write_npy(&npy, DType::U16, &[n, s, s, c], &bytes).unwrap();
    let kv = [
        ("batch_size", "5"),
        ("transform", "random_resized_crop(8) | hflip"),
    ];
    let from_pack = loader(&format!("packed:{}", out.display()), &kv)
        .unwrap()
        .next();
    let from_npy = loader(&format!("npy:{}", npy.display()), &kv)
        .unwrap()
        .next();
    let (a, b) = (from_pack.unwrap().unwrap(), from_npy.unwrap().unwrap());
    let (fa, fb) = (
        a.field_by_name("image").unwrap(),
        b.field_by_name("data").unwrap(),
    );
    assert_eq!(
        (fa.dtype, fa.shape.to_vec()),
        (DType::U16, vec![5, c, 8, 8])
    );
    assert_eq!(fa.data.unwrap(), fb.data.unwrap());
}
