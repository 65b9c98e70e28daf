//! The `fields(...)` term that may open a spec: which field is the image, the mask, the boxes
//! and their labels, so that one draw moves them all (see `dense` and `boxes`).

use super::args::split_args;

/// The roles of fields that one draw applies to: `fields(image=NAME, mask=NAME, boxes=NAME,
/// labels=NAME, per_box=NAME,NAME, keypoints=NAME, ignore_index=V, min_size=V, min_area=V)` as
/// the first term of a spec. Every geometric op moves the mask with the
/// image; the mask is resampled nearest-neighbour, and what no source pixel covers is
/// `ignore_index`.
#[derive(Clone, Debug, PartialEq)]
pub struct Roles {
    /// The image field (transformed as any image; `None`: the source's image field).
    pub image: Option<String>,
    /// The segmentation mask field: an integer `[H, W]` tensor of the image's size.
    pub mask: Option<String>,
    /// The bounding-box field (float32 rows of 4, one row per box) and how a box is written.
    pub boxes: Option<(String, BoxFormat)>,
    /// The boxes' labels (one integer per box), dropped with the boxes a transform drops.
    pub labels: Option<String>,
    /// Other fields of one row per box (COCO's `iscrowd`, `area`, track ids), kept and dropped
    /// with their boxes as the labels are.
    pub per_box: Vec<String>,
    /// When a moved box is dropped.
    pub sanitize: Sanitize,
    /// The keypoint field: float32 rows of 2 (`x, y`) or 3 (`x, y, visibility`), one per point.
    pub keypoints: Option<String>,
    /// The label written where a geometric op uncovers the mask (default 255).
    pub ignore_index: i64,
}

/// When a moved box is dropped, as torchvision's `SanitizeBoundingBoxes(min_size, min_area)`:
/// a side under `min_size` or an area under `min_area`, in output pixels (defaults 1 and 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sanitize {
    /// Shortest side a kept box has.
    pub min_size: f64,
    /// Least area a kept box has.
    pub min_area: f64,
}

impl Default for Sanitize {
    fn default() -> Sanitize {
        Sanitize {
            min_size: 1.0,
            min_area: 1.0,
        }
    }
}

/// How a box's four numbers are written (torchvision's `BoundingBoxFormat`), in pixels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BoxFormat {
    /// Left, top, right, bottom.
    Xyxy,
    /// Left, top, width, height.
    Xywh,
    /// Centre x, centre y, width, height.
    Cxcywh,
}

impl BoxFormat {
    /// The format named `xyxy`, `xywh` or `cxcywh`.
    pub fn parse(name: &str) -> Option<BoxFormat> {
        match name {
            "xyxy" => Some(BoxFormat::Xyxy),
            "xywh" => Some(BoxFormat::Xywh),
            "cxcywh" => Some(BoxFormat::Cxcywh),
            _ => None,
        }
    }
}

/// `ignore_index` unless `fields(...)` says otherwise (torchvision's segmentation references).
pub const DEFAULT_IGNORE_INDEX: i64 = 255;

/// The roles named by a leading `fields(...)` term of `spec`; `None` without one. Boxes
/// without a `:FORMAT` suffix are `xyxy`.
pub fn roles(spec: &str) -> Result<Option<Roles>, String> {
    roles_with(spec, BoxFormat::Xyxy)
}

/// [`roles`], with boxes named without a `:FORMAT` suffix in `default_format` (the loader's
/// `box_format` option); a suffix wins over it.
pub fn roles_with(spec: &str, default_format: BoxFormat) -> Result<Option<Roles>, String> {
    let Some(first) = spec.split('|').next().map(str::trim) else {
        return Ok(None);
    };
    let Some(inner) = first
        .strip_prefix("fields")
        .map(str::trim_start)
        .and_then(|r| r.strip_prefix('('))
    else {
        return Ok(None);
    };
    let inner = inner
        .strip_suffix(')')
        .ok_or_else(|| format!("`{first}`: missing closing parenthesis"))?;
    let args = split_args(inner);
    let err = |e: String| format!("`{first}`: fields: {e}");
    args.check(
        0,
        &[
            "image",
            "mask",
            "boxes",
            "labels",
            "per_box",
            "keypoints",
            "ignore_index",
            "min_size",
            "min_area",
        ],
    )
    .map_err(err)?;
    let name = |role: &str| -> Result<Option<String>, String> {
        match args.named(role) {
            Some(n) if n.is_empty() || n.contains(',') => {
                Err(err(format!("{role}=`{n}` is not a field name")))
            }
            n => Ok(n.map(str::to_owned)),
        }
    };
    let ignore_index = match args.named("ignore_index") {
        None => DEFAULT_IGNORE_INDEX,
        Some(v) => v
            .parse::<i64>()
            .map_err(|_| err(format!("ignore_index=`{v}` is not an integer")))?,
    };
    let boxes = match name("boxes")? {
        None => None,
        Some(b) => {
            let (field, format) = match b.split_once(':') {
                None => (b.as_str(), default_format),
                Some((field, format)) => (
                    field,
                    BoxFormat::parse(format).ok_or_else(|| {
                        err(format!(
                            "boxes=`{b}`: box format `{format}` is not xyxy, xywh or cxcywh"
                        ))
                    })?,
                ),
            };
            if field.is_empty() {
                return Err(err(format!("boxes=`{b}` names no field")));
            }
            Some((field.to_owned(), format))
        }
    };
    let per_box = match args.named("per_box") {
        None => Vec::new(),
        Some(list) => {
            let names: Vec<String> = list.split(',').map(|n| n.trim().to_owned()).collect();
            if names.iter().any(String::is_empty) {
                return Err(err(format!(
                    "per_box=`{list}` is not a list of field names"
                )));
            }
            names
        }
    };
    let threshold = |key: &str, default: f64| match args.named(key) {
        None => Ok(default),
        Some(v) => match v.trim().parse::<f64>() {
            Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
            _ => Err(err(format!(
                "{key}=`{v}` is not a number of pixels (0 or more)"
            ))),
        },
    };
    let defaults = Sanitize::default();
    let sanitize = Sanitize {
        min_size: threshold("min_size", defaults.min_size)?,
        min_area: threshold("min_area", defaults.min_area)?,
    };
    let roles = Roles {
        image: name("image")?,
        mask: name("mask")?,
        boxes,
        labels: name("labels")?,
        per_box,
        sanitize,
        keypoints: name("keypoints")?,
        ignore_index,
    };
    if roles.mask.is_none() && roles.boxes.is_none() && roles.keypoints.is_none() {
        return Err(err(
            "names no mask, boxes or keypoints: write fields(image=NAME, mask=NAME), \
             fields(image=NAME, boxes=NAME, labels=NAME) or fields(image=NAME, keypoints=NAME)"
                .into(),
        ));
    }
    if roles.boxes.is_none() {
        for key in ["labels", "per_box", "min_size", "min_area"] {
            if args.named(key).is_some() {
                return Err(err(format!("{key}= is about boxes: give boxes= too")));
            }
        }
    }
    let named: Vec<&str> = [
        roles.image.as_deref(),
        roles.mask.as_deref(),
        roles.boxes.as_ref().map(|(b, _)| b.as_str()),
        roles.labels.as_deref(),
        roles.keypoints.as_deref(),
    ]
    .into_iter()
    .flatten()
    .chain(roles.per_box.iter().map(String::as_str))
    .collect();
    if (1..named.len()).any(|i| named[..i].contains(&named[i])) {
        return Err(err("each role needs a field of its own".into()));
    }
    Ok(Some(roles))
}
