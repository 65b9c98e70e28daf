//! `coco:ANNOTATIONS` and `coco_masks:ANNOTATIONS`: COCO detection annotations beside their
//! images.
//!
//! The annotation file is COCO's `instances_*.json` (`images`, `annotations`; `categories` is
//! not needed). Its images are in the directory COCO's own layout puts them:
//! `ROOT/annotations/instances_NAME.json` reads `ROOT/NAME/FILE_NAME` (`instances_val2017.json`
//! → `val2017/`); any other annotation path reads `FILE_NAME` beside the JSON file. Samples are
//! the images in the order of their `id` (torchvision's `CocoDetection`), each with fields
//! `image`, `boxes` (float32 `[n, 4]`, COCO's `[x, y, width, height]`: name them
//! `fields(boxes=boxes:xywh)`), `labels` (int64 `category_id`, one per box), and under
//! `coco_masks:` also `mask`: a semantic mask of the image's size, each pixel the category of
//! the instance covering it, 0 where none does and 255 where two instances overlap, of the same
//! category or not (torchvision's segmentation reference, `ConvertCocoPolysToMask`), drawn from the
//! polygons and crowd RLEs of every annotation ([`raster`]). An image with no annotation has
//! no boxes.
//!
//! What the JSON must hold for the loader to open is checked at open (an image's id, file name
//! and size; an annotation's image id and category); what is wrong with one annotation's box or
//! segmentation is that sample's error, so `on_error=skip` can pass over it.

pub mod raster;

use std::collections::HashMap;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{FieldSpec, Sample, Source};
use crate::dtype::DType;
use crate::error::{io_reason, Error, Result};

/// Largest annotation file read (COCO's `instances_train2017.json` is 448 MB).
pub const MAX_ANNOTATION_BYTES: u64 = 4 << 30;
/// Largest image (width times height) a mask is drawn for.
pub const MAX_MASK_PIXELS: u64 = 1 << 28;
/// Most runs one RLE may have.
const MAX_RLE_RUNS: usize = 1 << 24;
/// The label of pixels where annotations overlap.
pub const OVERLAP_LABEL: u16 = 255;

#[derive(Deserialize)]
struct CocoFile {
    images: Vec<CocoImage>,
    #[serde(default)]
    annotations: Vec<CocoAnnotation>,
}

#[derive(Deserialize)]
struct CocoImage {
    id: u64,
    file_name: String,
    width: u32,
    height: u32,
}

#[derive(Deserialize)]
struct CocoAnnotation {
    image_id: u64,
    category_id: u16,
    /// Checked per sample: 4 finite numbers.
    #[serde(default)]
    bbox: Vec<f32>,
    #[serde(default)]
    segmentation: Option<Segmentation>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Segmentation {
    Polygons(Vec<Vec<f32>>),
    Rle {
        counts: RleCounts,
        size: Vec<u64>,
    },
    /// Anything else: that sample's error, in words.
    Other(serde::de::IgnoredAny),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RleCounts {
    Runs(Vec<u64>),
    Compressed(String),
}

struct Entry {
    path: PathBuf,
    width: u32,
    height: u32,
    annotations: Vec<CocoAnnotation>,
}

/// A COCO annotation file and its images (see the module docs).
pub struct CocoSource {
    annotations: PathBuf,
    entries: Vec<Entry>,
    fields: Vec<FieldSpec>,
}

/// Where the images of `annotations` are (see the module docs).
fn image_dir(annotations: &Path) -> PathBuf {
    let parent = annotations.parent().unwrap_or(Path::new("."));
    let name = annotations.file_stem().and_then(|s| s.to_str());
    match (
        name.and_then(|n| n.strip_prefix("instances_")),
        parent.file_name(),
    ) {
        (Some(split), Some(dir)) if dir == "annotations" => {
            parent.parent().unwrap_or(Path::new(".")).join(split)
        }
        _ => parent.to_path_buf(),
    }
}

impl CocoSource {
    /// Reads the annotation file; `masks` adds the `mask` field.
    pub fn open(annotations: &Path, masks: bool) -> Result<CocoSource> {
        let (mut file, meta) = super::open_file(annotations, "a COCO annotation file")?;
        if meta.len() > MAX_ANNOTATION_BYTES {
            return Err(Error::io(
                annotations,
                format!(
                    "is {} bytes, more than the {MAX_ANNOTATION_BYTES} a COCO annotation file \
                     may have here",
                    meta.len()
                ),
            ));
        }
        let mut text = Vec::with_capacity(meta.len() as usize);
        file.read_to_end(&mut text)
            .map_err(|e| Error::os(annotations, e))?;
        let coco: CocoFile = serde_json::from_slice(&text).map_err(|e| {
            Error::format(
                annotations.display().to_string(),
                format!("not a COCO annotation file (images with id, file_name, width, height; annotations with image_id, category_id): {e}"),
            )
        })?;
        drop(text);
        let dir = image_dir(annotations);
        if !dir.is_dir() {
            return Err(Error::io(
                &dir,
                format!(
                    "is not a directory: the images of {} are looked for there (COCO's layout: \
                     ROOT/annotations/instances_NAME.json with ROOT/NAME/)",
                    annotations.display()
                ),
            ));
        }
        let mut images = coco.images;
        images.sort_by_key(|i| i.id);
        let mut at: HashMap<u64, usize> = HashMap::with_capacity(images.len());
        let mut entries = Vec::with_capacity(images.len());
        for (n, image) in images.into_iter().enumerate() {
            if at.insert(image.id, n).is_some() {
                return Err(Error::format(
                    annotations.display().to_string(),
                    format!("image id {} is listed twice", image.id),
                ));
            }
            if masks && u64::from(image.width) * u64::from(image.height) > MAX_MASK_PIXELS {
                return Err(Error::format(
                    annotations.display().to_string(),
                    format!(
                        "image {} ({}) is {}x{}, more than the {MAX_MASK_PIXELS} pixels a mask \
                         is drawn for",
                        image.id, image.file_name, image.width, image.height
                    ),
                ));
            }
            entries.push(Entry {
                path: dir.join(&image.file_name),
                width: image.width,
                height: image.height,
                annotations: Vec::new(),
            });
        }
        for (n, a) in coco.annotations.into_iter().enumerate() {
            let Some(&i) = at.get(&a.image_id) else {
                return Err(Error::format(
                    annotations.display().to_string(),
                    format!(
                        "annotation {n} names image id {}, which is not listed",
                        a.image_id
                    ),
                ));
            };
            entries[i].annotations.push(a);
        }
        let mut fields = vec![
            FieldSpec::encoded_image("image"),
            FieldSpec::ragged("boxes", DType::F32, &[4]),
            FieldSpec::ragged("labels", DType::I64, &[]),
        ];
        if masks {
            fields.push(FieldSpec::encoded_image("mask"));
        }
        Ok(CocoSource {
            annotations: annotations.to_owned(),
            entries,
            fields,
        })
    }
}

/// The semantic mask of `entry` as a 16-bit grayscale PNG appended to `out`.
fn draw_mask(entry: &Entry, out: &mut Vec<u8>) -> std::result::Result<(), String> {
    let (w, h) = (entry.width as usize, entry.height as usize);
    let mut labels = vec![0u16; w * h];
    let mut cover = vec![false; w * h];
    // Pixels an earlier annotation covers: a second one makes them OVERLAP_LABEL, whatever the
    // categories, as torchvision's reference does (`target[masks.sum(0) > 1] = 255`).
    let mut taken = vec![false; w * h];
    for (n, a) in entry.annotations.iter().enumerate() {
        cover.fill(false);
        let what = |e: String| format!("annotation {n} (category {}): {e}", a.category_id);
        match &a.segmentation {
            None => continue,
            Some(Segmentation::Polygons(polygons)) => {
                for p in polygons {
                    raster::fill_polygon(p, w, h, &mut cover).map_err(what)?;
                }
            }
            Some(Segmentation::Rle { counts, size }) => {
                if size.as_slice() != [h as u64, w as u64] {
                    return Err(what(format!(
                        "its RLE is {size:?} (height, width) but the image is {h}x{w}"
                    )));
                }
                let runs = match counts {
                    RleCounts::Runs(r) => std::borrow::Cow::Borrowed(r),
                    RleCounts::Compressed(s) => {
                        std::borrow::Cow::Owned(raster::rle_counts(s, MAX_RLE_RUNS).map_err(what)?)
                    }
                };
                raster::fill_rle(&runs, w, h, &mut cover).map_err(what)?;
            }
            Some(Segmentation::Other(_)) => {
                return Err(what(
                    "its segmentation is neither polygons ([[x0, y0, ...], ...]) nor an RLE \
                     ({\"counts\": ..., \"size\": [h, w]})"
                        .into(),
                ))
            }
        }
        for ((l, t), &c) in labels.iter_mut().zip(&mut taken).zip(&cover) {
            if c {
                *l = if *t { OVERLAP_LABEL } else { a.category_id };
                *t = true;
            }
        }
    }
    let mut e = png::Encoder::new(&mut *out, entry.width, entry.height);
    e.set_color(png::ColorType::Grayscale);
    e.set_depth(png::BitDepth::Sixteen);
    e.set_compression(png::Compression::Fast);
    let bytes: Vec<u8> = labels.iter().flat_map(|l| l.to_be_bytes()).collect();
    e.write_header()
        .and_then(|mut writer| writer.write_image_data(&bytes))
        .map_err(|e| format!("internal: the mask could not be encoded: {e}"))
}

impl Source for CocoSource {
    fn len(&self) -> usize {
        self.entries.len()
    }

    fn fields(&self) -> &[FieldSpec] {
        &self.fields
    }

    fn describe(&self, index: usize) -> String {
        format!(
            "{} (annotated in {})",
            self.entries[index].path.display(),
            self.annotations.display()
        )
    }

    fn identity(&self) -> String {
        format!(
            "COCO annotations {} of {} images, fields {:?}",
            self.annotations.display(),
            self.len(),
            self.fields
        )
    }

    fn read<'a>(&'a self, index: usize, scratch: &'a mut Vec<u8>) -> Result<Sample<'a>> {
        let entry = &self.entries[index];
        let fail = |reason: String| Error::Sample {
            index: index as u64,
            what: self.describe(index),
            reason,
        };
        scratch.clear();
        fs::File::open(&entry.path)
            .and_then(|mut f| f.read_to_end(scratch))
            .map_err(|e| Error::io(&entry.path, format!("sample {index}: {}", io_reason(&e))))?;
        let image_end = scratch.len();
        for (n, a) in entry.annotations.iter().enumerate() {
            let &[x, y, w, h] = a.bbox.as_slice() else {
                return Err(fail(format!(
                    "annotation {n}: bbox {:?} is not [x, y, width, height]",
                    a.bbox
                )));
            };
            for v in [x, y, w, h] {
                scratch.extend_from_slice(&v.to_ne_bytes());
            }
        }
        let boxes_end = scratch.len();
        for a in &entry.annotations {
            scratch.extend_from_slice(&i64::from(a.category_id).to_ne_bytes());
        }
        let labels_end = scratch.len();
        if self.fields.len() > 3 {
            draw_mask(entry, scratch).map_err(fail)?;
        }
        let (image, rest) = scratch.split_at(image_end);
        let (boxes, rest) = rest.split_at(boxes_end - image_end);
        let (labels, mask) = rest.split_at(labels_end - boxes_end);
        let mut sample = Sample::default();
        sample.set(0, image);
        sample.set(1, boxes);
        sample.set(2, labels);
        if self.fields.len() > 3 {
            sample.set(3, mask);
        }
        // The JSON's size, checked against the image's own by the decoder.
        sample.set_image_size(0, entry.width, entry.height);
        Ok(sample)
    }
}
