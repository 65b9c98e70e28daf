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
    assert!(e.contains("the transform, dtype or layout"), "{e}");
    fs::remove_dir_all(root).unwrap();
}
