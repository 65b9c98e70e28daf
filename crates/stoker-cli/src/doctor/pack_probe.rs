//! The packing advice measured rather than guessed: a spread of the source's samples packed as
//! the advice says (`stoker pack --max-side N`) into a temporary file, for the doctor to measure
//! each stage on. Shrinking the images cuts more than decoding: the transform resamples a
//! smaller crop, and reading takes a small record out of one mapped file instead of opening a
//! large one.

use std::path::PathBuf;
use std::sync::Arc;

use stoker_core::pack::{pack, PackOptions};
use stoker_core::{FieldSpec, Sample, Source};

/// Samples packed for the probe (or the whole source when smaller, or a batch when larger).
pub(crate) const PROBE_SAMPLES: usize = 64;

/// Every `stride`-th sample of `inner`, so that the probe sees all of the source's classes.
struct Spread {
    inner: Arc<dyn Source>,
    len: usize,
    stride: usize,
}

impl Source for Spread {
    fn len(&self) -> usize {
        self.len
    }

    fn fields(&self) -> &[FieldSpec] {
        self.inner.fields()
    }

    fn describe(&self, index: usize) -> String {
        self.inner.describe(index * self.stride)
    }

    fn read<'a>(
        &'a self,
        index: usize,
        scratch: &'a mut Vec<u8>,
    ) -> stoker_core::Result<Sample<'a>> {
        self.inner.read(index * self.stride, scratch)
    }
}

/// A packed file removed when dropped.
pub(crate) struct Probe {
    path: PathBuf,
}

impl Probe {
    /// Packs `samples` samples spread over `source`, shrunk to `max_side`, into a temporary
    /// file.
    pub(crate) fn pack(
        source: Arc<dyn Source>,
        samples: usize,
        max_side: u32,
    ) -> Result<Probe, String> {
        let n = source.len();
        if n == 0 {
            return Err("the source is empty".into());
        }
        let len = samples.clamp(1, n);
        let spread = Spread {
            inner: source,
            len,
            stride: n / len,
        };
        let path = std::env::temp_dir().join(format!(
            "stoker-doctor-probe-{}-{max_side}.stkpack",
            std::process::id()
        ));
        let probe = Probe { path };
        let options = PackOptions {
            max_side: Some(max_side),
            ..PackOptions::default()
        };
        pack(&spread, &probe.path, &options, &|_, _| {}).map_err(|e| e.to_string())?;
        Ok(probe)
    }

    /// The `source` option that reads it.
    pub(crate) fn spec(&self) -> String {
        format!("packed:{}", self.path.display())
    }

    #[cfg(test)]
    pub(crate) fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use stoker_core::decode::dimensions;
    use stoker_core::pack::open_source;
    use stoker_core::MemorySource;

    use super::*;

    fn jpeg(w: u16, h: u16, shade: u8) -> Vec<u8> {
        let pixels = vec![shade; w as usize * h as usize * 3];
        let mut out = Vec::new();
        jpeg_encoder::Encoder::new(&mut out, 90)
            .encode(&pixels, w, h, jpeg_encoder::ColorType::Rgb)
            .unwrap();
        out
    }

    #[test]
    fn the_probe_packs_a_spread_shrunk_and_removes_its_file() {
        let rows = (0..10).map(|i| jpeg(600, 400, i * 20)).collect();
        let source: Arc<dyn Source> = Arc::new(
            MemorySource::new()
                .with_encoded_images("image", rows)
                .unwrap(),
        );
        let probe = Probe::pack(source, 4, 256).unwrap();
        let path = probe.path().to_owned();
        let packed = open_source(&probe.spec()).unwrap();
        assert_eq!(packed.len(), 4);
        let mut buf = Vec::new();
        for i in 0..4 {
            let sample = packed.read(i, &mut buf).unwrap();
            let d = dimensions(sample.get(0)).unwrap();
            assert_eq!(d.width, 256, "the longer side shrunk to 256");
            assert!((170..=171).contains(&d.height), "{}", d.height);
        }
        drop(packed);
        drop(probe);
        assert!(!path.exists());
    }
}
