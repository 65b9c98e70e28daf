//! libjpeg-turbo through its TurboJPEG 3 API: a whole JPEG, or only the rectangle a crop reads,
//! optionally shrunk in the DCT domain (1/2, 1/4, 1/8).
//!
//! Why a C library beside zune-jpeg: decoding less is the only way past the decode wall, and
//! libjpeg-turbo can skip the MCU rows above and below a region (`jpeg_skip_scanlines`) and
//! the columns beside it (`jpeg_crop_scanline`), and run a smaller IDCT for a downscaled
//! output; zune-jpeg decodes whole images only. The library is built from vendored source by
//! turbojpeg-sys (CMake; SIMD with nasm), so nothing is needed at run time.
//!
//! A [`Turbo`] is one TurboJPEG decompressor, reused for every image a worker decodes until one
//! fails: then the caller throws it away (`decode::with_turbo`), because a failed call can leave
//! state behind that changes how the next image decodes:
//! - `tj3DecompressHeader` returns on an error without `jpeg_abort_decompress` (libjpeg-turbo
//!   3.1, `turbojpeg.c`), so the libjpeg decompressor stays in the middle of a header
//!   (`DSTATE_INHEADER`, with the marker reader's position and unread marker). The next header
//!   read does not start afresh: it goes on parsing the damaged file's state against the new
//!   image's bytes, and every later image fails ("Bogus Huffman table definition", "Bogus
//!   marker length") or, worse, could decode wrongly. A bad Huffman table or a zero frame
//!   width was enough (`tests/all/image_loader.rs` has both).
//! - The scaling factor and cropping region are handle parameters that persist across calls.
//!
//! `tj3Decompress8` does abort on its errors, but dropping the handle on every error, whatever
//! the call, does not depend on which paths of the C library clean up.

use std::ffi::CStr;
use std::ptr::NonNull;

use turbojpeg_sys as tj;

use super::Dims;

/// Progressive JPEGs with more scans than this are refused (libjpeg-turbo's advice against
/// scan-count denial of service: real encoders write at most a few dozen).
const SCAN_LIMIT: i32 = 500;

/// iMCU width in pixels per `TJSAMP_*` value (444, 422, 420, gray, 440, 411, 441): turbojpeg.h's
/// `tjMCUWidth`, which the header defines `static`, so the library does not export it.
const MCU_WIDTH: [usize; 7] = [8, 16, 16, 8, 8, 32, 8];
/// iMCU height in pixels per `TJSAMP_*` value (turbojpeg.h's `tjMCUHeight`).
const MCU_HEIGHT: [usize; 7] = [8, 8, 16, 8, 16, 8, 32];

/// The facts of a JPEG header that choose how to decode it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Header {
    pub(crate) dims: Dims,
    /// Chrominance subsampling (`TJSAMP_*`), `TJSAMP_UNKNOWN` for unusual factors.
    subsamp: i32,
    /// CMYK and YCCK cannot be converted to RGB by libjpeg-turbo.
    cmyk: bool,
    /// Lossless JPEGs cannot be cropped or scaled (no DCT).
    lossless: bool,
    /// Bits per sample; only 8 decodes to RGB8.
    precision: i32,
}

impl Header {
    /// Whether libjpeg-turbo can decode this JPEG into RGB8 at all.
    pub(crate) fn decodable(&self) -> bool {
        !self.cmyk && self.precision == 8
    }

    /// Whether it can decode a region of it, or a DCT-scaled version.
    pub(crate) fn croppable(&self) -> bool {
        self.decodable() && !self.lossless && self.subsamp >= 0 && (self.subsamp as usize) < 7
    }
}

/// A region of the (scaled) image: what [`Turbo::decompress`] decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Region {
    /// Left and top of the decoded pixels in the image shrunk by `1/scale`.
    pub(crate) x: usize,
    pub(crate) y: usize,
    /// Size of the decoded pixels.
    pub(crate) dims: Dims,
    /// DCT scaling denominator: 1, 2, 4 or 8.
    pub(crate) scale: usize,
}

/// One TurboJPEG decompressor.
pub(crate) struct Turbo {
    handle: NonNull<std::ffi::c_void>,
}

// SAFETY: a TurboJPEG handle holds no thread-local state; it must only not be used by two
// threads at once, which `&mut self` on every use guarantees.
unsafe impl Send for Turbo {}

impl Turbo {
    pub(crate) fn new() -> Result<Turbo, String> {
        // SAFETY: tj3Init has no preconditions; it returns NULL on failure.
        let raw = unsafe { tj::tj3Init(tj::TJINIT_TJINIT_DECOMPRESS as i32) };
        let handle = NonNull::new(raw).ok_or("libjpeg-turbo could not allocate a decompressor")?;
        let mut turbo = Turbo { handle };
        turbo.set(tj::TJPARAM_TJPARAM_SCANLIMIT, SCAN_LIMIT)?;
        Ok(turbo)
    }

    fn set(&mut self, param: tj::TJPARAM, value: i32) -> Result<(), String> {
        // SAFETY: the handle is valid for self's lifetime; tj3Set checks `param`.
        match unsafe { tj::tj3Set(self.handle.as_ptr(), param as i32, value) } {
            0 => Ok(()),
            _ => Err(self.error()),
        }
    }

    fn get(&mut self, param: tj::TJPARAM) -> i32 {
        // SAFETY: as in `set`.
        unsafe { tj::tj3Get(self.handle.as_ptr(), param as i32) }
    }

    fn error(&mut self) -> String {
        // SAFETY: tj3GetErrorStr returns a NUL-terminated string owned by the handle (or a
        // static one), valid until the next call on it; it is copied out at once.
        let text = unsafe { CStr::from_ptr(tj::tj3GetErrorStr(self.handle.as_ptr())) };
        text.to_string_lossy().into_owned()
    }

    /// Reads the header of `jpeg`.
    pub(crate) fn header(&mut self, jpeg: &[u8]) -> Result<Header, String> {
        // SAFETY: `jpeg` is a live slice of `jpeg.len()` bytes that the call only reads.
        let rc = unsafe {
            tj::tj3DecompressHeader(self.handle.as_ptr(), jpeg.as_ptr(), jpeg.len() as _)
        };
        if rc != 0 {
            return Err(classify(&self.error()));
        }
        let width = self.get(tj::TJPARAM_TJPARAM_JPEGWIDTH);
        let height = self.get(tj::TJPARAM_TJPARAM_JPEGHEIGHT);
        if width <= 0 || height <= 0 {
            return Err(format!(
                "corrupt or truncated JPEG: no frame size in its {} bytes",
                jpeg.len()
            ));
        }
        let colorspace = self.get(tj::TJPARAM_TJPARAM_COLORSPACE);
        Ok(Header {
            dims: Dims {
                width: usize::try_from(width).unwrap_or(0),
                height: usize::try_from(height).unwrap_or(0),
            },
            subsamp: self.get(tj::TJPARAM_TJPARAM_SUBSAMP),
            cmyk: colorspace == tj::TJCS_TJCS_CMYK as i32
                || colorspace == tj::TJCS_TJCS_YCCK as i32,
            lossless: self.get(tj::TJPARAM_TJPARAM_LOSSLESS) == 1,
            precision: self.get(tj::TJPARAM_TJPARAM_PRECISION),
        })
    }

    /// All of the image at full size.
    pub(crate) fn whole(header: &Header) -> Region {
        Region {
            x: 0,
            y: 0,
            dims: header.dims,
            scale: 1,
        }
    }

    /// The region of the image shrunk by `1/scale` to decode for `window` (`[x0, y0, x1, y1)`
    /// in full-size pixels): the window plus one iMCU on every side, its left edge moved left
    /// to an iMCU boundary as libjpeg-turbo needs. The margin is there because the pixels at a
    /// region's edge are not those of a whole decode (the chroma upsampling has no neighbour
    /// beyond the edge); one iMCU in, they are.
    pub(crate) fn region(header: &Header, window: [usize; 4], scale: usize) -> Region {
        let Dims { width, height } = header.dims;
        let (sw, sh) = (width.div_ceil(scale), height.div_ceil(scale));
        let mcu_w = MCU_WIDTH[header.subsamp as usize].div_ceil(scale);
        let mcu_h = MCU_HEIGHT[header.subsamp as usize].div_ceil(scale);
        let x0 =
            ((window[0] / scale).saturating_sub(mcu_w)).min(sw.saturating_sub(1)) / mcu_w * mcu_w;
        let y0 = (window[1] / scale)
            .saturating_sub(mcu_h)
            .min(sh.saturating_sub(1));
        let x1 = (window[2].div_ceil(scale) + mcu_w).clamp(x0 + 1, sw);
        let y1 = (window[3].div_ceil(scale) + mcu_h).clamp(y0 + 1, sh);
        Region {
            x: x0,
            y: y0,
            dims: Dims {
                width: x1 - x0,
                height: y1 - y0,
            },
            scale,
        }
    }

    /// Reads the header of `jpeg`, asks `region_of` which region of it to decode, and decodes
    /// that into `out` as packed RGB8 (the whole image when the region is all of it at scale 1);
    /// returns the region, or `None` when `region_of` declined. The header is read here, right
    /// before decompressing, because the cropping region and scaling factor are checked against
    /// the handle's current header. The caller checked the size against `max_image_pixels`.
    pub(crate) fn decompress(
        &mut self,
        jpeg: &[u8],
        region_of: impl FnOnce(&Header) -> Result<Option<Region>, String>,
        out: &mut Vec<u8>,
    ) -> Result<Option<Region>, String> {
        let header = self.header(jpeg)?;
        let Some(region) = region_of(&header)? else {
            return Ok(None);
        };
        let whole =
            region.scale == 1 && (region.x, region.y) == (0, 0) && region.dims == header.dims;
        let factor = tj::tjscalingfactor {
            num: 1,
            denom: region.scale as i32,
        };
        // SAFETY: the handle is valid; the factor is one of libjpeg-turbo's (1/1 .. 1/8).
        if unsafe { tj::tj3SetScalingFactor(self.handle.as_ptr(), factor) } != 0 {
            return Err(self.error());
        }
        let crop = if whole {
            tj::tjregion {
                x: 0,
                y: 0,
                w: 0,
                h: 0,
            }
        } else {
            tj::tjregion {
                x: region.x as i32,
                y: region.y as i32,
                w: region.dims.width as i32,
                h: region.dims.height as i32,
            }
        };
        // SAFETY: the handle is valid and has just read this JPEG's header; the region lies in
        // the scaled image with an iMCU-aligned left edge (`region`), which the call checks.
        if unsafe { tj::tj3SetCroppingRegion(self.handle.as_ptr(), crop) } != 0 {
            return Err(self.error());
        }
        let pitch = region.dims.width * 3;
        out.clear();
        out.resize(pitch * region.dims.height, 0);
        // SAFETY: `out` holds exactly `pitch * height` bytes for the decoded region (the scaled
        // size of the cropping region, which libjpeg-turbo writes row by row at `pitch`), and
        // `jpeg` is only read.
        let rc = unsafe {
            tj::tj3Decompress8(
                self.handle.as_ptr(),
                jpeg.as_ptr(),
                jpeg.len() as _,
                out.as_mut_ptr(),
                pitch as i32,
                tj::TJPF_TJPF_RGB,
            )
        };
        // A warning (extraneous bytes, a damaged restart interval) still decodes the image,
        // as Pillow accepts it; truncation was checked before (no end-of-image marker).
        // SAFETY: the handle is valid.
        if rc != 0
            && unsafe { tj::tj3GetErrorCode(self.handle.as_ptr()) }
                != tj::TJERR_TJERR_WARNING as i32
        {
            return Err(classify(&self.error()));
        }
        Ok(Some(region))
    }
}

impl Drop for Turbo {
    fn drop(&mut self) {
        // SAFETY: the handle came from tj3Init and is destroyed once.
        unsafe { tj::tj3Destroy(self.handle.as_ptr()) }
    }
}

/// libjpeg-turbo's message, prefixed like the zune-jpeg path's ("corrupt JPEG: ...").
fn classify(message: &str) -> String {
    let lower = message.to_ascii_lowercase();
    if lower.contains("premature end") {
        format!("truncated JPEG: {message}")
    } else if lower.contains("unsupported") || lower.contains("not supported") {
        format!("unsupported JPEG: {message}")
    } else {
        format!("corrupt JPEG: {message}")
    }
}
