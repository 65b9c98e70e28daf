//! Dense tasks from files people have: PNG segmentation masks (grayscale or palette, whose
//! indices are the labels) beside encoded images in WebDataset shards, moved with their
//! image's draw, and the per-sample errors of a mask that does not fit its image.

use std::path::Path;

use stoker_core::{Loader, LoaderOptions};

use crate::support::files::{tmp, write_tar};

pub(crate) const W: usize = 48;
pub(crate) const H: usize = 40;

/// A PNG of `width`x`height` pixels, `color` with `depth` bits, holding `data`; `palette` for
/// an indexed image.
fn png(
    (width, height): (usize, usize),
    color: png::ColorType,
    depth: png::BitDepth,
    palette: Option<Vec<u8>>,
    data: &[u8],
) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut e = png::Encoder::new(&mut out, width as u32, height as u32);
        e.set_color(color);
        e.set_depth(depth);
        if let Some(p) = palette {
            e.set_palette(p);
        }
        let mut w = e.write_header().unwrap();
        w.write_image_data(data).unwrap();
    }
    out
}

/// An RGB PNG whose pixel (x, y) is `(5x, 6y, 10 * sample)`: each pixel says where it was.
pub(crate) fn coded_image(sample: usize, (width, height): (usize, usize)) -> Vec<u8> {
    let data: Vec<u8> = (0..width * height)
        .flat_map(|p| {
            [
                (p % width * 5) as u8,
                (p / width * 6) as u8,
                (sample * 10) as u8,
            ]
        })
        .collect();
    png(
        (width, height),
        png::ColorType::Rgb,
        png::BitDepth::Eight,
        None,
        &data,
    )
}

/// A 16-bit grayscale mask whose label at (x, y) is `y * W + x`.
fn coded_mask((width, height): (usize, usize)) -> Vec<u8> {
    let data: Vec<u8> = (0..width * height)
        .flat_map(|p| (p as u16).to_be_bytes())
        .collect();
    png(
        (width, height),
        png::ColorType::Grayscale,
        png::BitDepth::Sixteen,
        None,
        &data,
    )
}

/// VOC's class mask: palette indices 0..=20 in bands, 255 on the border; the palette colours
/// are VOC's bit-interleaved ones, none equal to its index.
fn voc_labels() -> Vec<u8> {
    (0..W * H)
        .map(|p| {
            let (x, y) = (p % W, p / W);
            if x == 0 || y == 0 || x == W - 1 || y == H - 1 {
                255
            } else {
                ((x / 3 + y / 5) % 21) as u8
            }
        })
        .collect()
}

fn voc_palette() -> Vec<u8> {
    (0..256usize)
        .flat_map(|i| {
            let (mut r, mut g, mut b) = (0u8, 0u8, 0u8);
            let mut c = i;
            for j in 0..8 {
                r |= ((c & 1) as u8) << (7 - j);
                g |= (((c >> 1) & 1) as u8) << (7 - j);
                b |= (((c >> 2) & 1) as u8) << (7 - j);
                c >>= 3;
            }
            [r, g, b]
        })
        .collect()
}

fn shard(dir: &Path, samples: &[(Vec<u8>, Vec<u8>)]) -> String {
    let members: Vec<(String, Vec<u8>)> = samples
        .iter()
        .enumerate()
        .flat_map(|(i, (image, mask))| {
            [
                (format!("s{i:03}.jpg"), image.clone()),
                (format!("s{i:03}.seg.png"), mask.clone()),
            ]
        })
        .collect();
    let path = dir.join("seg.tar");
    write_tar(&path, &members);
    format!("tar:{}", path.display())
}

fn loader(source: &str, spec: &str, kv: &[(&str, &str)]) -> stoker_core::Result<Loader> {
    let mut o = LoaderOptions::new();
    o.set("source", source)?;
    o.set("fields", "jpg:image,seg.png:mask")?;
    o.set("batch_size", "2")?;
    o.set("shuffle", "true")?;
    o.set("seed", "3")?;
    o.set("num_workers", "1")?;
    o.set("transform", spec)?;
    for (k, v) in kv {
        o.set(k, v)?;
    }
    Loader::new(&o)
}

pub(crate) fn i64s(bytes: &[u8]) -> Vec<i64> {
    bytes
        .chunks_exact(8)
        .map(|b| i64::from_ne_bytes(b.try_into().unwrap()))
        .collect()
}

#[test]
fn png_mask_takes_its_encoded_images_draw() {
    let dir = tmp("png-mask-draw");
    let samples: Vec<_> = (0..6)
        .map(|i| (coded_image(i, (W, H)), coded_mask((W, H))))
        .collect();
    let source = shard(&dir, &samples);
    let spec = "fields(image=image, mask=mask) | random_crop(24) | hflip";
    let mut l = loader(&source, spec, &[]).unwrap();
    let mut seen = 0;
    let mut flipped = [0usize; 2];
    while let Some(b) = l.next().unwrap() {
        let image = b.field_by_name("image").unwrap();
        let mask = b.field_by_name("mask").unwrap();
        assert_eq!(mask.dtype, stoker_core::DType::I64);
        assert_eq!(mask.shape, [2, 24, 24]);
        assert_eq!(image.shape, [2, 3, 24, 24]);
        let (px, labels) = (image.data.unwrap(), i64s(mask.data.unwrap()));
        for n in 0..2 {
            for p in 0..24 * 24 {
                let label = labels[n * 576 + p] as usize;
                let (x, y) = (label % W, label / W);
                let r = px[n * 3 * 576 + p];
                let g = px[n * 3 * 576 + 576 + p];
                assert_eq!(
                    (r, g),
                    ((x * 5) as u8, (y * 6) as u8),
                    "sample {n} pixel {p}"
                );
            }
            // Left to right, the labels go up unless the draw flipped both.
            let row = &labels[n * 576..n * 576 + 2];
            flipped[usize::from(row[1] < row[0])] += 1;
            seen += 1;
        }
    }
    assert_eq!(seen, 6);
    assert!(flipped[0] > 0 && flipped[1] > 0, "{flipped:?}");
}

#[test]
fn png_mask_takes_its_encoded_images_resampling_draw() {
    // random_resized_crop draws a box and scale from the image's size: the mask's pipeline,
    // built for the same size, must draw the same. The image's red is 5x and green 6x the
    // source pixel's x and y, smooth, so the bilinear image at each output pixel is within a
    // source pixel of where the nearest mask label says it came from.
    let dir = tmp("png-mask-rrc");
    let samples: Vec<_> = (0..8)
        .map(|i| (coded_image(i, (W, H)), coded_mask((W, H))))
        .collect();
    let source = shard(&dir, &samples);
    let spec = "fields(image=image, mask=mask) | random_resized_crop(16) | hflip";
    let mut l = loader(&source, spec, &[]).unwrap();
    let (mut worst, mut seen) = (0i32, 0);
    while let Some(b) = l.next().unwrap() {
        let px = b.field_by_name("image").unwrap().data.unwrap();
        let labels = i64s(b.field_by_name("mask").unwrap().data.unwrap());
        for n in 0..2 {
            for p in 0..256 {
                let label = labels[n * 256 + p] as usize;
                let (x, y) = ((label % W) as i32, (label / W) as i32);
                let r = i32::from(px[n * 3 * 256 + p]);
                let g = i32::from(px[n * 3 * 256 + 256 + p]);
                worst = worst.max((r - 5 * x).abs() / 5).max((g - 6 * y).abs() / 6);
            }
            seen += 1;
        }
    }
    assert_eq!(seen, 8);
    // A different draw would be off by many pixels; the same one by under a resample step.
    assert!(
        worst <= 1,
        "the image is {worst} source pixels from the mask's labels"
    );
}

#[test]
fn masks_of_images_of_different_sizes_each_take_their_own_plan() {
    // Coded masks (label = y * W + x) of 48x40, 40x48 and 48x40 again, centre-cropped to 24.
    let dir = tmp("mask-sizes");
    let sizes = [(W, H), (H, W), (W, H)];
    let samples: Vec<_> = sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| (coded_image(i, s), coded_mask(s)))
        .collect();
    let source = shard(&dir, &samples);
    let spec = "fields(image=image, mask=mask) | center_crop(24)";
    let mut l = loader(&source, spec, &[("shuffle", "false"), ("batch_size", "3")]).unwrap();
    let b = l.next().unwrap().unwrap();
    let labels = i64s(b.field_by_name("mask").unwrap().data.unwrap());
    for (n, &(w, h)) in sizes.iter().enumerate() {
        let (top, left) = ((h - 24) / 2, (w - 24) / 2);
        // The label counts pixels in rows of the coded mask's own width.
        let want: Vec<i64> = (0..24 * 24)
            .map(|p| ((top + p / 24) * w + left + p % 24) as i64)
            .collect();
        assert_eq!(
            &labels[n * 576..(n + 1) * 576],
            &want[..],
            "sample {n} ({w}x{h})"
        );
    }
}

#[test]
fn palette_mask_labels_are_its_indices() {
    let dir = tmp("palette-mask");
    let labels = voc_labels();
    let mask = png(
        (W, H),
        png::ColorType::Indexed,
        png::BitDepth::Eight,
        Some(voc_palette()),
        &labels,
    );
    let samples: Vec<_> = (0..4)
        .map(|i| (coded_image(i, (W, H)), mask.clone()))
        .collect();
    let source = shard(&dir, &samples);
    let spec = "fields(image=image, mask=mask) | center_crop(32)";
    let mut l = loader(&source, spec, &[]).unwrap();
    // torchvision's center_crop: top (40 - 32) / 2 = 4, left (48 - 32) / 2 = 8.
    let want: Vec<i64> = (4..36)
        .flat_map(|y| (8..40).map(move |x| (y, x)))
        .map(|(y, x)| i64::from(labels[y * W + x]))
        .collect();
    let mut n = 0;
    while let Some(b) = l.next().unwrap() {
        let got = i64s(b.field_by_name("mask").unwrap().data.unwrap());
        for s in got.chunks(32 * 32) {
            assert_eq!(s, &want[..]);
            n += 1;
        }
    }
    assert_eq!(n, 4);
}

#[test]
fn gray8_and_low_bit_masks_read_as_values() {
    let dir = tmp("gray-mask");
    let gray: Vec<u8> = (0..W * H).map(|p| (p % 7) as u8).collect();
    // 4-bit palette: two pixels a byte, high nibble first.
    let nibbles: Vec<u8> = (0..H)
        .flat_map(|y| {
            (0..W / 2).map(move |x| (((2 * x + y) % 16) << 4 | ((2 * x + 1 + y) % 16)) as u8)
        })
        .collect();
    let p4 = png(
        (W, H),
        png::ColorType::Indexed,
        png::BitDepth::Four,
        Some(voc_palette()[..48].to_vec()),
        &nibbles,
    );
    let g8 = png(
        (W, H),
        png::ColorType::Grayscale,
        png::BitDepth::Eight,
        None,
        &gray,
    );
    let source = shard(
        &dir,
        &[(coded_image(0, (W, H)), g8), (coded_image(1, (W, H)), p4)],
    );
    let spec = "fields(image=image, mask=mask) | center_crop(40, 48)";
    let mut l = loader(&source, spec, &[("shuffle", "false")]).unwrap();
    let b = l.next().unwrap().unwrap();
    let got = i64s(b.field_by_name("mask").unwrap().data.unwrap());
    let want_gray: Vec<i64> = gray.iter().map(|&v| i64::from(v)).collect();
    let want_p4: Vec<i64> = (0..W * H).map(|p| ((p % W + p / W) % 16) as i64).collect();
    assert_eq!(&got[..W * H], &want_gray[..]);
    assert_eq!(&got[W * H..], &want_p4[..]);
}

#[test]
fn mask_of_another_size_is_that_samples_error() {
    let dir = tmp("mask-size");
    let mut samples: Vec<_> = (0..4)
        .map(|i| (coded_image(i, (W, H)), coded_mask((W, H))))
        .collect();
    samples[2].1 = coded_mask((W, H - 10));
    let source = shard(&dir, &samples);
    let spec = "fields(image=image, mask=mask) | center_crop(24)";
    let run = |on_error: &str| -> (usize, Option<String>, u64) {
        let mut l = loader(&source, spec, &[("on_error", on_error)]).unwrap();
        let mut n = 0;
        loop {
            match l.next() {
                Ok(Some(b)) => n += b.field_by_name("mask").unwrap().shape[0],
                Ok(None) => return (n, None, l.stats().samples_skipped),
                Err(e) => return (n, Some(e.to_string()), l.stats().samples_skipped),
            }
        }
    };
    let (_, e, _) = run("raise");
    let e = e.expect("the mismatched mask fails its batch");
    assert!(e.contains("s002"), "names the sample: {e}");
    assert!(
        e.contains("48x30") && e.contains("48x40"),
        "both sizes: {e}"
    );
    assert!(e.contains("mask"), "{e}");
    let (n, e, skipped) = run("skip");
    assert_eq!((n, e, skipped), (4, None, 1));
}

#[test]
fn colour_png_is_not_a_mask() {
    let dir = tmp("rgb-mask");
    let samples: Vec<_> = (0..2)
        .map(|i| (coded_image(i, (W, H)), coded_image(i, (W, H))))
        .collect();
    let source = shard(&dir, &samples);
    let spec = "fields(image=image, mask=mask) | center_crop(24)";
    let mut l = loader(&source, spec, &[]).unwrap();
    let Err(e) = l.next() else {
        panic!("an RGB mask fails its batch")
    };
    let e = e.to_string();
    assert!(e.contains("single-channel") && e.contains("Rgb"), "{e}");
}

/// `segmentation_folder:ROOT`: `images/<split>/NAME.jpg` beside `masks/<split>/NAME.png`.
fn twin_trees(root: &Path, names: &[&str]) {
    for (i, name) in names.iter().enumerate() {
        let image = root.join("images").join(format!("{name}.jpg"));
        let mask = root.join("masks").join(format!("{name}.png"));
        std::fs::create_dir_all(image.parent().unwrap()).unwrap();
        std::fs::create_dir_all(mask.parent().unwrap()).unwrap();
        std::fs::write(&image, coded_image(i, (W, H))).unwrap();
        let labels = vec![i as u8; W * H];
        let png = png(
            (W, H),
            png::ColorType::Grayscale,
            png::BitDepth::Eight,
            None,
            &labels,
        );
        std::fs::write(&mask, png).unwrap();
    }
}

fn folder_loader(root: &Path, kv: &[(&str, &str)]) -> stoker_core::Result<Loader> {
    let mut o = LoaderOptions::new();
    o.set("source", &format!("segmentation_folder:{}", root.display()))?;
    o.set("batch_size", "3")?;
    o.set(
        "transform",
        "fields(image=image, mask=mask) | center_crop(24)",
    )?;
    for (k, v) in kv {
        o.set(k, v)?;
    }
    Loader::new(&o)
}

#[test]
fn segmentation_folder_pairs_each_image_with_its_mask() {
    let root = tmp("seg-folder");
    // Written out of order: samples come in path order, `train/b/` after `train/a.jpg`.
    twin_trees(&root, &["val/z", "train/b/c", "train/a"]);
    let mut l = folder_loader(&root, &[]).unwrap();
    let b = l.next().unwrap().unwrap();
    let image = b.field_by_name("image").unwrap();
    assert_eq!(image.shape, [3, 3, 24, 24]);
    let masks = i64s(b.field_by_name("mask").unwrap().data.unwrap());
    // Labels are each mask's writing order (val/z 0, train/b/c 1, train/a 2); blue is 10x it.
    let px = image.data.unwrap();
    for (n, want) in [2i64, 1, 0].iter().enumerate() {
        assert!(masks[n * 576..(n + 1) * 576].iter().all(|l| l == want));
        assert_eq!(i64::from(px[n * 3 * 576 + 2 * 576]), want * 10);
    }
    assert!(l.next().unwrap().is_none());
}

#[test]
fn segmentation_folder_without_a_mask_fails_at_open_naming_it() {
    let root = tmp("seg-missing");
    twin_trees(&root, &["train/a", "train/b"]);
    std::fs::remove_file(root.join("masks/train/b.png")).unwrap();
    let Err(e) = folder_loader(&root, &[]) else {
        panic!("a missing mask fails at open")
    };
    let e = e.to_string();
    assert!(
        e.contains("images/train/b.jpg") && e.contains("masks/train/b.png"),
        "{e}"
    );
    std::fs::remove_dir_all(root.join("masks")).unwrap();
    let Err(e) = folder_loader(&root, &[]) else {
        panic!("no masks directory fails at open")
    };
    assert!(e.to_string().contains("masks"), "{e}");
}

/// A shard of coded images with a JSON member each: `{"boxes": [[x, y, w, h], ...], "labels":
/// [...]}` as given.
fn detection_shard(dir: &Path, jsons: &[String]) -> String {
    let members: Vec<(String, Vec<u8>)> = jsons
        .iter()
        .enumerate()
        .flat_map(|(i, json)| {
            [
                (format!("d{i:03}.jpg"), coded_image(i, (W, H))),
                (format!("d{i:03}.json"), json.clone().into_bytes()),
            ]
        })
        .collect();
    let path = dir.join("det.tar");
    write_tar(&path, &members);
    format!("tar:{}", path.display())
}

fn detection_loader(source: &str, kv: &[(&str, &str)]) -> stoker_core::Result<Loader> {
    let mut o = LoaderOptions::new();
    o.set("source", source)?;
    o.set("fields", "jpg:image,json#boxes:boxes,json#labels:labels")?;
    o.set("batch_size", "2")?;
    o.set("ragged", "offsets")?;
    o.set(
        "transform",
        "fields(image=image, boxes=boxes:xywh, labels=labels) | hflip(p=1) | center_crop(40, 48)",
    )?;
    for (k, v) in kv {
        o.set(k, v)?;
    }
    Loader::new(&o)
}

pub(crate) fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_ne_bytes(b.try_into().unwrap()))
        .collect()
}

#[test]
fn json_boxes_and_labels_move_with_an_encoded_image() {
    let dir = tmp("json-boxes");
    let jsons = [
        r#"{"boxes": [[2, 3, 10, 5], [30.5, 0, 17.5, 40]], "labels": [7, 1], "extra": "kept out"}"#,
        r#"{"boxes": [], "labels": []}"#,
    ]
    .map(str::to_owned);
    let source = detection_shard(&dir, &jsons);
    let mut l = detection_loader(&source, &[]).unwrap();
    let b = l.next().unwrap().unwrap();
    let boxes = b.field_by_name("boxes").unwrap();
    assert_eq!(boxes.dtype, stoker_core::DType::F32);
    // Mirrored: x' = W - x - w.
    assert_eq!(
        f32s(boxes.data.unwrap()),
        [36.0, 3.0, 10.0, 5.0, 0.0, 0.0, 17.5, 40.0]
    );
    assert_eq!(
        i64s(b.field_by_name("labels").unwrap().data.unwrap()),
        [7, 1]
    );
    assert_eq!(
        i64s(b.field_by_name("boxes_offsets").unwrap().data.unwrap()),
        [0, 2, 2]
    );
}

#[test]
fn bad_annotations_are_their_samples_errors() {
    let good = r#"{"boxes": [[1, 1, 4, 4]], "labels": [3]}"#;
    let cases = [
        (
            r#"{"boxes": [[1, 1, -4, 4]], "labels": [3]}"#,
            "negative width or height",
        ),
        (
            r#"{"boxes": [[40, 1, 20, 4]], "labels": [3]}"#,
            "outside the 48x40 image",
        ),
        (
            r#"{"boxes": [[1, 1, NaN, 4]], "labels": [3]}"#,
            "not valid JSON",
        ),
        (
            r#"{"boxes": [[1, 1, 1e39, 4]], "labels": [3]}"#,
            "too large for float32",
        ),
        (
            r#"{"boxes": [[1, 1, 4]], "labels": [3]}"#,
            "not a list of 4 numbers",
        ),
        (
            r#"{"boxes": [[1, 1, 4, 4]], "labels": [3.5]}"#,
            "not an integer",
        ),
        (
            r#"{"boxes": [[1, 1, 4, 4]], "labels": [3, 4]}"#,
            "2 labels for 1 boxes",
        ),
        (r#"{"labels": [3]}"#, "no `boxes` key"),
    ];
    for (bad, want) in cases {
        let dir = tmp("bad-annotations");
        let jsons = [good, good, bad, good].map(str::to_owned);
        let source = detection_shard(&dir, &jsons);
        let mut l = detection_loader(&source, &[]).unwrap();
        let e = loop {
            match l.next() {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("{bad}: no error"),
                Err(e) => break e.to_string(),
            }
        };
        assert!(e.contains(want) && e.contains("d002"), "{bad}: {e}");
        let mut l = detection_loader(&source, &[("on_error", "skip")]).unwrap();
        let mut n = 0;
        while let Some(b) = l.next().unwrap() {
            n += b.field_by_name("image").unwrap().shape[0];
        }
        assert_eq!((n, l.stats().samples_skipped), (4, 1), "{bad}");
    }
}

/// One batch field: its name, shape and bytes.
type Field = (String, Vec<usize>, Vec<u8>);

/// Every field of every batch of one epoch, by name.
fn epoch_fields(mut l: Loader) -> Vec<Vec<Field>> {
    let mut out = Vec::new();
    while let Some(b) = l.next().unwrap() {
        out.push(
            b.fields()
                .map(|f| {
                    let data = f.data.unwrap_or(&[]).to_vec();
                    (f.name.to_string(), f.shape.to_vec(), data)
                })
                .collect(),
        );
    }
    out
}

#[test]
fn pack_keeps_masks_and_boxes_and_refuses_to_shrink_them() {
    use stoker_core::pack::{open_source_with_fields, pack_spec, PackMode, PackOptions};
    let spec_of = |root: &Path| format!("segmentation_folder:{}", root.display());
    let no_progress = |_: u64, _: u64| {};
    let root = tmp("pack-dense");
    twin_trees(&root, &["train/a", "train/b", "val/c"]);
    let packed = root.join("seg.stkpack");
    pack_spec(
        &format!("segmentation_folder:{}", root.display()),
        &packed,
        &PackOptions::default(),
        &no_progress,
    )
    .unwrap();
    let direct = epoch_fields(folder_loader(&root, &[]).unwrap());
    let mut o = LoaderOptions::new();
    o.set("source", &format!("packed:{}", packed.display()))
        .unwrap();
    o.set("batch_size", "3").unwrap();
    o.set(
        "transform",
        "fields(image=image, mask=mask) | center_crop(24)",
    )
    .unwrap();
    assert_eq!(epoch_fields(Loader::new(&o).unwrap()), direct);

    let jsons = [
        r#"{"boxes": [[2, 3, 10, 5], [30.5, 0, 17.5, 40]], "labels": [7, 1]}"#,
        r#"{"boxes": [[0, 0, 48, 40]], "labels": [2]}"#,
    ]
    .map(str::to_owned);
    let source = detection_shard(&root, &jsons);
    let det = root.join("det.stkpack");
    // The tar's fields as the loader names them (a source spec alone gives image and label).
    let fields = "jpg:image,json#boxes:boxes,json#labels:labels";
    let src = open_source_with_fields(&source, Some(fields)).unwrap();
    assert!(open_source_with_fields(&spec_of(&root), Some(fields)).is_err());
    stoker_core::pack::pack(&*src, &det, &PackOptions::default(), &no_progress).unwrap();
    let direct = epoch_fields(detection_loader(&source, &[]).unwrap());
    let mut o = LoaderOptions::new();
    o.set("source", &format!("packed:{}", det.display()))
        .unwrap();
    o.set("batch_size", "2").unwrap();
    o.set("ragged", "offsets").unwrap();
    o.set(
        "transform",
        "fields(image=image, boxes=boxes:xywh, labels=labels) | hflip(p=1) | center_crop(40, 48)",
    )
    .unwrap();
    assert_eq!(epoch_fields(Loader::new(&o).unwrap()), direct);

    let spec = format!("segmentation_folder:{}", root.display());
    for options in [
        PackOptions {
            max_side: Some(16),
            ..PackOptions::default()
        },
        PackOptions {
            mode: PackMode::Raw,
            ..PackOptions::default()
        },
    ] {
        let e = pack_spec(&spec, &root.join("no.stkpack"), &options, &no_progress)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("`mask`") && e.contains("--mode jpeg"), "{e}");
    }
    let e = stoker_core::pack::pack(
        &*src,
        &root.join("no.stkpack"),
        &PackOptions {
            max_side: Some(16),
            ..PackOptions::default()
        },
        &no_progress,
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(e.contains("`boxes`") && e.contains("--max-side 16"), "{e}");
}

/// Sample `i`'s boxes (`xywh`, within the `W`x`H` image) and labels, as a tar `json` member
/// holds them.
fn iou_boxes(i: usize) -> (Vec<[f32; 4]>, Vec<i64>) {
    let boxes = [
        [2.0 + i as f32, 3.0, 10.0, 5.0],
        [20.0, 10.0 + i as f32, 15.0, 20.0],
        [30.5, 0.0, 17.5, 40.0],
    ];
    let n = 1 + i % 3;
    (boxes[..n].to_vec(), [7, 1, 4][..n].to_vec())
}

/// The pixels of [`coded_image`] as an RGB `[H, W, 3]` tensor.
fn coded_pixels(sample: usize) -> Vec<u8> {
    (0..W * H)
        .flat_map(|p| [(p % W * 5) as u8, (p / W * 6) as u8, (sample * 10) as u8])
        .collect()
}

/// Every field of every batch of one epoch, sorted by name.
fn sorted_epoch(l: Loader) -> Vec<Vec<Field>> {
    let mut epoch = epoch_fields(l);
    for batch in &mut epoch {
        batch.sort_by(|a, b| a.0.cmp(&b.0));
    }
    epoch
}

const IOU_SPEC: &str = "fields(image=image, mask=mask, boxes=boxes, labels=labels) \
     | random_iou_crop | resize(32, 32) | hflip";

#[test]
fn json_boxes_of_an_encoded_image_draw_random_iou_crop_for_image_and_png_mask() {
    use std::sync::Arc;
    use stoker_core::source::MemorySource;
    use stoker_core::{DType, SourceSpec};
    const N: usize = 6;
    let dir = tmp("json-iou-crop");
    let members: Vec<(String, Vec<u8>)> = (0..N)
        .flat_map(|i| {
            let (boxes, labels) = iou_boxes(i);
            let json = format!(r#"{{"boxes": {boxes:?}, "labels": {labels:?}}}"#);
            [
                (format!("d{i:03}.jpg"), coded_image(i, (W, H))),
                (format!("d{i:03}.json"), json.into_bytes()),
                (format!("d{i:03}.seg.png"), coded_mask((W, H))),
            ]
        })
        .collect();
    let path = dir.join("det.tar");
    write_tar(&path, &members);
    let options = |o: &mut LoaderOptions| {
        for (k, v) in [
            ("batch_size", "2"),
            ("ragged", "offsets"),
            ("seed", "11"),
            ("box_format", "xywh"),
            ("transform", IOU_SPEC),
        ] {
            o.set(k, v).unwrap();
        }
    };
    let mut o = LoaderOptions::new();
    o.set("source", &format!("tar:{}", path.display())).unwrap();
    o.set(
        "fields",
        "jpg:image,json#boxes:boxes,json#labels:labels,seg.png:mask",
    )
    .unwrap();
    options(&mut o);
    let from_tar = sorted_epoch(Loader::new(&o).unwrap());

    // The same samples as tensors: an RGB image, an int64 mask, ragged boxes and labels.
    let f32_rows = |i: usize| -> Vec<u8> {
        iou_boxes(i)
            .0
            .iter()
            .flat_map(|b| b.iter().flat_map(|v| v.to_ne_bytes()))
            .collect()
    };
    let labels = |i: usize| -> Vec<u8> {
        iou_boxes(i)
            .1
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect()
    };
    let mask: Vec<u8> = (0..N)
        .flat_map(|_| (0..W * H).flat_map(|p| (p as i64).to_ne_bytes()))
        .collect();
    let source = MemorySource::new()
        .with_tensor(
            "image",
            DType::U8,
            &[H, W, 3],
            (0..N).flat_map(coded_pixels).collect(),
        )
        .and_then(|s| s.with_tensor("mask", DType::I64, &[H, W], mask))
        .and_then(|s| s.with_ragged("boxes", DType::F32, &[4], (0..N).map(f32_rows).collect()))
        .and_then(|s| s.with_ragged("labels", DType::I64, &[], (0..N).map(labels).collect()))
        .unwrap();
    let mut o = LoaderOptions::new();
    options(&mut o);
    let o = o.with_source(SourceSpec::Custom(Arc::new(source)));
    let from_tensors = sorted_epoch(Loader::new(&o).unwrap());

    // One crop per sample, drawn from its boxes, for every field: the encoded image, its PNG
    // mask and its JSON boxes come out as the tensors do.
    assert_eq!(from_tar.len(), N / 2);
    assert_eq!(from_tar, from_tensors);
    // The crops cut: some box was dropped or some mask label is past the output's size.
    let kept: usize = from_tar
        .iter()
        .map(|b| b.iter().find(|f| f.0 == "labels").unwrap().2.len() / 8)
        .sum();
    let stored: usize = (0..N).map(|i| iou_boxes(i).1.len()).sum();
    let cut = kept < stored
        || from_tar.iter().any(|b| {
            let mask = &b.iter().find(|f| f.0 == "mask").unwrap().2;
            i64s(mask)
                .chunks_exact(32 * 32)
                .any(|m| m[0] != (W - 1) as i64)
        });
    assert!(cut, "random_iou_crop left every sample whole");
}

#[test]
fn keypoints_and_boxes_of_encoded_images_move_as_a_tensor_images_do() {
    use std::sync::Arc;
    use stoker_core::source::MemorySource;
    use stoker_core::{DType, SourceSpec};
    const N: usize = 4;
    let boxes = |i: usize| -> Vec<u8> {
        iou_boxes(i)
            .0
            .iter()
            .flat_map(|b| b.iter().flat_map(|v| v.to_ne_bytes()))
            .collect()
    };
    let points = |i: usize| -> Vec<u8> {
        (0..2 + i)
            .flat_map(|k| [(3 + 9 * k + i) as f32, (2 + 7 * k) as f32, 2.0])
            .flat_map(f32::to_ne_bytes)
            .collect()
    };
    let with_coords = |s: MemorySource| {
        s.with_ragged("boxes", DType::F32, &[4], (0..N).map(boxes).collect())
            .and_then(|s| s.with_ragged("points", DType::F32, &[3], (0..N).map(points).collect()))
            .unwrap()
    };
    let run = |source: MemorySource| {
        let mut o = LoaderOptions::new();
        for (k, v) in [
            ("batch_size", "2"),
            ("pad", "-1"),
            ("seed", "5"),
            (
                "transform",
                "fields(image=image, boxes=boxes:xywh, keypoints=points) | random_iou_crop \
                 | resize(24, 30) | hflip | affine(degrees=15)",
            ),
        ] {
            o.set(k, v).unwrap();
        }
        sorted_epoch(Loader::new(&o.with_source(SourceSpec::Custom(Arc::new(source)))).unwrap())
    };
    let encoded = MemorySource::new()
        .with_encoded_images("image", (0..N).map(|i| coded_image(i, (W, H))).collect())
        .unwrap();
    let tensors = MemorySource::new()
        .with_tensor(
            "image",
            DType::U8,
            &[H, W, 3],
            (0..N).flat_map(coded_pixels).collect(),
        )
        .unwrap();
    let from_encoded = run(with_coords(encoded));
    let from_tensors = run(with_coords(tensors));
    assert_eq!(from_encoded.len(), N / 2);
    assert_eq!(from_encoded, from_tensors);
}
