//! Loader options: the knobs of a loader with the defaults of the C contract, set through a
//! string-keyed setter (`set("batch_size", "64")`) shared by every face, or typed setters from
//! Rust. Fields are private and every setter validates, so a `LoaderOptions` is never invalid;
//! errors name the key.
//!
//! - `keys`: every key declared once (field, type, default, parser, documentation); the
//!   struct, its defaults, [`LoaderOptions::set`]'s dispatch and [`OPTIONS`] are generated
//!   from it, and the header's and manual's option tables are rendered from [`OPTIONS`].
//! - `parse`: the value parsers.
//! - `sampler`: which sampler the keys select.
//! - `open`: opening the source the keys name, and its image stages.

mod keys;
mod open;
mod parse;
mod sampler;

pub use keys::{LoaderOptions, OptionDoc, OPTIONS};
pub(crate) use open::OpenedSource;

use crate::error::{Error, Result};
use crate::launch::{usable_cores, Launch, RankShare};
use crate::memory::MemoryBudget;
use crate::sampler::SamplerKind;
pub use crate::source::SourceSpec;

/// Where batches are delivered (option `device`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Device {
    #[default]
    /// Host memory.
    Cpu,
    /// The CUDA device with this ordinal (`cuda:N`).
    Cuda(u32),
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// What a bad sample gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OnError {
    /// Fail the batch with an error naming the sample.
    #[default]
    Raise,
    /// Replace the sample with a deterministic other one and count it in stats.
    Skip,
}

/// Pages per window of `order=quasi_random`: 64 MiB at the packed format's 2 MiB page, a
/// small part of the page cache of any training machine.
pub const QUASI_RANDOM_WINDOW_PAGES: usize = 32;

/// The order a shuffled epoch reads samples in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Order {
    /// A uniform permutation.
    #[default]
    Random,
    /// A page-window shuffle of page-organised data (packed sources): see
    /// [`SamplerKind::QuasiRandom`].
    QuasiRandom,
}

/// Which sampler, when set explicitly in code; otherwise it follows from the option keys.
pub type SamplerChoice = Option<SamplerKind>;

/// The `device` option as given: `cuda` without an ordinal is the local rank's device, known
/// once the launch is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DeviceChoice {
    Given(Device),
    CudaLocal,
}

/// Every key [`LoaderOptions::set`] accepts, in [`OPTIONS`] order.
pub fn keys() -> impl Iterator<Item = &'static str> {
    OPTIONS.iter().map(|o| o.key)
}

/// [`OPTIONS`] as a Markdown table, as `docs/options.md` shows it.
pub fn options_markdown() -> String {
    let mut out =
        String::from("| key | values | default | example | meaning |\n|---|---|---|---|---|\n");
    for o in OPTIONS {
        // A `|` inside a cell is escaped, as the values and meanings already write it.
        let example = o.example.replace('|', "\\|");
        out.push_str(&format!(
            "| `{}` | {} | {} | `{example}` | {} |\n",
            o.key, o.values, o.default, o.meaning
        ));
    }
    out
}

impl LoaderOptions {
    /// Options at their defaults, with no source.
    pub fn new() -> LoaderOptions {
        LoaderOptions::default()
    }

    /// [`set`](Self::set) for chaining: `LoaderOptions::new().with("batch_size", "64")?`.
    pub fn with(mut self, key: &str, value: &str) -> Result<LoaderOptions> {
        self.set(key, value)?;
        Ok(self)
    }

    /// The source, when it is made in code: a [`Source`](crate::source::Source) of your own or a callback source.
    pub fn set_source(&mut self, source: SourceSpec) {
        self.source = Some(source);
    }

    /// [`set_source`](Self::set_source) for chaining.
    pub fn with_source(mut self, source: SourceSpec) -> LoaderOptions {
        self.set_source(source);
        self
    }

    /// With `device=cuda`: the caller's `CUstream` (as an address) to copy on (the option
    /// `cuda_stream`).
    pub fn set_cuda_stream(&mut self, stream: usize) {
        self.cuda_stream = Some(stream);
    }

    /// Chooses the sampler explicitly instead of from the keys; checked against the dataset
    /// when the loader is made.
    pub fn set_sampler(&mut self, kind: SamplerKind) {
        self.sampler = Some(kind);
    }

    /// The source set in code or by the `source` key, if any.
    pub fn source(&self) -> Option<&SourceSpec> {
        self.source.as_ref()
    }

    /// Samples per batch (option `batch_size`).
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Tokens per sample of a token source (option `seq_len`), if set.
    pub fn seq_len(&self) -> Option<usize> {
        self.seq_len
    }

    /// The seed all order and augmentation randomness derives from (option `seed`).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Where batches are delivered (option `device`).
    pub fn device(&self) -> Device {
        match self.device {
            DeviceChoice::Given(device) => device,
            DeviceChoice::CudaLocal => Device::Cuda(0),
        }
    }

    /// The shuffle order (option `order`).
    pub fn order(&self) -> Order {
        self.order
    }

    /// What a bad sample does (option `on_error`).
    pub fn on_error(&self) -> OnError {
        self.on_error
    }

    /// Batches in flight per worker (option `prefetch_factor`).
    pub fn prefetch_factor(&self) -> usize {
        self.prefetch_factor
    }

    /// Longest wait for one batch in milliseconds, 0 for none (option `timeout_ms`).
    pub fn timeout_ms(&self) -> u64 {
        self.timeout_ms
    }

    /// The caller's `CUstream` as an address, if one was given (option `cuda_stream`).
    pub fn cuda_stream(&self) -> Option<usize> {
        self.cuda_stream
    }

    /// Sets one option from its string form, validating it.
    /// Sets one option from its string form, validating it; on an error nothing changes.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        self.set_key(key, value.trim()).unwrap_or_else(|| {
            Err(Error::InvalidOption {
                key: key.to_owned(),
                reason: format!(
                    "unknown option; known options are {}",
                    keys().collect::<Vec<_>>().join(", ")
                ),
            })
        })
    }

    /// This process's place in the job: explicit `rank` / `world_size`, or the launcher's
    /// variables for `auto` (see [`crate::launch`]).
    pub fn launch(&self) -> Result<Launch> {
        crate::launch::resolve(self.rank, self.world_size)
    }

    /// Workers to start: `num_workers`, or for `auto` the cores of this process's affinity
    /// mask divided by the ranks on this node (at least 1). Variables that do not resolve count
    /// as one process here; making the loader reports them.
    pub fn resolved_workers(&self) -> usize {
        self.workers_for(&self.launch().unwrap_or(Launch::SINGLE))
    }

    /// [`resolved_workers`](Self::resolved_workers) for a resolved launch.
    pub fn workers_for(&self, launch: &Launch) -> usize {
        self.num_workers
            .unwrap_or_else(|| (usable_cores() / launch.local_world_size.max(1)).max(1))
    }

    /// The memory budget in bytes: `memory_budget`, or the default (see [`crate::memory`]).
    pub fn resolved_memory_budget(&self) -> u64 {
        self.memory_budget
            .map_or_else(crate::memory::default_budget, MemoryBudget::bytes)
    }

    /// Batches in flight at most: `max(1, num_workers) × prefetch_factor`.
    pub fn in_flight_cap(&self) -> usize {
        self.cap_for(self.resolved_workers())
    }

    /// The in-flight cap for `workers` workers.
    pub fn cap_for(&self, workers: usize) -> usize {
        workers.max(1) * self.prefetch_factor
    }

    /// The device batches go to: `cuda` without an ordinal is `cuda:LOCAL_RANK`.
    pub fn device_for(&self, launch: &Launch) -> Device {
        match self.device {
            DeviceChoice::CudaLocal => {
                Device::Cuda(u32::try_from(launch.local_rank).unwrap_or(u32::MAX))
            }
            DeviceChoice::Given(device) => device,
        }
    }

    /// How the global order is dealt to the ranks of `launch`.
    pub fn deal(&self, launch: &Launch) -> RankShare {
        RankShare::of(launch, self.shard_drop_last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_contract() {
        let o = LoaderOptions::default();
        assert_eq!(o.batch_size, 1);
        assert!(!o.shuffle && !o.drop_last && o.in_order);
        assert_eq!(o.prefetch_factor, 2);
        assert_eq!(o.num_workers, None);
        assert_eq!((o.rank, o.world_size), (None, None), "auto");
        assert_eq!(o.device(), Device::Cpu);
        assert_eq!(o.on_error, OnError::Raise);
        assert_eq!(o.timeout_ms, 0);
    }

    #[test]
    fn cuda_stream_takes_a_decimal_or_hex_address() {
        let mut o = LoaderOptions::new();
        o.set("cuda_stream", "0x7f00aa").unwrap();
        assert_eq!(o.cuda_stream, Some(0x7f00aa));
        o.set("cuda_stream", "0").unwrap();
        assert_eq!(o.cuda_stream, Some(0));
        let err = o.set("cuda_stream", "stream").unwrap_err();
        assert!(err.to_string().starts_with("option `cuda_stream`"), "{err}");
        assert_eq!(Device::Cuda(2).to_string(), "cuda:2");
    }

    #[test]
    fn every_documented_key_takes_its_example_and_changes_the_options() {
        let defaults = format!("{:?}", LoaderOptions::default());
        for doc in OPTIONS {
            let mut o = LoaderOptions::default();
            o.set(doc.key, doc.example)
                .unwrap_or_else(|e| panic!("{}={}: {e}", doc.key, doc.example));
            assert_ne!(
                format!("{o:?}"),
                defaults,
                "setting {}={} changed nothing",
                doc.key,
                doc.example
            );
        }
        let documented: Vec<_> = keys().collect();
        let mut unique = documented.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), documented.len(), "a key is declared twice");
    }

    #[test]
    fn typed_values_land_in_their_fields() {
        let mut o = LoaderOptions::default();
        for (k, v) in [
            ("batch_size", "64"),
            ("shuffle", "true"),
            ("seed", "18446744073709551615"),
            ("num_workers", "3"),
            ("prefetch_factor", "4"),
            ("rank", "1"),
            ("world_size", "4"),
            ("dtype", "bfloat16"),
            ("layout", "nhwc"),
            ("device", "cuda:1"),
            ("pad", "-1"),
            ("transform", " hflip "),
        ] {
            o.set(k, v).unwrap_or_else(|e| panic!("{k}={v}: {e}"));
        }
        assert_eq!(o.batch_size, 64);
        assert_eq!(o.seed, u64::MAX);
        assert_eq!(o.num_workers, Some(3));
        assert_eq!(o.in_flight_cap(), 12);
        assert_eq!(o.dtype, Some(crate::dtype::DType::BF16));
        assert_eq!(o.layout, Some(crate::dtype::Layout::Nhwc));
        assert_eq!(o.device(), Device::Cuda(1));
        assert_eq!(o.pad, Some(-1.0));
        assert_eq!(o.transform.as_deref(), Some("hflip"), "values are trimmed");
        o.set("transform", "").unwrap();
        assert_eq!(o.transform, None, "an empty value is the default");
        assert!(matches!(
            o.sampler_kind(10).unwrap(),
            SamplerKind::Random {
                replacement: false,
                num_samples: None
            }
        ));
        let launch = o.launch().unwrap();
        assert_eq!((launch.rank, launch.world_size), (1, 4));
        assert_eq!(
            o.deal(&launch),
            RankShare {
                rank: 1,
                world_size: 4,
                drop_last: false
            }
        );
        o.set("num_workers", "auto").unwrap();
        assert!(o.resolved_workers() >= 1);
    }

    #[test]
    fn bad_keys_and_values_name_the_key() {
        let mut o = LoaderOptions::default();
        for (k, v, needle) in [
            ("batch_sise", "4", "unknown option"),
            ("batch_size", "0", "out of range"),
            ("batch_size", "-3", "not a non-negative integer"),
            ("shuffle", "maybe", "not a boolean"),
            ("source", "csv:/x", "not a source"),
            ("source", "npy:", "path is empty"),
            ("dtype", "float64", "unknown dtype"),
            ("device", "tpu", "not a device"),
            ("on_error", "ignore", "not a policy"),
            ("prefetch_factor", "0", "out of range"),
            ("weights", "1,-2", "not a finite weight"),
            ("subset", "1,x", "not an index"),
            ("indices", "0..0", "selects no sample"),
            ("subset", "4..4, 7..7", "selects no sample"),
            ("transform", "resize(0)", "not a size"),
            ("pad", "nan", "not a finite number"),
            ("resume_state", "garbage", "resume_state"),
        ] {
            let e = o.set(k, v).unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains(&format!("`{k}`")), "{k}={v}: {msg}");
            assert!(msg.contains(needle), "{k}={v}: {msg}");
        }
        assert_eq!(o.batch_size, 1, "a failed set leaves the old value");
        // Booleans in any case, as Python's str(True) writes them.
        o.set("shuffle", "True").unwrap();
        assert!(o.shuffle);
    }

    #[test]
    fn cuda_is_the_local_rank_and_auto_workers_share_the_node() {
        let launch = Launch {
            rank: 5,
            world_size: 8,
            local_rank: 1,
            local_world_size: 4,
            launcher: crate::launch::Launcher::Torchrun,
        };
        let mut o = LoaderOptions::default();
        o.set("device", "cuda").unwrap();
        assert_eq!(o.device_for(&launch), Device::Cuda(1));
        o.set("device", "cuda:3").unwrap();
        assert_eq!(
            o.device_for(&launch),
            Device::Cuda(3),
            "an explicit ordinal wins"
        );
        o.set("device", "cpu").unwrap();
        assert_eq!(o.device_for(&launch), Device::Cpu);
        let cores = usable_cores();
        assert_eq!(o.workers_for(&launch), (cores / 4).max(1));
        assert_eq!(o.workers_for(&Launch::SINGLE), cores);
        o.set("num_workers", "3").unwrap();
        assert_eq!(o.workers_for(&launch), 3, "an explicit count wins");
        for v in ["auto", "env"] {
            o.set("rank", v).unwrap();
            o.set("world_size", v).unwrap();
            assert_eq!((o.rank, o.world_size), (None, None));
        }
        assert!(o.set("world_size", "0").is_err());
        o.set("indices", "3,1,2").unwrap();
        o.set("shuffle", "true").unwrap();
        let e = o.sampler_kind(5).unwrap_err().to_string();
        assert!(e.contains("`indices`") && e.contains("shuffle"), "{e}");
        o.set("shuffle", "false").unwrap();
        assert_eq!(
            o.sampler_kind(5).unwrap(),
            SamplerKind::Indices {
                indices: vec![3, 1, 2]
            }
        );
    }
}
