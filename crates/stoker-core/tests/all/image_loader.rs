//! The loader over an `image_folder` source, end to end: decode, fused transforms, collate.

use std::fs;
use std::path::{Path, PathBuf};

use stoker_core::{DType, Error, Loader, LoaderOptions};

fn fixture(name: &str) -> Vec<u8> {
    fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/images")
            .join(name),
    )
    .unwrap()
}

/// A folder of real-photo fixtures in three classes (given out of order on purpose), 8 images.
/// `extra` adds (relative path, bytes) files.
fn folder(name: &str, extra: &[(&str, Vec<u8>)]) -> PathBuf {
    let root = std::env::temp_dir().join(format!("stoker-imgloader-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&root);
    let files = [
        ("zebra/1.jpg", "photo_444.jpg"),
        ("zebra/2.jpg", "tiny_1x1.jpg"),
        ("apple/a.jpg", "photo_baseline.jpg"),
        ("apple/b.jpg", "photo_progressive.jpg"),
        ("apple/c.jpeg", "photo_gray.jpg"),
        ("mango/x.jpg", "photo_cmyk.jpg"),
        ("mango/y.JPEG", "photo_png_named.JPEG"),
        ("mango/z.png", "photo_png.png"),
    ];
    for (rel, fx) in files {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, fixture(fx)).unwrap();
    }
    for (rel, bytes) in extra {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, bytes).unwrap();
    }
    root
}

fn loader(root: &Path, opts: &[(&str, &str)]) -> Result<Loader, Error> {
    let mut o = LoaderOptions::new();
    o.set("source", &format!("image_folder:{}", root.display()))?;
    for (k, v) in opts {
        o.set(k, v)?;
    }
    Loader::new(&o)
}

/// Every batch of `epochs` epochs: (image bytes, labels).
fn drain(l: &mut Loader, epochs: usize) -> Vec<(Vec<u8>, Vec<i64>)> {
    let mut out = Vec::new();
    for _ in 0..epochs {
        while let Some(b) = l.next().unwrap() {
            let image = b.field_by_name("image").unwrap().data.unwrap().to_vec();
            let labels = b
                .field_by_name("label")
                .unwrap()
                .data
                .unwrap()
                .chunks_exact(8)
                .map(|c| i64::from_ne_bytes(c.try_into().unwrap()))
                .collect();
            out.push((image, labels));
        }
    }
    out
}

#[test]
fn image_folder_nchw_float32_batches() {
    let root = folder("nchw", &[]);
    let mut l = loader(
        &root,
        &[
            ("batch_size", "4"),
            ("num_workers", "0"),
            (
                "transform",
                "random_resized_crop(224) | hflip | normalize(imagenet)",
            ),
        ],
    )
    .unwrap();
    assert_eq!(l.batches_per_epoch(), 2);
    let mut labels = Vec::new();
    while let Some(b) = l.next().unwrap() {
        let names: Vec<&str> = b.fields().map(|f| f.name).collect();
        assert_eq!(names, ["image", "label"]);
        let image = b.field(0).unwrap();
        assert_eq!(image.dtype, DType::F32);
        assert_eq!(image.shape, [4, 3, 224, 224]);
        // Normalized ImageNet values stay within [-2.2, 2.7].
        for c in image.data.unwrap().chunks_exact(4).step_by(97) {
            let v = f32::from_ne_bytes(c.try_into().unwrap());
            assert!((-2.2..=2.7).contains(&v), "{v}");
        }
        let label = b.field(1).unwrap();
        assert_eq!((label.dtype, label.shape), (DType::I64, &[4usize][..]));
        labels.extend(
            label
                .data
                .unwrap()
                .chunks_exact(8)
                .map(|c| i64::from_ne_bytes(c.try_into().unwrap())),
        );
    }
    // Classes sorted: apple=0, mango=1, zebra=2.
    assert_eq!(labels, [0, 0, 0, 1, 1, 1, 2, 2]);
    fs::remove_dir_all(&root).unwrap();
}

#[test]
fn image_folder_nhwc_uint8_batches() {
    let root = folder("nhwc", &[]);
    let mut l = loader(
        &root,
        &[
            ("batch_size", "3"),
            ("num_workers", "1"),
            ("layout", "nhwc"),
            ("transform", "resize(256) | center_crop(224)"),
        ],
    )
    .unwrap();
    let batches = drain(&mut l, 1);
    assert_eq!(batches.len(), 3);
    assert_eq!(batches[0].0.len(), 3 * 224 * 224 * 3);
    assert_eq!(
        batches[2].0.len(),
        2 * 224 * 224 * 3,
        "last batch is partial"
    );
    let b = {
        let mut l = loader(
            &root,
            &[
                ("batch_size", "2"),
                ("num_workers", "0"),
                ("layout", "nhwc"),
                ("transform", "resize(256) | center_crop(224)"),
                ("dtype", "uint8"),
            ],
        )
        .unwrap();
        l.next().unwrap().unwrap()
    };
    let image = b.field(0).unwrap();
    assert_eq!(
        (image.dtype, image.shape),
        (DType::U8, &[2usize, 224, 224, 3][..])
    );
    // The tiny 1x1 JPEG upscales to a flat image of its one colour (200, 100, 50).
    let last = batches[2].0[224 * 224 * 3..].to_vec();
    for px in last.chunks_exact(3) {
        assert!(
            px[0].abs_diff(200) <= 3 && px[1].abs_diff(100) <= 3 && px[2].abs_diff(50) <= 3,
            "{px:?}"
        );
    }
    fs::remove_dir_all(&root).unwrap();
}

#[test]
fn batches_are_identical_for_any_num_workers() {
    let root = folder("workers", &[]);
    let spec = "random_resized_crop(96, scale=0.2:1) | hflip | normalize(imagenet)";
    let run = |workers: &str| {
        let mut l = loader(
            &root,
            &[
                ("batch_size", "3"),
                ("shuffle", "true"),
                ("seed", "1234"),
                ("num_workers", workers),
                ("dtype", "bfloat16"),
                ("transform", spec),
            ],
        )
        .unwrap();
        drain(&mut l, 2)
    };
    let zero = run("0");
    assert_eq!(zero.len(), 6);
    assert_eq!(zero, run("1"));
    assert_eq!(zero, run("2"));
    // Epochs differ (new order and new augmentation).
    assert_ne!(zero[0], zero[3]);
    fs::remove_dir_all(&root).unwrap();
}

#[test]
fn bad_files_raise_naming_the_file_or_are_skipped_and_counted() {
    let photo = fixture("photo_baseline.jpg");
    let bad = [
        ("mango/zz_truncated.jpg", photo[..photo.len() / 2].to_vec()),
        ("mango/zz_empty.jpg", Vec::new()),
        (
            "mango/zz_random.png",
            (0..3000u32).map(|i| (i * 7919 % 251) as u8).collect(),
        ),
    ];
    let root = folder("bad", &bad);
    let spec = ("transform", "resize(64, 64)");

    let mut l = loader(&root, &[("batch_size", "4"), ("num_workers", "0"), spec]).unwrap();
    let err = loop {
        match l.next() {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("epoch ended without an error"),
            Err(e) => break e,
        }
    };
    let msg = err.to_string();
    assert!(err.is_sample_error(), "{msg}");
    assert!(msg.contains("zz_"), "error names the file: {msg}");
    assert!(msg.contains(&root.display().to_string()), "{msg}");

    for workers in ["0", "2"] {
        let mut l = loader(
            &root,
            &[
                ("batch_size", "4"),
                ("num_workers", workers),
                ("on_error", "skip"),
                spec,
            ],
        )
        .unwrap();
        let batches = drain(&mut l, 1);
        let samples: usize = batches.iter().map(|(_, labels)| labels.len()).sum();
        assert_eq!(samples, 11, "every slot is filled");
        assert_eq!(l.stats().samples_skipped, 3);
        // Replacements are deterministic.
        let mut again = loader(
            &root,
            &[
                ("batch_size", "4"),
                ("num_workers", "1"),
                ("on_error", "skip"),
                spec,
            ],
        )
        .unwrap();
        assert_eq!(batches, drain(&mut again, 1));
    }
    fs::remove_dir_all(&root).unwrap();
}

#[test]
fn transform_errors_name_the_option() {
    let root = folder("opts", &[]);
    for (spec, needle) in [
        ("resize(256)", "fix the output size"),
        ("blur(3)", "unknown operation"),
        (
            "random_resized_crop(224) | normalize(imagenet) | normalize(imagenet)",
            "twice",
        ),
    ] {
        let err = loader(&root, &[("transform", spec)]).err().unwrap();
        assert!(
            matches!(&err, Error::InvalidOption { key, .. } if key == "transform"),
            "{err}"
        );
        assert!(err.to_string().contains(needle), "{spec}: {err}");
    }
    let err = loader(&root, &[]).err().unwrap();
    assert!(err.to_string().contains("transform"), "{err}");
    let err = loader(&root, &[("transform", "resize(8,8)"), ("dtype", "int32")])
        .err()
        .unwrap();
    assert!(
        matches!(&err, Error::InvalidOption { key, .. } if key == "dtype"),
        "{err}"
    );
    let err = loader(&root.join("missing"), &[("transform", "resize(8,8)")])
        .err()
        .unwrap();
    assert!(
        matches!(err, Error::Io { .. }) && err.to_string().contains("missing"),
        "{err}"
    );
    fs::remove_dir_all(&root).unwrap();
}

#[test]
fn encoded_samples_from_callbacks_match_image_folder_pixels() {
    use std::sync::Arc;
    use stoker_core::source::ReadFn;
    use stoker_core::{ImageFolderSource, Source, SourceSpec};

    let root = folder("callbacks", &[]);
    let spec = [
        (
            "transform",
            "random_resized_crop(64) | hflip | normalize(imagenet)",
        ),
        ("batch_size", "3"),
        ("shuffle", "true"),
        ("seed", "5"),
        ("num_workers", "2"),
    ];
    let mut direct = loader(&root, &spec).unwrap();
    let expected = drain(&mut direct, 2);

    // The same files, in the same index order, through the user's read function.
    let index = Arc::new(ImageFolderSource::open(&root).unwrap());
    let files = Arc::clone(&index);
    let read: Arc<ReadFn> = Arc::new(move |i, w| {
        let bytes = fs::read(files.path(i)).map_err(|e| e.to_string())?;
        w.put_encoded(&bytes)?;
        w.put_label(files.label(i))
    });
    let mut o = LoaderOptions::new().with_source(SourceSpec::Callback {
        len: index.len(),
        read,
    });
    for (k, v) in spec {
        o.set(k, v).unwrap();
    }
    let mut through_callbacks = Loader::new(&o).unwrap();
    assert_eq!(drain(&mut through_callbacks, 2), expected);
}

/// The image bytes of each slot of every batch of the rest of the epoch.
fn slots(l: &mut Loader) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(b) = l.next().unwrap() {
        let f = b.field_by_name("image").unwrap();
        let data = f.data.unwrap();
        let per = data.len() / f.shape[0];
        out.extend(data.chunks(per).map(<[u8]>::to_vec));
    }
    out
}

#[test]
fn a_sample_drawn_twice_in_an_epoch_gets_independent_crops() {
    let root = folder("redraw", &[]);
    let aug = "random_resized_crop(16) | hflip";
    let mut l = loader(
        &root,
        &[
            ("transform", aug),
            ("indices", "2,2,2,2,2,2"),
            ("batch_size", "3"),
        ],
    )
    .unwrap();
    let got = slots(&mut l);
    assert_eq!(got.len(), 6);
    let distinct: std::collections::HashSet<&Vec<u8>> = got.iter().collect();
    assert!(
        distinct.len() >= 5,
        "{} distinct crops of 6 draws",
        distinct.len()
    );
    // The same draws in the next run of the same epoch are the same crops.
    let mut again = loader(
        &root,
        &[
            ("transform", aug),
            ("indices", "2,2,2,2,2,2"),
            ("batch_size", "2"),
            ("num_workers", "3"),
        ],
    )
    .unwrap();
    assert_eq!(
        slots(&mut again),
        got,
        "keyed by draw, not by batching or workers"
    );
    fs::remove_dir_all(root).unwrap();
}

#[test]
fn augmentation_does_not_depend_on_the_number_of_ranks() {
    let root = folder("ranks", &[]);
    let common = [
        ("transform", "random_resized_crop(16) | hflip"),
        ("shuffle", "true"),
        ("seed", "4"),
    ];
    fn with<'a>(
        common: &[(&'a str, &'a str)],
        extra: &[(&'a str, &'a str)],
    ) -> Vec<(&'a str, &'a str)> {
        let mut kv = common.to_vec();
        kv.extend_from_slice(extra);
        kv
    }
    let one = slots(&mut loader(&root, &with(&common, &[("batch_size", "8")])).unwrap());
    assert_eq!(one.len(), 8);
    for world in [2usize, 3] {
        let ws = world.to_string();
        for rank in 0..world {
            let rs = rank.to_string();
            let kv = with(
                &common,
                &[("batch_size", "2"), ("world_size", &ws), ("rank", &rs)],
            );
            let mine = slots(&mut loader(&root, &kv).unwrap());
            for (j, image) in mine.iter().enumerate() {
                let g = rank + j * world;
                if g < one.len() {
                    assert_eq!(*image, one[g], "world {world} rank {rank} slot {j}");
                }
            }
        }
    }
    // A resume with another transform is refused, naming it.
    let mut l = loader(&root, &with(&common, &[("batch_size", "2")])).unwrap();
    l.next().unwrap();
    let state = l.save_state();
    let e = loader(
        &root,
        &[
            ("transform", "center_crop(16)"),
            ("shuffle", "true"),
            ("batch_size", "2"),
            ("resume_state", &state),
        ],
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("its transform, dtype or layout"), "{e}");
    fs::remove_dir_all(root).unwrap();
}

// ---- A damaged image affects exactly its own sample ----
//
// One worker thread decodes every image below, so a decoder whose state an error left dirty
// would fail (or mis-decode) the good images after the damaged one.

use stoker_core::decode::{self, DecodeBuffers, DecodePath, JpegDecoder, Window};
use stoker_core::testing::{damaged_jpegs, damaged_pngs, Damaged};

/// One way of decoding an image, as collate asks for it.
#[derive(Clone, Copy, Debug)]
struct DecodeCase {
    decoder: JpegDecoder,
    window: Option<Window>,
    path: DecodePath,
}

/// The decoder paths: libjpeg-turbo whole, by region and DCT-scaled, zune-jpeg (PNGs always go
/// to zune-png). Without libjpeg-turbo in the build only zune's.
fn decode_cases() -> Vec<DecodeCase> {
    let zune = DecodeCase {
        decoder: JpegDecoder::Zune,
        window: None,
        path: DecodePath::Zune,
    };
    if !decode::turbo_available() {
        return vec![zune];
    }
    let turbo = |window, path| DecodeCase {
        decoder: JpegDecoder::Turbo,
        window,
        path,
    };
    let region = |max_scale| Window {
        rect: [100, 60, 400, 300],
        max_scale,
    };
    vec![
        turbo(None, DecodePath::Turbo),
        turbo(Some(region(1)), DecodePath::TurboRegion),
        turbo(Some(region(2)), DecodePath::TurboScaled),
        zune,
    ]
}

fn is_turbo(decoder: JpegDecoder) -> bool {
    decoder == JpegDecoder::Turbo
}

/// Decodes `bytes` as collate does (header, then the window) into `bufs`: the pixels and the
/// path, or the error.
fn decode_with(
    bytes: &[u8],
    case: DecodeCase,
    bufs: &mut DecodeBuffers,
) -> Result<(Vec<u8>, decode::Decoded), String> {
    let header = decode::read_header(bytes, 1 << 24, case.decoder, bufs)?;
    let decoded = decode::decode(bytes, &header, case.window, bufs)?;
    Ok((bufs.rgb.clone(), decoded))
}

/// For every decoder path and every kind of damage: a good image, the damaged one, the good one
/// again on the same buffers (one worker's), and the second good decode equals a decode with
/// fresh buffers. The report's damage (an invalid marker in the scan) must be an error.
#[test]
fn a_damaged_image_never_changes_how_the_next_one_decodes() {
    let good_jpeg = fixture("photo_baseline.jpg");
    let good_png = fixture("photo_png.png");
    for case in decode_cases() {
        for (good, damaged) in [
            (&good_jpeg, damaged_jpegs(&good_jpeg)),
            (&good_png, damaged_pngs(&good_png)),
            // A PNG after a damaged JPEG, and the other way round: one buffer set serves both.
            (&good_png, damaged_jpegs(&good_jpeg)),
            (&good_jpeg, damaged_pngs(&good_png)),
        ] {
            let fresh = decode_with(good, case, &mut DecodeBuffers::default())
                .unwrap_or_else(|e| panic!("{case:?}: the good image fails fresh: {e}"));
            if good == &good_jpeg {
                assert_eq!(fresh.1.path, case.path, "{case:?}");
            }
            let mut bufs = DecodeBuffers::default();
            for Damaged {
                name,
                bytes,
                always_fails,
            } in &damaged
            {
                let before = decode_with(good, case, &mut bufs)
                    .unwrap_or_else(|e| panic!("{case:?}, before `{name}`: {e}"));
                assert!(
                    before == fresh,
                    "{case:?}: the good image differs before `{name}`"
                );
                let outcome = decode_with(bytes, case, &mut bufs);
                // libjpeg-turbo refuses the report's damage when it decodes the whole image (a
                // region decode stops before the marker).
                let turbo_whole = is_turbo(case.decoder) && case.window.is_none();
                if *always_fails || (turbo_whole && name.contains("after the scan")) {
                    assert!(outcome.is_err(), "{case:?}: `{name}` decoded");
                }
                for again in 0..2 {
                    let after = decode_with(good, case, &mut bufs).unwrap_or_else(|e| {
                        panic!("{case:?}: good image {again} after `{name}` fails: {e}")
                    });
                    assert!(
                        after == fresh,
                        "{case:?}: good image {again} after `{name}` differs from a fresh decode"
                    );
                }
            }
        }
    }
}

/// The report's folder: eight good photos and one damaged file, in one class, sorted so that
/// the damaged one is `at` (0 = first, 8 = last). `good_too` writes a good photo in its place
/// instead: the same names and order, so the same random draws for every position.
fn folder_with_damage(tag: &str, at: usize, damaged: Option<&[u8]>) -> PathBuf {
    let root = std::env::temp_dir().join(format!(
        "stoker-damage-{}-{tag}-{at}-{}",
        std::process::id(),
        damaged.is_some()
    ));
    let _ = fs::remove_dir_all(&root);
    fs::create_dir_all(root.join("photos")).unwrap();
    let goods = [
        "photo_baseline.jpg",
        "photo_444.jpg",
        "photo_progressive.jpg",
        "photo_gray.jpg",
        "photo_cmyk.jpg",
        "photo_png.png",
        "photo_png_named.JPEG",
        "tiny_1x1.jpg",
    ];
    let mut good = goods.iter();
    for i in 0..9 {
        let bytes = match (i == at, damaged) {
            (true, Some(bytes)) => bytes.to_vec(),
            (true, None) => fixture("photo_baseline.jpg"),
            _ => fixture(good.next().unwrap()),
        };
        fs::write(root.join("photos").join(format!("{i}.JPEG")), bytes).unwrap();
    }
    root
}

/// The report, end to end: `random_resized_crop(64)`, batches of one, one worker, the default
/// decoder and zune-jpeg, the damaged file first and last. Under `skip` the
/// damaged sample is replaced and counted, and every good sample is the batch a folder without
/// damage gives at that position; under `raise` the damaged file's batch is an error naming it,
/// the others are those batches, and the next epoch is decoded in full again.
#[test]
fn a_damaged_jpeg_affects_only_its_own_sample_under_skip_and_raise() {
    let good = fixture("photo_baseline.jpg");
    // The report's damage, the two that poisoned libjpeg-turbo's decompressor, and one that
    // fails in the scan; the decoder-level test above goes through every kind.
    let damage: Vec<Damaged> = damaged_jpegs(&good)
        .into_iter()
        .filter(|d| {
            ["after the scan", "Huffman", "width zero", "cut off"]
                .iter()
                .any(|kind| d.name.contains(kind))
        })
        .collect();
    assert_eq!(damage.len(), 4);
    let mut decoders = vec!["zune"];
    if decode::turbo_available() {
        decoders.push("turbo");
    }
    for decoder in decoders {
        let opts = |on_error| {
            vec![
                ("batch_size", "1"),
                ("num_workers", "1"),
                ("transform", "random_resized_crop(64)"),
                ("jpeg_decoder", decoder),
                ("on_error", on_error),
            ]
        };
        for at in [0, 8] {
            let clean = folder_with_damage(decoder, at, None);
            let expected = drain(&mut loader(&clean, &opts("raise")).unwrap(), 2);
            let _ = fs::remove_dir_all(clean);
            for Damaged {
                name,
                bytes,
                always_fails,
            } in &damage
            {
                let root = folder_with_damage(decoder, at, Some(bytes));
                let what = format!("`{name}` at {at}, jpeg_decoder={decoder}");

                let mut skip = loader(&root, &opts("skip")).unwrap();
                let got = drain(&mut skip, 2);
                assert_eq!(got.len(), 18, "{what}");
                let skipped = skip.stats().samples_skipped as usize;
                if *always_fails {
                    assert_eq!(skipped, 2, "{what}: one replacement per epoch");
                }
                for (i, (batch, want)) in got.iter().zip(&expected).enumerate() {
                    if i % 9 != at {
                        assert!(batch == want, "{what}, skip: batch {i} differs");
                    }
                }

                let mut raise = loader(&root, &opts("raise")).unwrap();
                for epoch in 0..2 {
                    for i in 0..9 {
                        match raise.next() {
                            Ok(Some(_)) if i == at => {} // decoded despite the damage
                            Ok(Some(b)) => {
                                let image = b.field_by_name("image").unwrap().data.unwrap();
                                assert!(
                                    image == expected[epoch * 9 + i].0.as_slice(),
                                    "{what}, raise: epoch {epoch} batch {i} differs"
                                );
                            }
                            Ok(None) => panic!("{what}, raise: epoch {epoch} ended at {i}"),
                            Err(e) => {
                                assert_eq!(i, at, "{what}, raise: batch {i} failed: {e}");
                                assert!(
                                    e.to_string().contains(&format!("{at}.JPEG")),
                                    "{what}: the error does not name the file: {e}"
                                );
                            }
                        }
                    }
                    assert!(raise.next().unwrap().is_none(), "{what}: epoch {epoch}");
                }
                let _ = fs::remove_dir_all(root);
            }
        }
    }
}
