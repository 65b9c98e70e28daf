//! The packing advice measured rather than guessed: a spread of the source's samples packed as
//! the advice says (`stoker pack --max-side N`) into a temporary file, for the doctor to measure
//! each stage on. Shrinking the images cuts more than decoding: the transform resamples a
//! smaller crop, and reading takes a small record out of one mapped file instead of opening a
//! large one. Likewise the first documents of a text source tokenized once (`stoker pack SOURCE
//! OUT.npy`), read back as `tokens:`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use stoker_core::pack::{pack, PackOptions};
use stoker_core::source::TokenSource;
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

/// The first documents of a token source written as a token file and its sidecar of lengths
/// (`stoker pack SOURCE OUT.npy`), in a temporary directory removed when dropped.
pub(crate) struct TokenProbe {
    dir: PathBuf,
    spec: String,
    /// Documents written.
    pub(crate) documents: u64,
}

impl TokenProbe {
    /// Writes as many whole documents of `source` as hold `tokens` tokens.
    pub(crate) fn write(source: &TokenSource, tokens: u64) -> Result<TokenProbe, String> {
        // A folder of its own each time: doctors may run side by side in one process (tests).
        static MADE: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "stoker-doctor-tokens-{}-{}",
            std::process::id(),
            MADE.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut probe = TokenProbe {
            dir,
            spec: String::new(),
            documents: 0,
        };
        let written = source
            .write_flat_first(&probe.dir.join("tokens.npy"), tokens, &mut |_| {})
            .map_err(|e| e.to_string())?;
        probe.spec = format!("tokens:{}", written.path.display());
        probe.documents = written.documents;
        Ok(probe)
    }

    /// The `source` option that reads it.
    pub(crate) fn spec(&self) -> &str {
        &self.spec
    }

    #[cfg(test)]
    pub(crate) fn dir(&self) -> &std::path::Path {
        &self.dir
    }
}

impl Drop for TokenProbe {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use stoker_core::decode::dimensions;
    use stoker_core::pack::open_source;
    use stoker_core::source::tokens::{MegatronWriter, TokenType};
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
    fn the_token_probe_writes_whole_first_documents_and_removes_its_folder() {
        let dir =
            std::env::temp_dir().join(format!("stoker-token-probe-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let prefix = dir.join("docs");
        let mut writer = MegatronWriter::create(&prefix, TokenType::U16).unwrap();
        for d in 0..10 {
            writer.add_document(&[d; 7]).unwrap();
        }
        writer.finish().unwrap();
        let mut options = stoker_core::LoaderOptions::new();
        options
            .set("source", &format!("megatron:{}", prefix.display()))
            .unwrap();
        // 15 tokens: the third document is written whole.
        let probe = TokenProbe::write(&options.open_token_source().unwrap(), 15).unwrap();
        assert_eq!(probe.documents, 3);
        options.set("source", probe.spec()).unwrap();
        options.set("seq_len", "6").unwrap();
        options.set("batch_size", "1").unwrap();
        let mut loader = stoker_core::Loader::new(&options).unwrap();
        let mut windows = 0;
        while loader.next().unwrap().is_some() {
            windows += 1;
        }
        assert_eq!(windows, 3, "21 tokens: 3 windows of 6 + 1");
        let folder = probe.dir().to_owned();
        drop(loader);
        drop(probe);
        assert!(!folder.exists());
        std::fs::remove_dir_all(&dir).unwrap();
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
