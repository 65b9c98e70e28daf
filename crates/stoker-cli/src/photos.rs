//! An ImageNet-like folder of real photographs for the demo and the image benchmark.
//!
//! The photographs are the camera pictures of Debian's `mate-backgrounds` package (fetched with
//! `apt-get download` when they are not installed). Each photo becomes one class; each image of
//! the class is a different random crop of it, resized to ImageNet's typical 500×375 (or 375×500)
//! and re-encoded as JPEG quality 90, 4:2:0, like ImageNet's files. As in real datasets, a few
//! are progressive and a few grayscale. [`folder`] makes the same at other sizes, and
//! [`synthetic`] a folder of drawn images where the photographs cannot be had.

use std::path::{Path, PathBuf};
use std::process::Command;

use jpeg_encoder::{ColorType, Encoder};
use stoker_core::decode::{decode_rgb, DecodeBuffers};
use stoker_core::rng::{Rng, Stream};
use stoker_core::{DType, Layout, Pipeline};

/// Where the photographs are when the package is installed, and inside the package.
const PHOTO_DIR: &str = "usr/share/backgrounds/mate/nature";

/// The folder under `cache`, built once: `per_class` images for each photograph.
pub(crate) fn imagenet_like(cache: &Path, per_class: usize) -> Result<PathBuf, String> {
    folder(
        cache,
        &format!("imagenet-like-{per_class}"),
        per_class,
        IMAGENET,
    )
}

/// ImageNet's typical size: 500×375, crops of 15% to 60% of a photograph.
pub(crate) const IMAGENET: Size = Size {
    width: 500,
    height: 375,
    scale: (0.15, 0.6),
};

/// The size of the images of a folder: `width`×`height` (every fifth one turned to portrait),
/// each a crop of `scale` (a range of fractions of the photograph's area).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Size {
    pub(crate) width: usize,
    pub(crate) height: usize,
    pub(crate) scale: (f64, f64),
}

/// The folder `cache/name`, built once: `per_class` crops of `size` of each photograph.
pub(crate) fn folder(
    cache: &Path,
    name: &str,
    per_class: usize,
    size: Size,
) -> Result<PathBuf, String> {
    let root = cache.join(name);
    let done = root.join(".complete");
    if done.exists() {
        return Ok(root);
    }
    let photos = photographs(cache)?;
    eprintln!(
        "building {} from {} photographs ({} images each) ...",
        root.display(),
        photos.len(),
        per_class
    );
    let _ = std::fs::remove_dir_all(&root);
    // A thread per core: the classes are independent, and each is the same whichever thread
    // makes it (its crops are drawn from its own name).
    let per_thread = photos.len().div_ceil(stoker_core::launch::usable_cores());
    std::thread::scope(|s| {
        let built: Vec<_> = photos
            .chunks(per_thread)
            .map(|chunk| s.spawn(|| build_classes(chunk, &root, per_class, size)))
            .collect();
        built.into_iter().try_for_each(|thread| {
            thread
                .join()
                .map_err(|_| "a worker thread panicked".to_string())?
        })
    })?;
    std::fs::write(&done, b"").map_err(|e| format!("{}: {e}", done.display()))?;
    Ok(root)
}

/// A folder of about `images` images of `size`, built once under `cache`: crops of the
/// photographs, or drawn images ([`synthetic`]) when `drawn` is asked for or the photographs
/// cannot be had, in which case the second value says why.
pub(crate) fn photos_or_drawn(
    cache: &Path,
    images: usize,
    size: Size,
    drawn: bool,
) -> Result<(PathBuf, Option<String>), String> {
    let (w, h) = (size.width, size.height);
    let why = if drawn {
        "drawn images asked for".to_owned()
    } else {
        match photographs(cache) {
            Ok(photos) => {
                let per_class = images.div_ceil(photos.len()).max(1);
                let name = if size == IMAGENET {
                    format!("imagenet-like-{per_class}")
                } else {
                    format!("photos-{w}x{h}-{per_class}")
                };
                return Ok((folder(cache, &name, per_class, size)?, None));
            }
            Err(e) => format!("no photographs ({e}); drawn images instead"),
        }
    };
    let per_class = images.div_ceil(SYNTHETIC_CLASSES).max(1);
    let root = synthetic(
        cache,
        &format!("drawn-{w}x{h}-{per_class}"),
        per_class,
        w,
        h,
    )?;
    Ok((root, Some(why)))
}

/// Classes of a synthetic folder.
const SYNTHETIC_CLASSES: usize = 4;

/// A folder `cache/name` of drawn `width`×`height` JPEGs (quality 90), `per_class` in each of
/// four classes, built once: smooth gradients with a texture of noise, so that they compress
/// and decode about as photographs do. For machines where the photographs cannot be had.
pub(crate) fn synthetic(
    cache: &Path,
    name: &str,
    per_class: usize,
    width: usize,
    height: usize,
) -> Result<PathBuf, String> {
    let root = cache.join(name);
    let done = root.join(".complete");
    if done.exists() {
        return Ok(root);
    }
    let _ = std::fs::remove_dir_all(&root);
    let (w, h) = (
        u16::try_from(width).map_err(|_| format!("{width} px is too wide for a JPEG"))?,
        u16::try_from(height).map_err(|_| format!("{height} px is too tall for a JPEG"))?,
    );
    let mut rgb = vec![0u8; width * height * 3];
    for class in 0..SYNTHETIC_CLASSES {
        let dir = root.join(format!("class{class}"));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for k in 0..per_class {
            let mut rng = Rng::for_key(class as u64, Stream::Augment, 0, k as u64);
            draw(&mut rgb, width, height, &mut rng);
            let mut jpeg = Vec::new();
            Encoder::new(&mut jpeg, 90)
                .encode(&rgb, w, h, ColorType::Rgb)
                .map_err(|e| format!("encoding a synthetic image: {e}"))?;
            let path = dir.join(format!("class{class}_{k:05}.JPEG"));
            std::fs::write(&path, &jpeg).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    std::fs::write(&done, b"").map_err(|e| format!("{}: {e}", done.display()))?;
    Ok(root)
}

/// Draws a gradient whose colours and direction come from `rng`, with noise of ±16 levels.
fn draw(rgb: &mut [u8], width: usize, height: usize, rng: &mut Rng) {
    let mut level = [0f64; 7];
    for v in &mut level {
        *v = (rng.next_u64() % 256) as f64;
    }
    let (from, to, tilt) = (&level[0..3], &level[3..6], level[6] / 255.0);
    let mut noise = rng.next_u64() | 1;
    for (i, px) in rgb.chunks_exact_mut(3).enumerate() {
        let (x, y) = ((i % width) as f64, (i / width) as f64);
        let t = (tilt * x / width as f64 + (1.0 - tilt) * y / height as f64).clamp(0.0, 1.0);
        for c in 0..3 {
            // xorshift: cheap noise, different in every channel.
            noise ^= noise << 13;
            noise ^= noise >> 7;
            noise ^= noise << 17;
            let v = from[c] + (to[c] - from[c]) * t + (noise % 33) as f64 - 16.0;
            px[c] = v.clamp(0.0, 255.0) as u8;
        }
    }
}

/// The default cache directory: `$XDG_CACHE_HOME/stoker` or `~/.cache/stoker`.
pub(crate) fn cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("stoker")
}

/// The `.jpg` photographs, installed or unpacked from the downloaded package into `cache`.
fn photographs(cache: &Path) -> Result<Vec<PathBuf>, String> {
    let installed = Path::new("/").join(PHOTO_DIR);
    let unpacked = cache.join("mate-backgrounds").join(PHOTO_DIR);
    let dir = if installed.is_dir() {
        installed
    } else {
        if !unpacked.is_dir() {
            fetch_package(&cache.join("mate-backgrounds"))?;
        }
        unpacked
    };
    let mut photos: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x.eq_ignore_ascii_case("jpg")))
        .collect();
    photos.sort();
    if photos.is_empty() {
        return Err(format!("no photographs (*.jpg) in {}", dir.display()));
    }
    Ok(photos)
}

/// `apt-get download mate-backgrounds` and `dpkg -x` it into `dir`.
fn fetch_package(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    eprintln!("fetching Debian's mate-backgrounds photographs with apt-get download ...");
    let run = |cmd: &mut Command| -> Result<(), String> {
        let status = cmd
            .current_dir(dir)
            .status()
            .map_err(|e| format!("running {cmd:?}: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!(
                "{cmd:?} failed ({status}); on a machine without Debian's archive, pass a folder \
                 of class subfolders of JPEGs with --images ROOT"
            ))
        }
    };
    run(Command::new("apt-get").args(["download", "mate-backgrounds"]))?;
    let deb = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .ok_or("apt-get download left no .deb file")?;
    run(Command::new("dpkg").arg("-x").arg(&deb).arg("."))
}

fn build_classes(
    photos: &[PathBuf],
    root: &Path,
    per_class: usize,
    size: Size,
) -> Result<(), String> {
    let Size {
        width: w,
        height: h,
        scale: (lo, hi),
    } = size;
    // Aspect ratios around the image's own: for 500x375, 1.2:1.45 and 0.69:0.83.
    let aspect = w as f64 / h as f64;
    let landscape = crop_pipeline(&format!(
        "random_resized_crop({h}, {w}, scale={lo}:{hi}, ratio={:.2}:{:.2})",
        aspect * 0.9,
        aspect * 1.0875
    ))?;
    let portrait = crop_pipeline(&format!(
        "random_resized_crop({w}, {h}, scale={lo}:{hi}, ratio={:.2}:{:.2})",
        0.92 / aspect,
        1.1067 / aspect
    ))?;
    let mut bufs = DecodeBuffers::default();
    for photo in photos {
        let class = photo
            .file_stem()
            .map(|s| s.to_string_lossy().to_lowercase())
            .unwrap_or_default();
        let bytes = std::fs::read(photo).map_err(|e| format!("{}: {e}", photo.display()))?;
        let dims = decode_rgb(&bytes, u64::MAX, &mut bufs)
            .map_err(|e| format!("{}: {e}", photo.display()))?;
        let dir = root.join(&class);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for k in 0..per_class {
            let mut rng = Rng::for_key(fnv1a(class.as_bytes()), Stream::Augment, 0, k as u64);
            // Roughly ImageNet's mix: mostly landscape, some portrait, a few progressive or gray.
            let (pipeline, w, h) = if k % 5 == 4 {
                (&portrait, h, w)
            } else {
                (&landscape, w, h)
            };
            let mut rgb = vec![0u8; w * h * 3];
            pipeline.apply_rgb(&bufs.rgb, dims.width, dims.height, &mut rng, &mut rgb)?;
            let mut jpeg = Vec::new();
            let mut encoder = Encoder::new(&mut jpeg, 90);
            encoder.set_progressive(k % 20 == 7);
            let encoded = if k % 25 == 11 {
                let gray: Vec<u8> = rgb
                    .chunks_exact(3)
                    .map(|p| {
                        ((p[0] as u32 * 299 + p[1] as u32 * 587 + p[2] as u32 * 114) / 1000) as u8
                    })
                    .collect();
                encoder.encode(&gray, w as u16, h as u16, ColorType::Luma)
            } else {
                encoder.encode(&rgb, w as u16, h as u16, ColorType::Rgb)
            };
            encoded.map_err(|e| format!("encoding a crop of {}: {e}", photo.display()))?;
            let path = dir.join(format!("{class}_{k:05}.JPEG"));
            std::fs::write(&path, &jpeg).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    Ok(())
}

/// A stable hash of the class name, so each class gets its own crops.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn crop_pipeline(spec: &str) -> Result<Pipeline, String> {
    Pipeline::new(Some(spec), Some(DType::U8), Layout::Nhwc)
}
