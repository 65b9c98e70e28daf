//! `segmentation_folder:ROOT`: images and their segmentation masks in twin trees.
//!
//! The rule: every image under `ROOT/images/` (any depth: `images/train/x.jpg`,
//! `images/aachen/x.png`; `.jpg`, `.jpeg` or `.png`, case-insensitively) has its mask at the
//! same relative path under `ROOT/masks/` with the extension `.png` (`masks/train/x.png`): the
//! layout of torchvision's `VOCSegmentation` (`JPEGImages/` + `SegmentationClass/`) and of most
//! segmentation sets once their two directories are named (or symlinked) `images` and `masks`.
//! Samples are in the order of the images' paths (directories as `sorted(os.walk)`, file names
//! sorted), and give two fields: `image` and `mask`, both encoded; `fields(image=image,
//! mask=mask)` in the transform decodes the mask to int64 labels moved with its image's draw. An
//! image without its mask fails at open, naming the image and the mask path looked for.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use super::image_folder::walk_class;
use super::{FieldSpec, Sample, Source};
use crate::error::{io_reason, Error, Result};

/// The images' directory under ROOT.
pub const IMAGES_DIR: &str = "images";
/// The masks' directory under ROOT.
pub const MASKS_DIR: &str = "masks";
/// Missing masks named in the error at open (the count says how many more).
const NAMED_MISSING: usize = 5;

/// Images and masks in twin trees (see the module docs): fields `image` and `mask`.
pub struct SegmentationFolderSource {
    root: PathBuf,
    /// Every image's path relative to `ROOT/images`, concatenated; image `i` is
    /// `names[ends[i-1]..ends[i]]`.
    names: Vec<u8>,
    ends: Vec<usize>,
    fields: Vec<FieldSpec>,
}

/// `rel` (an image's path relative to its tree) with the extension `.png`.
fn mask_name(rel: &[u8]) -> Vec<u8> {
    let slash = rel.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
    let stem_end = rel[slash..]
        .iter()
        .rposition(|&b| b == b'.')
        .map_or(rel.len(), |d| slash + d);
    let mut out = rel[..stem_end].to_vec();
    out.extend_from_slice(b".png");
    out
}

/// Bytes as a path: `OsStr` encoded bytes joined with ASCII '/' (see `walk_class`).
fn as_path(bytes: &[u8]) -> &Path {
    // SAFETY: every byte string passed here is made of `OsStr::as_encoded_bytes` outputs of
    // this process (file names from `read_dir`) joined or cut at ASCII characters ('/', '.')
    // and ASCII suffixes, which `from_encoded_bytes_unchecked` allows.
    Path::new(unsafe { OsStr::from_encoded_bytes_unchecked(bytes) })
}

impl SegmentationFolderSource {
    /// Indexes `root/images` and checks that every image has its mask under `root/masks`.
    pub fn open(root: &Path) -> Result<SegmentationFolderSource> {
        let layout = "segmentation_folder expects ROOT/images/**/NAME.jpg and its mask \
                      ROOT/masks/**/NAME.png";
        for dir in [IMAGES_DIR, MASKS_DIR] {
            let path = root.join(dir);
            if !path.is_dir() {
                return Err(Error::io(&path, format!("is not a directory: {layout}")));
            }
        }
        let images = walk_class(root, IMAGES_DIR.as_bytes())?;
        if images.ends.is_empty() {
            return Err(Error::io(
                root.join(IMAGES_DIR),
                format!("holds no .jpg/.jpeg/.png file: {layout}"),
            ));
        }
        let masks = walk_class(root, MASKS_DIR.as_bytes())?;
        let mut have: HashSet<&[u8]> = HashSet::with_capacity(masks.ends.len());
        let mut start = 0;
        for &end in &masks.ends {
            // Relative to the masks' tree: past `masks/`.
            have.insert(&masks.names[start + MASKS_DIR.len() + 1..end]);
            start = end;
        }
        let mut names = Vec::with_capacity(images.names.len());
        let mut ends = Vec::with_capacity(images.ends.len());
        let mut missing = Vec::new();
        let mut missing_count = 0usize;
        let mut start = 0;
        for &end in &images.ends {
            let rel = &images.names[start + IMAGES_DIR.len() + 1..end];
            start = end;
            let mask = mask_name(rel);
            if !have.contains(mask.as_slice()) {
                missing_count += 1;
                if missing.len() < NAMED_MISSING {
                    missing.push(format!(
                        "{} (no {})",
                        root.join(IMAGES_DIR).join(as_path(rel)).display(),
                        root.join(MASKS_DIR).join(as_path(&mask)).display()
                    ));
                }
                continue;
            }
            names.extend_from_slice(rel);
            ends.push(names.len());
        }
        if missing_count > 0 {
            let more = missing_count - missing.len();
            return Err(Error::io(
                root,
                format!(
                    "{missing_count} image(s) have no mask: {}{}; {layout}",
                    missing.join(", "),
                    if more > 0 {
                        format!(" and {more} more")
                    } else {
                        String::new()
                    }
                ),
            ));
        }
        Ok(SegmentationFolderSource {
            root: root.to_owned(),
            names,
            ends,
            fields: vec![
                FieldSpec::encoded_image("image"),
                FieldSpec::encoded_image("mask"),
            ],
        })
    }

    /// Image `index`'s path relative to `ROOT/images` (its mask's is the same with `.png`).
    fn relative(&self, index: usize) -> &[u8] {
        let start = if index == 0 { 0 } else { self.ends[index - 1] };
        &self.names[start..self.ends[index]]
    }

    /// The image and mask paths of sample `index`.
    pub fn paths(&self, index: usize) -> (PathBuf, PathBuf) {
        let rel = self.relative(index);
        (
            self.root.join(IMAGES_DIR).join(as_path(rel)),
            self.root.join(MASKS_DIR).join(as_path(&mask_name(rel))),
        )
    }
}

fn read_into(path: &Path, index: usize, buf: &mut Vec<u8>) -> Result<()> {
    fs::File::open(path)
        .and_then(|mut f| f.read_to_end(buf))
        .map(|_| ())
        .map_err(|e| Error::io(path, format!("sample {index}: {}", io_reason(&e))))
}

impl Source for SegmentationFolderSource {
    fn len(&self) -> usize {
        self.ends.len()
    }

    fn fields(&self) -> &[FieldSpec] {
        &self.fields
    }

    fn describe(&self, index: usize) -> String {
        let (image, mask) = self.paths(index);
        format!("{} (mask {})", image.display(), mask.display())
    }

    fn identity(&self) -> String {
        let mut listing = crate::hash::Fnv::new();
        listing.bytes(&self.names);
        format!(
            "segmentation folder of {} images and masks, listing {:016x}",
            self.len(),
            listing.finish()
        )
    }

    fn read<'a>(&'a self, index: usize, scratch: &'a mut Vec<u8>) -> Result<Sample<'a>> {
        let (image, mask) = self.paths(index);
        scratch.clear();
        read_into(&image, index, scratch)?;
        let split = scratch.len();
        read_into(&mask, index, scratch)?;
        let (image, mask) = scratch.split_at(split);
        let mut sample = Sample::default();
        sample.set(0, image);
        sample.set(1, mask);
        Ok(sample)
    }
}

#[cfg(test)]
mod tests {
    use super::mask_name;

    #[test]
    fn a_masks_name_is_the_images_with_png() {
        assert_eq!(mask_name(b"train/a.b.jpg"), b"train/a.b.png");
        assert_eq!(mask_name(b"x.JPEG"), b"x.png");
        assert_eq!(mask_name(b"d.v/x"), b"d.v/x.png");
    }
}
