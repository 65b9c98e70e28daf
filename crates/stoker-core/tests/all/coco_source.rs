//! COCO annotations through the loader: `coco:` and `coco_masks:` sources give boxes, labels
//! and a semantic mask drawn from polygons and crowd RLEs, in image id order; malformed
//! annotations are their samples' errors, and what the loader cannot open without fails at open.

use std::path::Path;

use stoker_core::{Loader, LoaderOptions};

use crate::dense_sources::{coded_image, f32s, i64s, H, W};
use crate::support::files::tmp;

/// A COCO layout: `ROOT/val/{id}.jpg` (coded images) and `ROOT/annotations/instances_val.json`
/// holding `annotations` (a JSON list) for images 3, 1 and 2, listed out of id order.
fn coco(root: &Path, annotations: &str) -> String {
    std::fs::create_dir_all(root.join("val")).unwrap();
    std::fs::create_dir_all(root.join("annotations")).unwrap();
    for id in 1..=3 {
        std::fs::write(
            root.join(format!("val/{id:012}.jpg")),
            coded_image(id, (W, H)),
        )
        .unwrap();
    }
    let images: Vec<String> = [3, 1, 2]
        .iter()
        .map(|id| {
            format!(r#"{{"id": {id}, "file_name": "{id:012}.jpg", "width": {W}, "height": {H}}}"#)
        })
        .collect();
    let json = format!(
        r#"{{"info": {{}}, "images": [{}], "annotations": {annotations}, "categories": [{{"id": 5, "name": "cat"}}]}}"#,
        images.join(", ")
    );
    let path = root.join("annotations/instances_val.json");
    std::fs::write(&path, json).unwrap();
    path.display().to_string()
}

fn coco_loader(spec: &str, kv: &[(&str, &str)]) -> stoker_core::Result<Loader> {
    let mut o = LoaderOptions::new();
    o.set("source", spec)?;
    o.set("batch_size", "3")?;
    o.set("ragged", "offsets")?;
    o.set(
        "transform",
        "fields(image=image, mask=mask, boxes=boxes:xywh, labels=labels) | center_crop(40, 48)",
    )?;
    for (k, v) in kv {
        o.set(k, v)?;
    }
    Loader::new(&o)
}

#[test]
fn coco_annotations_give_boxes_labels_and_a_drawn_mask() {
    let root = tmp("coco");
    // Image 1: a rectangle of category 5 and a crowd RLE of category 7 covering column 0, rows
    // 0..2 (column-major runs: 0 zeros, 2 ones, the rest zeros). Image 3: two overlapping
    // rectangles of categories 1 and 2, and a third of category 1 overlapping the first: both
    // overlaps are 255, as in torchvision's reference, the categories the same or not.
    let rle = format!(r#"{{"counts": [0, 2, {}], "size": [{H}, {W}]}}"#, W * H - 2);
    let annotations = format!(
        r#"[
        {{"id": 10, "image_id": 1, "category_id": 5, "bbox": [2, 1, 4, 3], "iscrowd": 0,
          "area": 12, "segmentation": [[2, 1, 6, 1, 6, 4, 2, 4]]}},
        {{"id": 11, "image_id": 1, "category_id": 7, "bbox": [0, 0, 1, 2], "iscrowd": 1,
          "area": 2, "segmentation": {rle}}},
        {{"id": 12, "image_id": 3, "category_id": 1, "bbox": [10, 10, 10, 10], "iscrowd": 0,
          "area": 100, "segmentation": [[10, 10, 20, 10, 20, 20, 10, 20]]}},
        {{"id": 13, "image_id": 3, "category_id": 2, "bbox": [15, 15, 10, 10], "iscrowd": 0,
          "area": 100, "segmentation": [[15, 15, 25, 15, 25, 25, 15, 25]]}},
        {{"id": 14, "image_id": 3, "category_id": 1, "bbox": [5, 5, 7, 7], "iscrowd": 0,
          "area": 49, "segmentation": [[5, 5, 12, 5, 12, 12, 5, 12]]}}
    ]"#
    );
    let ann = coco(&root, &annotations);
    let mut l = coco_loader(&format!("coco_masks:{ann}"), &[]).unwrap();
    let b = l.next().unwrap().unwrap();
    // In id order: 1, 2, 3 (blue is 10x the id).
    let px = b.field_by_name("image").unwrap().data.unwrap();
    let plane = W * H;
    assert_eq!([px[2 * plane], px[5 * plane], px[8 * plane]], [10, 20, 30]);
    assert_eq!(
        f32s(b.field_by_name("boxes").unwrap().data.unwrap()),
        [
            2.0, 1.0, 4.0, 3.0, 0.0, 0.0, 1.0, 2.0, 10.0, 10.0, 10.0, 10.0, 15.0, 15.0, 10.0, 10.0,
            5.0, 5.0, 7.0, 7.0
        ]
    );
    assert_eq!(
        i64s(b.field_by_name("labels").unwrap().data.unwrap()),
        [5, 7, 1, 2, 1]
    );
    assert_eq!(
        i64s(b.field_by_name("boxes_offsets").unwrap().data.unwrap()),
        [0, 2, 2, 5]
    );
    let masks = i64s(b.field_by_name("mask").unwrap().data.unwrap());
    let want = |id: usize, x: usize, y: usize| -> i64 {
        let r = |x0, y0, x1, y1| (x0..x1).contains(&x) && (y0..y1).contains(&y);
        match id {
            1 if r(2, 1, 6, 4) => 5,
            1 if x == 0 && y < 2 => 7,
            3 if r(15, 15, 20, 20) || r(10, 10, 12, 12) => 255,
            3 if r(5, 5, 12, 12) => 1,
            3 if r(10, 10, 20, 20) => 1,
            3 if r(15, 15, 25, 25) => 2,
            _ => 0,
        }
    };
    for (n, id) in [1, 2, 3].into_iter().enumerate() {
        for p in 0..plane {
            assert_eq!(
                masks[n * plane + p],
                want(id, p % W, p / W),
                "image {id} pixel {p}"
            );
        }
    }
    // Without `_masks`: no mask field, and no mask role needed.
    let mut o = LoaderOptions::new();
    o.set("source", &format!("coco:{ann}")).unwrap();
    o.set("batch_size", "3").unwrap();
    o.set("ragged", "offsets").unwrap();
    o.set(
        "transform",
        "fields(image=image, boxes=boxes:xywh, labels=labels) | hflip(p=1) | center_crop(40, 48)",
    )
    .unwrap();
    let b = Loader::new(&o).unwrap().next().unwrap().unwrap();
    assert!(b.field_by_name("mask").is_none());
    assert_eq!(
        &f32s(b.field_by_name("boxes").unwrap().data.unwrap())[..4],
        [42.0, 1.0, 4.0, 3.0]
    );
}

#[test]
fn bad_coco_annotations_are_their_samples_errors() {
    let cases = [
        (
            r#""bbox": [1, 1, 4], "segmentation": [[1, 1, 4, 1, 4, 4]]"#,
            "is not [x, y, width, height]",
        ),
        (
            r#""bbox": [1, 1, -4, 4], "segmentation": [[1, 1, 4, 1, 4, 4]]"#,
            "negative width or height",
        ),
        (
            r#""bbox": [40, 1, 20, 4], "segmentation": [[1, 1, 4, 1, 4, 4]]"#,
            "outside the 48x40 image",
        ),
        (
            r#""bbox": [1, 1, 4, 4], "segmentation": {"polygon": 3}"#,
            "is neither polygons",
        ),
        (
            r#""bbox": [1, 1, 4, 4], "segmentation": [[1, 1, 4]]"#,
            "at least 3 points",
        ),
        (
            r#""bbox": [1, 1, 4, 4], "segmentation": {"counts": "52", "size": [4, 4]}"#,
            "but the image is 40x48",
        ),
        (
            r#""bbox": [1, 1, 4, 4], "segmentation": {"counts": [5, 2], "size": [40, 48]}"#,
            "runs cover 7 pixels",
        ),
    ];
    for (bad, want) in cases {
        let root = tmp("coco-bad");
        let annotations = format!(r#"[{{"id": 1, "image_id": 2, "category_id": 3, {bad}}}]"#);
        let ann = coco(&root, &annotations);
        let spec = format!("coco_masks:{ann}");
        let e = match coco_loader(&spec, &[]).unwrap().next() {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{bad}: no error"),
        };
        assert!(
            e.contains(want) && e.contains("000000000002.jpg"),
            "{bad}: {e}"
        );
        let mut l = coco_loader(&spec, &[("on_error", "skip")]).unwrap();
        let n = l
            .next()
            .unwrap()
            .unwrap()
            .field_by_name("image")
            .unwrap()
            .shape[0];
        assert_eq!((n, l.stats().samples_skipped), (3, 1), "{bad}");
    }
    // What the loader cannot open without is refused at open, naming the file.
    let root = tmp("coco-unlisted");
    let ann = coco(
        &root,
        r#"[{"id": 1, "image_id": 9, "category_id": 3, "bbox": [1, 1, 2, 2]}]"#,
    );
    let Err(e) = coco_loader(&format!("coco:{ann}"), &[]) else {
        panic!("an annotation of an unlisted image fails at open")
    };
    let e = e.to_string();
    assert!(
        e.contains("image id 9") && e.contains("instances_val.json"),
        "{e}"
    );
}
