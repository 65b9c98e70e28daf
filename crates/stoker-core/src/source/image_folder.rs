//! `image_folder:ROOT`: torchvision's `ImageFolder` layout, `ROOT/<class>/**/<image>`.
//!
//! The rules are torchvision's: the classes are the subdirectory names of ROOT, sorted; a
//! sample's label is its class's index in that order; files are found recursively under each
//! class directory (symlinked directories followed, like `os.walk(followlinks=True)`), in the
//! order of `sorted(os.walk(class_dir))` with the file names of each directory sorted; a file
//! is an image if its extension is `.jpg`, `.jpeg` or `.png`, case-insensitively. A class with
//! no image is an error, as in torchvision.
//!
//! Building the index only lists directories (`read_dir`, whose entries carry their type: no
//! per-file `stat`), one class directory per rayon task. Paths are kept relative to ROOT in one
//! byte buffer (no allocation per file), so a million-file index costs tens of megabytes.

use std::ffi::OsStr;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use super::{FieldSpec, Sample, Source};
use crate::dtype::DType;
use crate::error::{io_reason, Error, Result};

/// Extensions of image files, lower case, without the dot.
pub const IMAGE_EXTENSIONS: &[&str] = &["jpg", "jpeg", "png"];

/// Deeper directory trees than this are not walked (a guard against symlink cycles).
const MAX_DEPTH: usize = 64;

/// A source of the images under `ROOT/<class>/`, in torchvision `ImageFolder`'s order: fields
/// `image` (encoded bytes, decoded by the pipeline) and `label` (int64, the class's index).
pub struct ImageFolderSource {
    root: PathBuf,
    classes: Vec<String>,
    /// Every file's path relative to `root`, concatenated; file `i` is `names[ends[i-1]..ends[i]]`.
    names: Vec<u8>,
    ends: Vec<usize>,
    /// Class index of each file.
    class_of: Vec<u32>,
    /// Each class's label as native-endian int64 bytes.
    label_bytes: Vec<[u8; 8]>,
    fields: Vec<FieldSpec>,
}

/// The files of one class directory: relative paths (bytes) in torchvision's order.
pub(super) struct ClassFiles {
    pub(super) names: Vec<u8>,
    pub(super) ends: Vec<usize>,
}

impl ImageFolderSource {
    /// Indexes `root`. A missing, unreadable or empty root is an [`Error::Io`] naming it.
    pub fn open(root: &Path) -> Result<ImageFolderSource> {
        if root.is_file() {
            return Err(Error::io(
                root,
                "is a file, not a directory: image_folder expects ROOT/<class>/<image> \
                 (torchvision's ImageFolder layout)",
            ));
        }
        let entries = fs::read_dir(root).map_err(|e| Error::os(root, e))?;
        let mut classes: Vec<(Vec<u8>, String)> = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| Error::os(root, e))?;
            if is_dir(&entry) {
                let name = entry.file_name();
                let display = name.to_string_lossy().into_owned();
                classes.push((name.as_encoded_bytes().to_vec(), display));
            }
        }
        if classes.is_empty() {
            return Err(Error::io(
                root,
                "no class directories: image_folder expects ROOT/<class>/<image> (torchvision's ImageFolder layout)",
            ));
        }
        classes.sort();
        if classes.len() > u32::MAX as usize {
            return Err(Error::io(root, "too many class directories"));
        }
        let per_class: Vec<Result<ClassFiles>> = crate::fork::parallel(|| {
            classes
                .par_iter()
                .map(|(name, _)| walk_class(root, name))
                .collect()
        })?;

        let mut names = Vec::new();
        let mut ends = Vec::new();
        let mut class_of = Vec::new();
        let mut empty = Vec::new();
        for (c, files) in per_class.into_iter().enumerate() {
            let files = files?;
            if files.ends.is_empty() {
                empty.push(classes[c].1.clone());
                continue;
            }
            let base = names.len();
            names.extend_from_slice(&files.names);
            ends.extend(files.ends.iter().map(|e| base + e));
            class_of.extend(std::iter::repeat_n(c as u32, files.ends.len()));
        }
        if !empty.is_empty() {
            return Err(Error::io(
                root,
                format!(
                    "found no .jpg/.jpeg/.png file for the class(es) {}",
                    empty.join(", ")
                ),
            ));
        }
        let label_bytes = (0..classes.len())
            .map(|c| (c as i64).to_ne_bytes())
            .collect();
        Ok(ImageFolderSource {
            root: root.to_owned(),
            classes: classes.into_iter().map(|(_, d)| d).collect(),
            names,
            ends,
            class_of,
            label_bytes,
            fields: vec![
                FieldSpec::encoded_image("image"),
                FieldSpec::tensor("label", DType::I64, &[]),
            ],
        })
    }

    /// The directory indexed, as given to [`open`](Self::open).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Class names in label order.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// The label of sample `index`.
    pub fn label(&self, index: usize) -> i64 {
        self.class_of[index] as i64
    }

    /// The path of sample `index`, relative to the root.
    pub fn relative_path(&self, index: usize) -> &Path {
        let start = if index == 0 { 0 } else { self.ends[index - 1] };
        let bytes = &self.names[start..self.ends[index]];
        // SAFETY: `bytes` is exactly the concatenation, with ASCII '/' separators, of
        // `OsStr::as_encoded_bytes` outputs from this process (see `walk_class`); splitting and
        // joining encoded bytes at ASCII characters is allowed by `from_encoded_bytes_unchecked`.
        Path::new(unsafe { OsStr::from_encoded_bytes_unchecked(bytes) })
    }

    /// The full path of sample `index`.
    pub fn path(&self, index: usize) -> PathBuf {
        self.root.join(self.relative_path(index))
    }
}

/// Whether a directory entry is a directory, following symlinks (only symlinks cost a `stat`).
pub(super) fn is_dir(entry: &fs::DirEntry) -> bool {
    match entry.file_type() {
        Ok(t) if t.is_symlink() => fs::metadata(entry.path()).is_ok_and(|m| m.is_dir()),
        Ok(t) => t.is_dir(),
        Err(_) => false,
    }
}

fn is_image(name: &[u8]) -> bool {
    let Some(dot) = name.iter().rposition(|&b| b == b'.') else {
        return false;
    };
    let ext = &name[dot + 1..];
    IMAGE_EXTENSIONS
        .iter()
        .any(|e| ext.eq_ignore_ascii_case(e.as_bytes()))
}

/// Lists the images under `root/class`, recursively, in the order of torchvision's
/// `for root, _, fnames in sorted(os.walk(class_dir)): for f in sorted(fnames)`: directories
/// by their path, files by name within each.
pub(super) fn walk_class(root: &Path, class: &[u8]) -> Result<ClassFiles> {
    // (relative directory path, sorted image file names in it)
    let mut dirs: Vec<(Vec<u8>, Vec<Vec<u8>>)> = Vec::new();
    let mut stack: Vec<(Vec<u8>, usize)> = vec![(class.to_vec(), 0)];
    while let Some((rel, depth)) = stack.pop() {
        // SAFETY: `rel` is OsStr encoded bytes joined with ASCII '/' (see `relative_path`).
        let dir = root.join(unsafe { OsStr::from_encoded_bytes_unchecked(&rel) });
        let entries = fs::read_dir(&dir).map_err(|e| Error::os(&dir, e))?;
        let mut files = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| Error::os(&dir, e))?;
            let name = entry.file_name();
            let name = name.as_encoded_bytes();
            if is_dir(&entry) {
                if depth < MAX_DEPTH {
                    let mut sub = rel.clone();
                    sub.push(b'/');
                    sub.extend_from_slice(name);
                    stack.push((sub, depth + 1));
                }
            } else if is_image(name) {
                files.push(name.to_vec());
            }
        }
        files.sort_unstable();
        dirs.push((rel, files));
    }
    dirs.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let mut out = ClassFiles {
        names: Vec::new(),
        ends: Vec::new(),
    };
    for (rel, files) in dirs {
        for f in files {
            out.names.extend_from_slice(&rel);
            out.names.push(b'/');
            out.names.extend_from_slice(&f);
            out.ends.push(out.names.len());
        }
    }
    Ok(out)
}

impl Source for ImageFolderSource {
    fn len(&self) -> usize {
        self.ends.len()
    }

    fn fields(&self) -> &[FieldSpec] {
        &self.fields
    }

    fn describe(&self, index: usize) -> String {
        self.path(index).display().to_string()
    }

    fn identity(&self) -> String {
        // The listing relative to the root: the same files wherever the folder is mounted.
        let mut listing = crate::hash::Fnv::new();
        listing.bytes(&self.names);
        format!(
            "image folder of {} files in classes {:?}, listing {:016x}",
            self.len(),
            self.classes,
            listing.finish()
        )
    }

    fn read<'a>(&'a self, index: usize, scratch: &'a mut Vec<u8>) -> Result<Sample<'a>> {
        let path = self.path(index);
        scratch.clear();
        fs::File::open(&path)
            .and_then(|mut f| f.read_to_end(scratch))
            .map_err(|e| Error::io(&path, format!("sample {index}: {}", io_reason(&e))))?;
        let mut sample = Sample::default();
        sample.set(0, scratch);
        sample.set(1, &self.label_bytes[self.class_of[index] as usize]);
        Ok(sample)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("stoker-if-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn touch(root: &Path, rel: &str) {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, rel.as_bytes()).unwrap();
    }

    #[test]
    fn follows_torchvision_image_folder_rules() {
        let root = tmp("rules");
        for rel in [
            "dog/b.jpg",
            "dog/a.JPEG",
            "dog/notes.txt",
            "dog/noext",
            "cat/z.png",
            "cat/sub/x.Jpg",
            "cat/sub dir/y.jpeg",
            "cat/a.jpg",
            "ant/deep/er/q.PNG",
        ] {
            touch(&root, rel);
        }
        fs::write(
            root.join("readme.jpg"),
            b"a file at the root is not a class",
        )
        .unwrap();
        let src = ImageFolderSource::open(&root).unwrap();
        assert_eq!(src.classes(), ["ant", "cat", "dog"]);
        let listed: Vec<(String, i64)> = (0..src.len())
            .map(|i| {
                (
                    src.relative_path(i).to_string_lossy().into_owned(),
                    src.label(i),
                )
            })
            .collect();
        // sorted(os.walk("cat")) visits the roots "cat", "cat/sub", "cat/sub dir" (a prefix sorts
        // first); files are sorted within each root.
        let expected = [
            ("ant/deep/er/q.PNG", 0),
            ("cat/a.jpg", 1),
            ("cat/z.png", 1),
            ("cat/sub/x.Jpg", 1),
            ("cat/sub dir/y.jpeg", 1),
            ("dog/a.JPEG", 2),
            ("dog/b.jpg", 2),
        ];
        let expected: Vec<(String, i64)> =
            expected.iter().map(|(p, l)| (p.to_string(), *l)).collect();
        assert_eq!(listed, expected);

        let mut scratch = vec![1, 2, 3];
        let s = src.read(3, &mut scratch).unwrap();
        assert_eq!(s.get(0), b"cat/sub/x.Jpg");
        assert_eq!(s.get(1), &1i64.to_ne_bytes());
        assert_eq!(
            src.fields(),
            [
                FieldSpec::encoded_image("image"),
                FieldSpec::tensor("label", DType::I64, &[])
            ]
        );
        assert!(src.describe(6).ends_with("dog/b.jpg"));
        assert!(Path::new(&src.describe(6)).starts_with(&root));

        // A file that vanished after indexing: an Io error naming the path and the index.
        fs::remove_file(root.join("dog/b.jpg")).unwrap();
        let err = src.read(6, &mut scratch).unwrap_err();
        assert!(matches!(err, Error::Io { .. }));
        let msg = err.to_string();
        assert!(
            msg.contains("dog/b.jpg") && msg.contains("sample 6"),
            "{msg}"
        );
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn missing_or_empty_roots_are_io_errors_naming_them() {
        let root = tmp("empty");
        let err = ImageFolderSource::open(&root).err().unwrap();
        assert!(matches!(err, Error::Io { .. }));
        assert!(err.to_string().contains("stoker-if-") && err.to_string().contains("no class"));

        let missing = root.join("nope");
        let err = ImageFolderSource::open(&missing).err().unwrap();
        assert!(matches!(err, Error::Io { .. }));
        assert!(err.to_string().contains("nope"), "{err}");

        touch(&root, "full/a.jpg");
        touch(&root, "hollow/readme.txt");
        let err = ImageFolderSource::open(&root).err().unwrap().to_string();
        assert!(err.contains("hollow"), "{err}");
        fs::remove_dir_all(&root).unwrap();
    }

    /// Indexing lists directories only; 20k files in 100 classes takes well under a second
    /// (a smoke test of the approach, not a benchmark).
    #[test]
    fn indexes_many_files_quickly() {
        let root = tmp("many");
        for c in 0..100 {
            let dir = root.join(format!("n{c:08}"));
            fs::create_dir_all(&dir).unwrap();
            for i in 0..200 {
                fs::File::create(dir.join(format!("{i:05}.JPEG"))).unwrap();
            }
        }
        let start = std::time::Instant::now();
        let src = ImageFolderSource::open(&root).unwrap();
        let took = start.elapsed();
        assert_eq!(src.len(), 20_000);
        assert_eq!(src.label(19_999), 99);
        assert!(src.relative_path(201).ends_with("n00000001/00001.JPEG"));
        eprintln!("indexed 20000 files in {took:?}");
        assert!(took.as_secs_f64() < 5.0, "{took:?}");
        fs::remove_dir_all(&root).unwrap();
    }
}
