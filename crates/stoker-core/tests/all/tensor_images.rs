//! Image-shaped uint8 tensors (`[H, W, 3]` or `[3, H, W]`) from every tensor source — npy, tar
//! `npy` members, packed tensor fields, in-memory sources — go through `transform`, `dtype` and
//! `layout` as decoded images do. Their size is known, so the spec need not fix it: `dtype`
//! alone converts, `layout` alone transposes, and operations such as `color_jitter` may come
//! first; `layout=nchw` said outright transposes an `[H, W, 3]` tensor, which no image option
//! leaves as stored. A spec that cannot fit the tensors is refused at construction, naming the
//! field. A callback source's images may vary in size when the transform fixes the output size.

use std::path::Path;
use std::sync::Arc;

use stoker_core::pack::{pack, PackOptions};
use stoker_core::source::{npy_bytes, write_npy, MemorySource, PackedSource};
use stoker_core::{Batch, DType, Loader, LoaderOptions, Source, SourceSpec};

use crate::support::files::{tmp, write_tar};

const N: usize = 6;
const H: usize = 4;
const W: usize = 5;

/// `N` images as `[N, H, W, 3]` uint8, every value distinct enough to catch a transposition.
fn hwc_images() -> Vec<u8> {
    (0..N * H * W * 3).map(|i| (i * 7 % 256) as u8).collect()
}

/// `hwc` (`[N, H, W, 3]`) as `[N, 3, H, W]`.
fn to_chw(hwc: &[u8]) -> Vec<u8> {
    let mut out = vec![0; hwc.len()];
    for n in 0..N {
        for y in 0..H {
            for x in 0..W {
                for c in 0..3 {
                    out[((n * 3 + c) * H + y) * W + x] = hwc[((n * H + y) * W + x) * 3 + c];
                }
            }
        }
    }
    out
}

/// `hwc` with each image flipped left to right.
fn hflipped(hwc: &[u8]) -> Vec<u8> {
    let mut out = vec![0; hwc.len()];
    for n in 0..N {
        for y in 0..H {
            for x in 0..W {
                let from = ((n * H + y) * W + (W - 1 - x)) * 3;
                let to = ((n * H + y) * W + x) * 3;
                out[to..to + 3].copy_from_slice(&hwc[from..from + 3]);
            }
        }
    }
    out
}

fn loader(source: &str, kv: &[(&str, &str)]) -> stoker_core::Result<Loader> {
    let mut o = LoaderOptions::new();
    o.set("source", source)?;
    with_options(o, kv)
}

fn memory_loader(source: Arc<dyn Source>, kv: &[(&str, &str)]) -> stoker_core::Result<Loader> {
    with_options(
        LoaderOptions::new().with_source(SourceSpec::Custom(source)),
        kv,
    )
}

fn with_options(mut o: LoaderOptions, kv: &[(&str, &str)]) -> stoker_core::Result<Loader> {
    o.set("batch_size", &N.to_string())?;
    for (k, v) in kv {
        o.set(k, v)?;
    }
    Loader::new(&o)
}

/// The first batch's field `name`: its dtype, shape and bytes.
fn first(l: &mut Loader, name: &str) -> (DType, Vec<usize>, Vec<u8>) {
    let b: Batch = l.next().expect("no error").expect("a batch");
    let f = b.field_by_name(name).expect("the field");
    (
        f.dtype,
        f.shape.to_vec(),
        f.data.expect("host data").to_vec(),
    )
}

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

fn npy(dir: &Path, name: &str, shape: &[usize], data: &[u8]) -> String {
    let path = dir.join(name);
    write_npy(&path, DType::U8, shape, data).unwrap();
    format!("npy:{}", path.display())
}

#[test]
fn dtype_alone_converts_and_layout_alone_transposes_without_a_transform() {
    let dir = tmp("alone");
    let hwc = hwc_images();
    let chw_source = npy(&dir, "chw.npy", &[N, 3, H, W], &to_chw(&hwc));

    // dtype=float32: x / 255, shape kept ([3, H, W] is read as chw and written as nchw).
    let (dtype, shape, bytes) = first(
        &mut loader(&chw_source, &[("dtype", "float32")]).unwrap(),
        "data",
    );
    assert_eq!((dtype, shape), (DType::F32, vec![N, 3, H, W]));
    let expected: Vec<f32> = to_chw(&hwc)
        .iter()
        .map(|&v| (v as f64 / 255.0) as f32)
        .collect();
    assert_eq!(floats(&bytes), expected);

    // layout=nhwc alone: the same uint8 values, channels last.
    let (dtype, shape, bytes) = first(
        &mut loader(&chw_source, &[("layout", "nhwc")]).unwrap(),
        "data",
    );
    assert_eq!((dtype, shape), (DType::U8, vec![N, H, W, 3]));
    assert_eq!(bytes, hwc);

    // layout=nchw said outright transposes an hwc file, which no image option leaves as stored.
    let hwc_source = npy(&dir, "hwc.npy", &[N, H, W, 3], &hwc);
    let (dtype, shape, bytes) = first(&mut loader(&hwc_source, &[]).unwrap(), "data");
    assert_eq!((dtype, shape), (DType::U8, vec![N, H, W, 3]));
    assert_eq!(bytes, hwc);
    let (dtype, shape, bytes) = first(
        &mut loader(&hwc_source, &[("layout", "nchw")]).unwrap(),
        "data",
    );
    assert_eq!((dtype, shape), (DType::U8, vec![N, 3, H, W]));
    assert_eq!(bytes, to_chw(&hwc));

    // float16 too, from an hwc file to nchw.
    let (dtype, shape, bytes) = first(
        &mut loader(&hwc_source, &[("dtype", "float16")]).unwrap(),
        "data",
    );
    assert_eq!((dtype, shape), (DType::F16, vec![N, 3, H, W]));
    let halves: Vec<u8> = to_chw(&hwc)
        .iter()
        .flat_map(|&v| {
            half::f16::from_f64(v as f64 / 255.0)
                .to_bits()
                .to_ne_bytes()
        })
        .collect();
    assert_eq!(bytes, halves);
}

#[test]
fn ops_that_need_a_known_size_may_come_first_on_tensors() {
    let dir = tmp("known");
    let source = npy(&dir, "hwc.npy", &[N, H, W, 3], &hwc_images());
    for spec in [
        "color_jitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1) | hflip",
        "trivial_augment | random_erasing(p=1)",
        "resize(8) | random_crop(8, padding=2)",
        "normalize(mean=0.5, std=0.25)",
    ] {
        let mut l = loader(&source, &[("transform", spec), ("dtype", "float32")])
            .unwrap_or_else(|e| panic!("{spec}: {e}"));
        let (dtype, shape, _) = first(&mut l, "data");
        let (h, w) = if spec.starts_with("resize") {
            // resize(8) sets the shorter side (H = 4) to 8: W = int(8 * 5 / 4) = 10, then the
            // random crop takes 8x8.
            (8, 8)
        } else {
            (H, W)
        };
        assert_eq!((dtype, shape), (DType::F32, vec![N, 3, h, w]), "{spec}");
    }
    // The same draws whatever num_workers, as for decoded images.
    let spec = "color_jitter(brightness=0.4, hue=0.2) | rotate(30) | hflip";
    let run = |workers: &str| {
        let mut l = loader(
            &source,
            &[
                ("transform", spec),
                ("num_workers", workers),
                ("shuffle", "true"),
                ("seed", "9"),
                ("batch_size", "2"),
            ],
        )
        .unwrap();
        l.epoch_iter()
            .map(|b| {
                let b = b.unwrap();
                b.field_by_name("data").unwrap().data.unwrap().to_vec()
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(run("0"), run("3"));
}

#[test]
fn a_spec_that_cannot_fit_the_tensors_is_refused_at_construction_naming_the_field() {
    let dir = tmp("refused");
    let source = npy(&dir, "hwc.npy", &[N, H, W, 3], &hwc_images());
    let e = loader(&source, &[("transform", "center_crop(10)")])
        .expect_err("refused")
        .to_string();
    assert!(
        e.contains("transform") && e.contains("field `data` (5x4)") && e.contains("center_crop"),
        "{e}"
    );
    // Encoded images still need the size fixed: their sizes vary.
    let jpeg = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/images/photo_444.jpg"),
    )
    .unwrap();
    write_tar(
        &dir.join("s.tar"),
        &[
            ("a.jpg".to_owned(), jpeg),
            ("a.cls".to_owned(), b"0".to_vec()),
        ],
    );
    let e = loader(
        &format!("tar:{}", dir.join("s.tar").display()),
        &[("dtype", "float32")],
    )
    .expect_err("refused")
    .to_string();
    assert!(e.contains("must all have one size"), "{e}");
}

#[test]
fn tar_npy_members_follow_input_layout() {
    let dir = tmp("tar");
    let hwc = hwc_images();
    let chw = to_chw(&hwc);
    let image = H * W * 3;
    let write = |name: &str, data: &[u8], shape: &[usize]| {
        let mut members = Vec::new();
        for i in 0..N {
            let bytes = npy_bytes(DType::U8, shape, &data[i * image..(i + 1) * image]).unwrap();
            members.push((format!("s{i:03}.npy"), bytes));
            members.push((format!("s{i:03}.cls"), i.to_string().into_bytes()));
        }
        let path = dir.join(name);
        write_tar(&path, &members);
        format!("tar:{}", path.display())
    };
    let hwc_tar = write("hwc.tar", &hwc, &[H, W, 3]);
    let chw_tar = write("chw.tar", &chw, &[3, H, W]);
    let fields = ("fields", "npy:image,cls:label");

    // hwc members, said so, flipped and delivered channels last.
    let mut l = loader(
        &hwc_tar,
        &[
            fields,
            ("input_layout", "hwc"),
            ("layout", "nhwc"),
            ("transform", "hflip(p=1)"),
        ],
    )
    .unwrap();
    let (dtype, shape, bytes) = first(&mut l, "image");
    assert_eq!((dtype, shape), (DType::U8, vec![N, H, W, 3]));
    assert_eq!(bytes, hflipped(&hwc));

    // chw members, said so, delivered channels last without a transform: the transposition.
    let mut l = loader(
        &chw_tar,
        &[fields, ("input_layout", "chw"), ("layout", "nhwc")],
    )
    .unwrap();
    assert_eq!(first(&mut l, "image").2, hwc);

    // The wrong input_layout for the members' shape leaves them tensors, so a transform is
    // refused rather than reading planes as pixels.
    let e = loader(
        &chw_tar,
        &[fields, ("input_layout", "hwc"), ("transform", "hflip")],
    )
    .expect_err("refused")
    .to_string();
    assert!(e.contains("input_layout"), "{e}");
}

#[test]
fn packed_tensor_fields_are_transformed_like_the_source_they_came_from() {
    let dir = tmp("packed");
    let hwc = hwc_images();
    let labels: Vec<u8> = (0..N as i64).flat_map(|i| i.to_ne_bytes()).collect();
    let src: Arc<dyn Source> = Arc::new(
        MemorySource::new()
            .with_tensor("image", DType::U8, &[3, H, W], to_chw(&hwc))
            .unwrap()
            .with_tensor("label", DType::I64, &[], labels)
            .unwrap(),
    );
    let out = dir.join("d.stkpack");
    pack(&*src, &out, &PackOptions::default(), &|_, _| {}).unwrap();
    assert_eq!(PackedSource::open(out.to_str().unwrap()).unwrap().len(), N);

    let kv = [
        ("transform", "hflip(p=1) | normalize(mean=0.5, std=0.5)"),
        ("layout", "nhwc"),
    ];
    let from_pack = first(
        &mut loader(&format!("packed:{}", out.display()), &kv).unwrap(),
        "image",
    );
    let from_memory = first(&mut memory_loader(src, &kv).unwrap(), "image");
    assert_eq!(from_pack, from_memory);
    assert_eq!(
        (from_pack.0, from_pack.1.clone()),
        (DType::F32, vec![N, H, W, 3])
    );
    let expected: Vec<f32> = hflipped(&hwc)
        .iter()
        .map(|&v| ((v as f64 / 255.0 - 0.5) / 0.5) as f32)
        .collect();
    let got = floats(&from_pack.2);
    assert!(
        got.iter().zip(&expected).all(|(a, b)| (a - b).abs() < 1e-6),
        "normalized values"
    );
}

#[test]
fn mixup_on_tensor_images_needs_no_sizing_op() {
    let hwc = hwc_images();
    let labels: Vec<u8> = (0..N as i64).flat_map(|i| (i % 3).to_ne_bytes()).collect();
    let src: Arc<dyn Source> = Arc::new(
        MemorySource::new()
            .with_tensor("image", DType::U8, &[H, W, 3], hwc)
            .unwrap()
            .with_tensor("label", DType::I64, &[], labels)
            .unwrap(),
    );
    let mut l = memory_loader(
        src,
        &[
            ("transform", "mixup(alpha=1.0, num_classes=3)"),
            ("dtype", "float32"),
        ],
    )
    .unwrap();
    let b = l.next().unwrap().unwrap();
    let image = b.field_by_name("image").unwrap();
    assert_eq!(image.shape, &[N, 3, H, W]);
    let label = b.field_by_name("label").unwrap();
    assert_eq!((label.dtype, label.shape), (DType::F32, &[N, 3][..]));
    // Soft labels: each row sums to 1.
    for row in floats(label.data.unwrap()).chunks_exact(3) {
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-5, "{row:?}");
    }
}

#[test]
fn mixup_draws_apart_on_each_rank_and_alike_whatever_num_workers() {
    // 4 ranks' worth of samples, labels 0..4 so the two samples mixed always differ.
    let n = 64;
    let images: Vec<u8> = (0..n * H * W * 3).map(|i| (i % 251) as u8).collect();
    let labels: Vec<u8> = (0..n as i64).flat_map(|i| (i % 4).to_ne_bytes()).collect();
    let src: Arc<dyn Source> = Arc::new(
        MemorySource::new()
            .with_tensor("image", DType::U8, &[H, W, 3], images)
            .unwrap()
            .with_tensor("label", DType::I64, &[], labels)
            .unwrap(),
    );
    // Each batch's lam, read off its first soft label (the larger of lam and 1 - lam).
    let lams = |rank: usize, workers: usize| -> Vec<f32> {
        let mut l = memory_loader(
            src.clone(),
            &[
                ("transform", "mixup(alpha=1.0, num_classes=4)"),
                ("batch_size", "4"),
                ("rank", &rank.to_string()),
                ("world_size", "2"),
                ("num_workers", &workers.to_string()),
                ("seed", "5"),
            ],
        )
        .unwrap();
        l.epoch_iter()
            .map(|b| {
                let b = b.unwrap();
                let row = floats(b.field_by_name("label").unwrap().data.unwrap());
                row[..4].iter().copied().fold(0.0, f32::max)
            })
            .collect()
    };
    let rank0 = lams(0, 0);
    let rank1 = lams(1, 0);
    assert_eq!(rank0.len(), 8);
    let same = rank0.iter().zip(&rank1).filter(|(a, b)| a == b).count();
    assert_eq!(same, 0, "rank 0 {rank0:?}\nrank 1 {rank1:?}");
    assert_eq!(lams(0, 3), rank0);
    assert_eq!(lams(1, 2), rank1);
}

/// An `h`x`w` image, every pixel distinct enough to catch a transposition.
fn image(h: usize, w: usize, seed: usize) -> Vec<u8> {
    (0..h * w * 3)
        .map(|i| ((i * 7 + seed * 31) % 256) as u8)
        .collect()
}

/// The sizes the varying-size callback tests give sample `i`.
fn size_of(i: usize) -> (usize, usize) {
    [(4, 5), (7, 3), (6, 6), (3, 8)][i % 4]
}

/// A callback source of `n` images of the sizes `size_of` gives, as `[H, W, 3]` or (`chw`)
/// `[3, H, W]` uint8 tensors in field `data`, with labels.
fn varying_callback(n: usize, chw: bool) -> SourceSpec {
    use stoker_core::source::ReadFn;
    let read: Arc<ReadFn> = Arc::new(move |i, w| {
        let (h, wd) = size_of(i);
        let hwc = image(h, wd, i);
        if chw {
            let chw: Vec<u8> = (0..3 * h * wd)
                .map(|j| hwc[(j % (h * wd)) * 3 + j / (h * wd)])
                .collect();
            w.put_tensor("data", DType::U8, &[3, h, wd], &chw)?;
        } else {
            w.put_tensor("data", DType::U8, &[h, wd, 3], &hwc)?;
        }
        w.put_label(i as i64)
    });
    SourceSpec::Callback { len: n, read }
}

#[test]
fn callback_images_may_vary_in_size_when_the_transform_fixes_it() {
    let spec = "resize(3, 4) | hflip(p=1)";
    for (chw, extra) in [(false, None), (true, None), (true, Some("chw"))] {
        let mut o = LoaderOptions::new().with_source(varying_callback(8, chw));
        o.set("num_workers", "2").unwrap();
        if let Some(layout) = extra {
            o.set("input_layout", layout).unwrap();
        }
        let mut l = with_options(o, &[("transform", spec)]).unwrap();
        let b = l.next().unwrap().unwrap();
        let f = b.field_by_name("data").unwrap();
        assert_eq!((f.dtype, f.shape), (DType::U8, &[N, 3, 3, 4][..]));
        let got = f.data.unwrap();
        // Each sample is what the transform makes of that image alone (an npy of its size).
        let dir = tmp(&format!("varying_callback_{chw}_{extra:?}"));
        for i in 0..N {
            let (h, w) = size_of(i);
            let one = npy(&dir, &format!("{i}.npy"), &[1, h, w, 3], &image(h, w, i));
            let mut o = LoaderOptions::new();
            o.set("source", &one).unwrap();
            o.set("batch_size", "1").unwrap();
            o.set("transform", spec).unwrap();
            let mut alone = Loader::new(&o).unwrap();
            let (_, _, want) = first(&mut alone, "data");
            assert_eq!(
                &got[i * 36..(i + 1) * 36],
                &want[..],
                "sample {i}, chw={chw}"
            );
        }
    }
}

#[test]
fn callback_images_of_varying_size_without_a_sizing_transform_say_what_fixes_it() {
    for transform in [None, Some("hflip")] {
        let mut o = LoaderOptions::new().with_source(varying_callback(8, false));
        if let Some(spec) = transform {
            o.set("transform", spec).unwrap();
        }
        let mut l = with_options(o, &[]).unwrap();
        let e = l.next().unwrap_err().to_string();
        assert!(
            e.contains("sample 1")
                && e.contains("field `data` is uint8 [7, 3, 3] but sample 0 had uint8 [4, 5, 3]")
                && e.contains("random_resized_crop(S)"),
            "{transform:?}: {e}"
        );
    }
}

/// A callback source of `n` samples as a segmentation and detection dataset written in Python
/// gives them: field `data` an `[H, W, 3]` uint8 image, `mask` an `[H, W]` int32 mask of the
/// same size (each pixel's label a function of its place), `boxes` `[k, 4]` float32 and
/// `labels` `[k]` int64. `size(i)` is sample `i`'s height and width, `content(i)` which
/// sample's pixels and boxes it holds.
fn dense_callback(
    n: usize,
    size: impl Fn(usize) -> (usize, usize) + Send + Sync + 'static,
    content: impl Fn(usize) -> usize + Send + Sync + 'static,
) -> SourceSpec {
    use stoker_core::source::ReadFn;
    let read: Arc<ReadFn> = Arc::new(move |i, w| {
        let (h, wd) = size(i);
        let c = content(i);
        w.put_tensor("data", DType::U8, &[h, wd, 3], &image(h, wd, c))?;
        let mask: Vec<u8> = (0..h * wd)
            .flat_map(|p| ((p * 13 + c) as i32 % 97).to_ne_bytes())
            .collect();
        w.put_tensor("mask", DType::I32, &[h, wd], &mask)?;
        let k = c % 3 + 1;
        let boxes: Vec<u8> = (0..k)
            .flat_map(|b| {
                let (x, y) = ((b % wd) as f32, (b % h) as f32);
                [x, y, x + 2.0, y + 1.5]
            })
            .flat_map(f32::to_ne_bytes)
            .collect();
        w.put_tensor("boxes", DType::F32, &[k, 4], &boxes)?;
        let labels: Vec<u8> = (0..k as i64).flat_map(i64::to_ne_bytes).collect();
        w.put_tensor("labels", DType::I64, &[k], &labels)
    });
    SourceSpec::Callback { len: n, read }
}

/// Images of varying size from a callback carry their mask and boxes under one draw: sample `i`
/// comes out as it does from a source whose every sample has sample `i`'s size and content
/// (whose images are tensors of one known size), the mask and boxes exactly, the image within
/// a level (the RGB pipeline against the plane-by-plane one).
#[test]
fn callback_images_of_varying_size_carry_their_masks_and_boxes() {
    let spec = "fields(image=data, mask=mask, boxes=boxes, labels=labels) \
                | random_resized_crop(6, scale=0.3:1) | hflip";
    let options = |source: SourceSpec| {
        let mut o = LoaderOptions::new().with_source(source);
        o.set("ragged", "offsets").unwrap();
        o.set("seed", "7").unwrap();
        o.set("transform", spec).unwrap();
        o
    };
    let sizes = |i: usize| [(9, 12), (14, 7), (11, 11), (8, 16)][i % 4];
    let mut varying = with_options(options(dense_callback(N, sizes, |i| i)), &[]).unwrap();
    let b = varying.next().unwrap().unwrap();
    let field = |b: &Batch, name: &str| b.field_by_name(name).unwrap().data.unwrap().to_vec();
    let offsets = |b: &Batch| -> Vec<i64> {
        field(b, "boxes_offsets")
            .chunks_exact(8)
            .map(|c| i64::from_ne_bytes(c.try_into().unwrap()))
            .collect()
    };
    let (image, mask, boxes) = (field(&b, "data"), field(&b, "mask"), field(&b, "boxes"));
    assert_eq!(b.field_by_name("mask").unwrap().dtype, DType::I64);
    let at = offsets(&b);
    for i in 0..N {
        let fixed = dense_callback(N, move |_| sizes(i), move |_| i);
        let mut alike = with_options(options(fixed), &[]).unwrap();
        let r = alike.next().unwrap().unwrap();
        let (px, plane) = (6 * 6 * 3, 6 * 6 * 8);
        let want = field(&r, "data");
        let got = &image[i * px..(i + 1) * px];
        let worst = got
            .iter()
            .zip(&want[i * px..(i + 1) * px])
            .map(|(a, b)| a.abs_diff(*b))
            .max();
        assert!(worst <= Some(1), "sample {i}: image off by {worst:?}");
        assert_eq!(
            &mask[i * plane..(i + 1) * plane],
            &field(&r, "mask")[i * plane..(i + 1) * plane],
            "sample {i}: mask"
        );
        let theirs = offsets(&r);
        let rows = |o: &[i64], i: usize| o[i] as usize * 16..o[i + 1] as usize * 16;
        assert_eq!(
            &boxes[rows(&at, i)],
            &field(&r, "boxes")[rows(&theirs, i)],
            "sample {i}: boxes"
        );
    }
}

/// A mask that is not `[H, W]` integer labels is refused with the sample and the field named.
#[test]
fn a_varying_size_mask_of_floats_is_refused_naming_the_field() {
    use stoker_core::source::ReadFn;
    let read: Arc<ReadFn> = Arc::new(|i, w| {
        let (h, wd) = size_of(i);
        w.put_tensor("data", DType::U8, &[h, wd, 3], &image(h, wd, i))?;
        if i == 2 {
            w.put_tensor("mask", DType::F32, &[h, wd], &vec![0; h * wd * 4])
        } else {
            w.put_tensor("mask", DType::U8, &[h, wd], &vec![1; h * wd])
        }
    });
    let mut o = LoaderOptions::new().with_source(SourceSpec::Callback { len: 4, read });
    o.set("batch_size", "4").unwrap();
    o.set("transform", "fields(image=data, mask=mask) | resize(4, 4)")
        .unwrap();
    let e = Loader::new(&o).unwrap().next().unwrap_err().to_string();
    assert!(
        e.contains("sample 2") && e.contains("field `mask` is float32") && e.contains("[H, W]"),
        "{e}"
    );
}
