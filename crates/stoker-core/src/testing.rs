//! Test doubles and helpers shared by the tests of every crate (feature `testing`, off by
//! default: nothing here is in a normal build).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::dtype::DType;
use crate::error::Result;
use crate::source::{FieldSpec, MemorySource, Sample, Source};

pub use crate::cuda::{FailAt, FakeCounters, FakeDevice};

/// `n` samples: field `x` = `[i, i+1, i+2]` as int64, field `y` = `i` as uint8 (wrapping).
pub fn counting_source(n: usize) -> Arc<dyn Source> {
    let x: Vec<u8> = (0..n as i64)
        .flat_map(|i| [i, i + 1, i + 2])
        .flat_map(|v| v.to_ne_bytes())
        .collect();
    let y: Vec<u8> = (0..n).map(|i| i as u8).collect();
    Arc::new(
        MemorySource::new()
            .with_tensor("x", DType::I64, &[3], x)
            .expect("x is n rows of 3 int64")
            .with_tensor("y", DType::U8, &[], y)
            .expect("y is n bytes"),
    )
}

/// The sample indices of a batch of [`counting_source`]: its `x[:, 0]`.
pub fn counting_indices(batch: &crate::Batch) -> Vec<i64> {
    batch
        .field_by_name("x")
        .and_then(|f| f.data)
        .map(|data| {
            data.chunks_exact(24)
                .map(|row| i64::from_ne_bytes(row[..8].try_into().expect("8 bytes")))
                .collect()
        })
        .unwrap_or_default()
}

/// `inner` with every read taking at least `delay`: a slow disk or network.
pub struct SlowRead {
    /// The source read.
    pub inner: Arc<dyn Source>,
    /// Least time each read takes.
    pub delay: Duration,
}

impl Source for SlowRead {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn fields(&self) -> &[FieldSpec] {
        self.inner.fields()
    }
    fn describe(&self, index: usize) -> String {
        self.inner.describe(index)
    }
    fn read<'a>(&'a self, index: usize, scratch: &'a mut Vec<u8>) -> Result<Sample<'a>> {
        std::thread::sleep(self.delay);
        self.inner.read(index, scratch)
    }
}

/// [`counting_source`] of `n` samples behind a [`SlowRead`] of `delay`.
pub fn slow_counting_source(n: usize, delay: Duration) -> Arc<dyn Source> {
    Arc::new(SlowRead {
        inner: counting_source(n),
        delay,
    })
}

/// Waits until `cond` holds (the loader's threads run concurrently), failing the test after
/// `limit` with what was awaited.
pub fn eventually(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A damaged copy of a good image, and what is wrong with it.
pub struct Damaged {
    /// What was done to the file, as a test names it.
    pub name: &'static str,
    /// The damaged bytes.
    pub bytes: Vec<u8>,
    /// Whether every decoder refuses it. The others are warnings to some decoders, which then
    /// decode what they can, as Pillow does (libjpeg-turbo refuses an unknown marker after the
    /// scan, zune-jpeg does not).
    pub always_fails: bool,
}

/// The kinds of damage real crawls contain, made from a good baseline (non-progressive,
/// Huffman-coded) JPEG: some fail at the header, some in the scan, some only warn. Each is an
/// error or an image, never a crash; what the tests check is that none of them changes how the
/// *next* image decodes.
///
/// Panics when `jpeg` is not a baseline JPEG with a DHT and an SOF0 segment (a test fixture).
pub fn damaged_jpegs(jpeg: &[u8]) -> Vec<Damaged> {
    let mut dht = None;
    let mut sof = None;
    let scan = crate::decode::walk_jpeg_header(jpeg, |marker, at| match marker {
        0xC4 if dht.is_none() => dht = Some(at),
        0xC0 => sof = Some(at),
        _ => {}
    })
    .expect("a JPEG with a scan");
    let (dht, sof) = (dht.expect("a DHT segment"), sof.expect("an SOF0 segment"));
    // A place in the middle of the entropy-coded data that is not the second byte of a stuffed
    // `FF 00` pair, so that an inserted marker is seen as one.
    let mut middle = scan + (jpeg.len() - scan) / 2;
    while jpeg[middle - 1] == 0xFF || jpeg[middle] == 0x00 {
        middle += 1;
    }
    let with = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut bytes = jpeg.to_vec();
        f(&mut bytes);
        bytes
    };
    let eoi = jpeg.len() - 2;
    vec![
        Damaged {
            name: "invalid marker 0xA3 after the scan",
            always_fails: false,
            bytes: with(&|b| {
                b.splice(eoi..eoi, [0xFF, 0xA3]);
            }),
        },
        Damaged {
            // The damage of the report that found the poisoned decoder: a valid header, then a
            // marker that does not exist in the middle of the scan.
            name: "invalid marker 0xA3 in the scan",
            always_fails: false,
            bytes: with(&|b| {
                b.splice(middle..middle, [0xFF, 0xA3]);
            }),
        },
        Damaged {
            name: "scan cut off half way",
            always_fails: true,
            bytes: jpeg[..middle].to_vec(),
        },
        Damaged {
            // The code counts of the first Huffman table (16 bytes after the segment's length
            // and class/id byte) all 0xFF: more than the 256 codes a table can have.
            name: "bad Huffman table",
            always_fails: true,
            bytes: with(&|b| b[dht + 5..dht + 21].fill(0xFF)),
        },
        Damaged {
            // SOF0: FF C0, length (2), precision (1), height (2), width (2). Twice the height
            // the scan holds: the decoder runs out of data half way.
            name: "SOF height twice the scan's",
            always_fails: false,
            bytes: with(&|b| {
                let h = u16::from_be_bytes([b[sof + 5], b[sof + 6]]).saturating_mul(2);
                b[sof + 5..sof + 7].copy_from_slice(&h.to_be_bytes());
            }),
        },
        Damaged {
            name: "SOF width zero",
            always_fails: true,
            bytes: with(&|b| b[sof + 7..sof + 9].fill(0)),
        },
        Damaged {
            name: "entropy-coded data overwritten with 0xFF 0x00 pairs",
            always_fails: false,
            bytes: with(&|b| {
                for pair in b[middle..].chunks_exact_mut(2).take(64) {
                    pair.copy_from_slice(&[0xFF, 0x00]);
                }
            }),
        },
        Damaged {
            name: "header only",
            always_fails: true,
            bytes: jpeg[..scan].to_vec(),
        },
        Damaged {
            name: "empty file",
            always_fails: true,
            bytes: Vec::new(),
        },
        Damaged {
            name: "not an image",
            always_fails: true,
            bytes: b"<html><body>404 Not Found</body></html>\n".to_vec(),
        },
    ]
}

/// Damaged copies of a good PNG: a cut-off image data chunk, and a broken zlib stream (with
/// its CRC made right again, so the damage is only seen when inflating).
pub fn damaged_pngs(png: &[u8]) -> Vec<Damaged> {
    // The first IDAT chunk: length (4), "IDAT", data, CRC (4).
    let idat = png
        .windows(4)
        .position(|w| w == b"IDAT")
        .expect("a PNG with an IDAT chunk")
        - 4;
    let len = u32::from_be_bytes(png[idat..idat + 4].try_into().expect("4 bytes")) as usize;
    let data = idat + 8;
    vec![
        Damaged {
            name: "PNG image data cut off half way",
            always_fails: true,
            bytes: png[..data + len / 2].to_vec(),
        },
        Damaged {
            name: "PNG zlib stream overwritten (CRC fixed up)",
            always_fails: true,
            bytes: {
                let mut b = png.to_vec();
                b[data + 2..data + len].fill(0xA5);
                let crc = crc32fast::hash(&b[idat + 4..data + len]);
                b[data + len..data + len + 4].copy_from_slice(&crc.to_be_bytes());
                b
            },
        },
    ]
}

/// The largest and the mean difference between two images of the same size, in levels.
pub fn levels(a: &[u8], b: &[u8]) -> (u8, f64) {
    assert_eq!(a.len(), b.len(), "images of different sizes");
    let max = a
        .iter()
        .zip(b)
        .map(|(x, y)| x.abs_diff(*y))
        .max()
        .unwrap_or(0);
    let sum: u64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| u64::from(x.abs_diff(*y)))
        .sum();
    (max, sum as f64 / a.len().max(1) as f64)
}
