//! The validated pipeline: its output size, type and layout, the per-channel lookup tables, and
//! [`Pipeline::apply`], which plans a decoded image and runs the kernels into the batch slot.

use fast_image_resize::Resizer;

use super::geometry::Plan;
use super::kernels::{resample, write_lut, write_u8, SrcView};
use super::spec::{parse, Op};
use crate::dtype::{DType, Layout};
use crate::rng::Rng;

/// Per-channel lookup tables: the output element for each 8-bit input value.
enum Lut {
    U8,
    F32(Box<[[f32; 256]; 3]>),
    Half(Box<[[u16; 256]; 3]>),
}

/// A parsed, validated pipeline with a fixed output size.
pub struct Pipeline {
    ops: Vec<Op>,
    height: usize,
    width: usize,
    dtype: DType,
    layout: Layout,
    lut: Lut,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("ops", &self.ops)
            .field("height", &self.height)
            .field("width", &self.width)
            .field("dtype", &self.dtype)
            .field("layout", &self.layout)
            .finish()
    }
}

/// Reusable memory for [`Pipeline::apply`]: the resampled RGB8 image and the resizer's own
/// buffers. Each worker keeps one; after warm-up a sample allocates only fast_image_resize's
/// small coefficient tables.
#[derive(Default)]
pub struct Scratch {
    resized: Vec<u8>,
    resizer: Resizer,
}

impl Pipeline {
    /// Builds the pipeline of `spec` (None: no transform). `dtype` None picks `float32` when the
    /// pipeline normalizes, else `uint8`. The pipeline must end in an operation that fixes the
    /// output size, so that every image of a batch has the same shape.
    pub fn new(
        spec: Option<&str>,
        dtype: Option<DType>,
        layout: Layout,
    ) -> Result<Pipeline, String> {
        let ops = match spec {
            Some(s) => parse(s)?,
            None => Vec::new(),
        };
        let mut size = None;
        let mut normalize = None;
        for op in &ops {
            match op {
                Op::ResizeShorter(_) => size = None,
                Op::Resize { height, width }
                | Op::CenterCrop { height, width }
                | Op::RandomResizedCrop { height, width, .. } => size = Some((*height, *width)),
                Op::HFlip { .. } => {}
                Op::Normalize { mean, std } => {
                    if normalize.is_some() {
                        return Err("normalize appears twice".into());
                    }
                    normalize = Some((*mean, *std));
                }
            }
        }
        let (height, width) = size.ok_or_else(|| {
            "images of a batch must all have one size: the transform must fix the output size \
             with resize(H, W), center_crop(S) or random_resized_crop(S) (e.g. \
             `resize(256) | center_crop(224)`)"
                .to_string()
        })?;
        let dtype = dtype.unwrap_or(if normalize.is_some() {
            DType::F32
        } else {
            DType::U8
        });
        // Each output element is lut[c][x] for input value x in channel c:
        //   with normalize:    (x / 255 - mean[c]) / std[c]
        //   float, no normalize: x / 255
        //   uint8, no normalize: x
        // computed in f64 and rounded once to the output type (half: round to nearest even).
        let value = |c: usize, x: usize| -> f64 {
            let x = x as f64 / 255.0;
            match normalize {
                Some((mean, std)) => (x - mean[c]) / std[c],
                None => x,
            }
        };
        let lut = match dtype {
            DType::U8 if normalize.is_some() => {
                return Err(
                    "normalize produces floats; use dtype float32, float16 or bfloat16".into(),
                )
            }
            DType::U8 => Lut::U8,
            DType::F32 => {
                let mut t = Box::new([[0f32; 256]; 3]);
                for (c, row) in t.iter_mut().enumerate() {
                    for (x, v) in row.iter_mut().enumerate() {
                        *v = value(c, x) as f32;
                    }
                }
                Lut::F32(t)
            }
            DType::F16 | DType::BF16 => {
                let mut t = Box::new([[0u16; 256]; 3]);
                for (c, row) in t.iter_mut().enumerate() {
                    for (x, v) in row.iter_mut().enumerate() {
                        *v = if dtype == DType::F16 {
                            half::f16::from_f64(value(c, x)).to_bits()
                        } else {
                            half::bf16::from_f64(value(c, x)).to_bits()
                        };
                    }
                }
                Lut::Half(t)
            }
            other => {
                return Err(format!(
                    "images can be uint8, float32, float16 or bfloat16, not {other}"
                ))
            }
        };
        Ok(Pipeline {
            ops,
            height,
            width,
            dtype,
            layout,
            lut,
        })
    }

    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// Output height and width.
    pub fn output_size(&self) -> (usize, usize) {
        (self.height, self.width)
    }

    /// Element type of the output.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Shape of one sample's output: `[3, H, W]` or `[H, W, 3]`.
    pub fn shape(&self) -> Vec<usize> {
        match self.layout {
            Layout::Nchw => vec![3, self.height, self.width],
            Layout::Nhwc => vec![self.height, self.width, 3],
        }
    }

    /// Bytes of one sample's output.
    pub fn output_bytes(&self) -> usize {
        self.height * self.width * 3 * self.dtype.size()
    }

    /// Folds the ops for a `width`x`height` decoded image, drawing the random choices from `rng`
    /// in op order.
    pub fn plan(&self, width: usize, height: usize, rng: &mut Rng) -> Result<Plan, String> {
        super::geometry::plan(&self.ops, width, height, rng)
    }

    /// Transforms a decoded RGB8 image (`width * height * 3` bytes) into `out`, with fresh
    /// scratch memory: for one-off use (a loader's workers call [`apply`](Self::apply)).
    pub fn apply_rgb(
        &self,
        rgb: &[u8],
        width: usize,
        height: usize,
        rng: &mut Rng,
        out: &mut [u8],
    ) -> Result<(), String> {
        self.apply(rgb, width, height, rng, out, &mut Scratch::default())
    }

    /// Transforms a decoded RGB8 image (`width * height * 3` bytes) into `out` (exactly
    /// [`output_bytes`](Self::output_bytes) bytes), drawing the random choices from `rng`.
    pub fn apply(
        &self,
        rgb: &[u8],
        width: usize,
        height: usize,
        rng: &mut Rng,
        out: &mut [u8],
        scratch: &mut Scratch,
    ) -> Result<(), String> {
        let Scratch { resized, resizer } = scratch;
        if out.len() != self.output_bytes() {
            return Err(format!(
                "output slot has {} bytes, the pipeline writes {}",
                out.len(),
                self.output_bytes()
            ));
        }
        if rgb.len() != width * height * 3 || width == 0 || height == 0 {
            return Err(format!(
                "decoded image has {} bytes, expected {width}x{height}x3",
                rgb.len()
            ));
        }
        let plan = self.plan(width, height, rng)?;
        if (plan.width, plan.height) != (self.width, self.height) {
            return Err(format!(
                "internal: planned {}x{}, pipeline output {}x{}",
                plan.width, plan.height, self.width, self.height
            ));
        }
        let (src, stride, x0, y0) = if plan.is_copy() {
            (rgb, width * 3, plan.rect[0] as usize, plan.rect[1] as usize)
        } else {
            resample(rgb, width, height, &plan, resized, resizer)?;
            (resized.as_slice(), plan.width * 3, 0, 0)
        };
        let img = SrcView {
            data: src,
            stride,
            x0,
            y0,
            width: plan.width,
            height: plan.height,
            flip: plan.flip,
        };
        match &self.lut {
            Lut::U8 => write_u8(&img, self.layout, out),
            Lut::F32(t) => write_lut(&img, self.layout, t, out, f32::to_ne_bytes),
            Lut::Half(t) => write_lut(&img, self.layout, t, out, u16::to_ne_bytes),
        }
        Ok(())
    }
}
