//! Samplers: which dataset indices an epoch visits, in which order.
//!
//! Each sampler follows the semantics of its PyTorch namesake (`torch.utils.data.*Sampler`):
//! the same lengths, the same padding and splitting rules. The random draws come from
//! [`crate::rng`] rather than torch's Mersenne Twister, so the orders are equally distributed
//! but not bit-identical to torch's. Every order is a pure function of `(seed, epoch)`.

use crate::error::{Error, Result};
use crate::launch::{GlobalBatches, RankShare};
use crate::rng::{Rng, Stream};

/// Which sampler, with its parameters.
#[derive(Clone, Debug, PartialEq)]
pub enum SamplerKind {
    /// `SequentialSampler`: `0, 1, ..., n-1`.
    Sequential,
    /// `RandomSampler(replacement, num_samples)`.
    ///
    /// Without replacement: `num_samples / n` full permutations, then the first
    /// `num_samples % n` of one more (`num_samples` defaults to `n`). With replacement:
    /// `num_samples` independent uniform draws from `[0, n)`.
    Random {
        /// Draw with replacement.
        replacement: bool,
        /// Entries per epoch; `None` means the dataset's length.
        num_samples: Option<usize>,
    },
    /// `SubsetRandomSampler(indices)`: a fresh permutation of the given indices every epoch.
    SubsetRandom {
        /// Dataset indices to permute, each `< n`.
        indices: Vec<usize>,
    },
    /// These indices, in this order, every epoch: a torch `sampler=` given as a sequence.
    Indices {
        /// Dataset indices to visit, each `< n`.
        indices: Vec<usize>,
    },
    /// `WeightedRandomSampler(weights, num_samples, replacement)`: index `i` is drawn with
    /// probability `weights[i] / sum(weights)`; without replacement, drawn indices are removed
    /// (sequential weighted sampling, as `torch.multinomial(replacement=False)`).
    WeightedRandom {
        /// One finite, non-negative weight per dataset index.
        weights: Vec<f64>,
        /// Entries per epoch.
        num_samples: usize,
        /// Draw with replacement.
        replacement: bool,
    },
    /// `order=quasi_random`: a shuffle that reads a page-organised file (stoker's packed format)
    /// a window of pages at a time, for data larger than RAM. `pages[i]` is the data page
    /// sample `i` starts in (non-decreasing). Each epoch the pages are shuffled, cut into
    /// windows of `window` pages, and the samples of each window shuffled together: every
    /// sample once, pages read close together in time. A function of `(seed, epoch)` like the
    /// others, so it is deterministic and resumable.
    QuasiRandom {
        /// The data page each sample starts in, one per dataset index, non-decreasing.
        pages: Vec<u64>,
        /// Pages per shuffled window, at least 1.
        window: usize,
    },
    /// `DistributedSampler(num_replicas=world_size, rank, shuffle, drop_last)`: the sequential
    /// or random order dealt by [`RankShare`] (every other sampler can be dealt the same way, see
    /// [`Sampler::dealt`]).
    ///
    /// With `drop_last` and `n % world_size != 0`: `per_rank = ceil((n - world_size) / world_size)`,
    /// otherwise `per_rank = ceil(n / world_size)`; `total = per_rank * world_size`. The order
    /// (a permutation of `(seed, epoch)` when shuffling, identical on every rank) is padded to
    /// `total` by repeating its head, or truncated to `total` with `drop_last`, and rank `r` takes
    /// `order[r..total].step_by(world_size)`.
    Distributed {
        /// This process's rank, `< world_size`.
        rank: usize,
        /// Number of ranks, at least 1.
        world_size: usize,
        /// Shuffle the order (a permutation of `(seed, epoch)`) instead of visiting `0..n`.
        shuffle: bool,
        /// Truncate the order to a multiple of `world_size` instead of padding it.
        drop_last: bool,
    },
}

/// Bytes of one entry of an epoch's order. The loader keeps the orders of two epochs (the one
/// being delivered and the one being submitted).
const ORDER_ENTRY_BYTES: u64 = 2 * std::mem::size_of::<usize>() as u64;

/// Fails with `OutOfMemory`, naming `key` and the numbers, when an epoch order of `count`
/// entries would take more than a quarter of physical memory: a typo such as
/// `num_samples=1000000000000000` must be an error, not an abort.
pub fn check_order_size(key: &str, count: usize) -> Result<()> {
    let need = (count as u64).saturating_mul(ORDER_ENTRY_BYTES);
    let limit = crate::memory::physical_memory() / 4;
    if need > limit {
        return Err(Error::OutOfMemory(format!(
            "option `{key}`: an epoch of {count} samples needs {need} bytes for its order, more \
             than a quarter of this machine's {} bytes of memory",
            limit * 4
        )));
    }
    Ok(())
}

/// A validated sampler over a dataset of `dataset_len` samples: the epoch's global order (a
/// function of `(seed, epoch)` alone, the same on every rank) and how it is dealt to ranks.
#[derive(Clone, Debug)]
pub struct Sampler {
    /// The global order's sampler (never `Distributed`: that is `deal`).
    kind: SamplerKind,
    deal: RankShare,
    /// Token streams: the global order dealt in global batches instead of strided.
    global: Option<GlobalBatches>,
    dataset_len: usize,
    seed: u64,
    /// Prefix sums of the weights, for weighted sampling with replacement.
    cumulative: Vec<f64>,
}

impl Sampler {
    /// The sampler `kind` for one process (a `Distributed` kind deals itself).
    pub fn new(kind: SamplerKind, dataset_len: usize, seed: u64) -> Result<Sampler> {
        Sampler::dealt(kind, dataset_len, seed, RankShare::SINGLE)
    }

    /// The global order of `kind`, dealt to ranks by `deal`. `SamplerKind::Distributed` is the
    /// sequential or random order dealt by its own rank and world size (which then win).
    pub fn dealt(
        kind: SamplerKind,
        dataset_len: usize,
        seed: u64,
        deal: RankShare,
    ) -> Result<Sampler> {
        // Each refusal names the option that chose it.
        let bad = |key: &str, reason: String| Err(Error::option(key, reason));
        let (kind, deal) = match kind {
            SamplerKind::Distributed {
                rank,
                world_size,
                shuffle,
                drop_last,
            } => (
                if shuffle {
                    SamplerKind::Random {
                        replacement: false,
                        num_samples: None,
                    }
                } else {
                    SamplerKind::Sequential
                },
                RankShare {
                    rank,
                    world_size,
                    drop_last,
                },
            ),
            other => (other, deal),
        };
        if deal.world_size == 0 {
            return bad("world_size", "world_size must be >= 1".into());
        }
        if deal.rank >= deal.world_size {
            return bad(
                "rank",
                format!(
                    "rank {} is out of range for world_size {} (need 0 <= rank < world_size)",
                    deal.rank, deal.world_size
                ),
            );
        }
        let mut cumulative = Vec::new();
        match &kind {
            SamplerKind::Sequential => {}
            SamplerKind::Random {
                replacement,
                num_samples,
            } => {
                if *num_samples == Some(0) {
                    return bad(
                        "num_samples",
                        "num_samples must be a positive integer".into(),
                    );
                }
                if *replacement && dataset_len == 0 {
                    return bad(
                        "replacement",
                        "cannot sample with replacement from an empty dataset".into(),
                    );
                }
            }
            SamplerKind::SubsetRandom { indices } => {
                if let Some(&i) = indices.iter().find(|&&i| i >= dataset_len) {
                    return bad(
                        "subset",
                        format!(
                        "subset index {i} is out of range for a dataset of {dataset_len} samples"
                    ),
                    );
                }
            }
            SamplerKind::WeightedRandom {
                weights,
                num_samples,
                replacement,
            } => {
                if weights.len() != dataset_len {
                    return bad(
                        "weights",
                        format!(
                            "{} weights given for a dataset of {dataset_len} samples",
                            weights.len()
                        ),
                    );
                }
                if let Some((i, w)) = weights
                    .iter()
                    .enumerate()
                    .find(|(_, w)| !w.is_finite() || **w < 0.0)
                {
                    return bad(
                        "weights",
                        format!("weight {i} is {w}; weights must be finite and >= 0"),
                    );
                }
                let positive = weights.iter().filter(|w| **w > 0.0).count();
                if positive == 0 {
                    return bad("weights", "weights sum to zero".into());
                }
                if *num_samples == 0 {
                    return bad(
                        "num_samples",
                        "num_samples must be a positive integer".into(),
                    );
                }
                if !replacement && *num_samples > positive {
                    return bad("num_samples", format!(
                        "cannot draw {num_samples} samples without replacement: only {positive} have a positive weight"
                    ));
                }
                let mut acc = 0.0;
                cumulative = weights
                    .iter()
                    .map(|w| {
                        acc += w;
                        acc
                    })
                    .collect();
            }
            SamplerKind::Indices { indices } => {
                if let Some(&i) = indices.iter().find(|&&i| i >= dataset_len) {
                    return bad(
                        "indices",
                        format!("index {i} is out of range for a dataset of {dataset_len} samples"),
                    );
                }
            }
            SamplerKind::QuasiRandom { pages, window } => {
                if pages.len() != dataset_len || *window == 0 {
                    return bad("order", format!(
                        "quasi_random: {} page numbers (window {window}) for a dataset of {dataset_len} samples",
                        pages.len()
                    ));
                }
                if pages.windows(2).any(|w| w[0] > w[1]) {
                    return bad(
                        "order",
                        "quasi_random: page numbers must not decrease".into(),
                    );
                }
            }
            SamplerKind::Distributed { .. } => {
                return Err(Error::Internal(
                    "a distributed sampler was not dealt".into(),
                ))
            }
        }
        let sampler = Sampler {
            kind,
            deal,
            global: None,
            dataset_len,
            seed,
            cumulative,
        };
        let key = match &sampler.kind {
            SamplerKind::Random { .. } | SamplerKind::WeightedRandom { .. } => "num_samples",
            SamplerKind::SubsetRandom { .. } => "subset",
            SamplerKind::Indices { .. } => "indices",
            _ => "source",
        };
        check_order_size(key, sampler.global_len())?;
        Ok(sampler)
    }

    /// The sampler of the global order.
    pub fn kind(&self) -> &SamplerKind {
        &self.kind
    }

    /// How the global order is dealt to the ranks.
    pub fn deal(&self) -> RankShare {
        self.deal
    }

    /// This sampler with its global order dealt in global batches of `size` (see
    /// [`GlobalBatches`]: rank `r` takes its contiguous slice of each), cut into micro-batches
    /// of `batch_size`.
    pub fn in_global_batches(mut self, size: usize, batch_size: usize) -> Result<Sampler> {
        self.global = Some(GlobalBatches::new(self.deal, size, batch_size)?);
        Ok(self)
    }

    /// The global-batch deal, when the order is dealt that way.
    pub fn global_batches(&self) -> Option<GlobalBatches> {
        self.global
    }

    /// Entries this rank takes of `total` entries of the global order.
    pub fn per_rank(&self, total: usize) -> usize {
        match self.global {
            Some(g) => g.per_rank(total),
            None => self.deal.per_rank(total),
        }
    }

    fn dealt_part(&self, order: &[usize]) -> Vec<usize> {
        match self.global {
            Some(g) => g.dealt(order),
            None => self.deal.strided(order),
        }
    }

    /// The seed every epoch's order derives from, with the epoch number.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Samples of the dataset the indices refer to (`n`).
    pub fn dataset_len(&self) -> usize {
        self.dataset_len
    }

    /// Entries of an epoch's global order, over all ranks.
    pub fn global_len(&self) -> usize {
        let n = self.dataset_len;
        match &self.kind {
            SamplerKind::Sequential => n,
            SamplerKind::Random { num_samples, .. } => num_samples.unwrap_or(n),
            SamplerKind::SubsetRandom { indices } | SamplerKind::Indices { indices } => {
                indices.len()
            }
            SamplerKind::WeightedRandom { num_samples, .. } => *num_samples,
            SamplerKind::QuasiRandom { .. } | SamplerKind::Distributed { .. } => n,
        }
    }

    /// Samples one epoch yields on this rank (`len(sampler)` in PyTorch).
    pub fn len(&self) -> usize {
        self.per_rank(self.global_len())
    }

    /// Whether an epoch yields no sample on this rank.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The indices epoch `epoch` visits on this rank, in order.
    pub fn epoch_indices(&self, epoch: u64) -> Vec<usize> {
        self.dealt_part(&self.global_indices(epoch))
    }

    /// This rank's share of the rest of epoch `epoch` from entry `start` of its global order:
    /// what the ranks of a job resumed at `start` (whatever their number) deal among themselves.
    pub fn segment_indices(&self, epoch: u64, start: usize) -> Vec<usize> {
        let order = self.global_indices(epoch);
        self.dealt_part(&order[start.min(order.len())..])
    }

    /// The global order of epoch `epoch`: identical on every rank.
    pub fn global_indices(&self, epoch: u64) -> Vec<usize> {
        let n = self.dataset_len;
        let mut rng = Rng::for_key(self.seed, Stream::Order, epoch, 0);
        match &self.kind {
            SamplerKind::Sequential => (0..n).collect(),
            SamplerKind::Random {
                replacement: true,
                num_samples,
            } => (0..num_samples.unwrap_or(n))
                .map(|_| rng.below(n as u64) as usize)
                .collect(),
            SamplerKind::Random {
                replacement: false,
                num_samples,
            } => {
                let total = num_samples.unwrap_or(n);
                let mut out = Vec::with_capacity(total);
                while out.len() < total {
                    let mut perm: Vec<usize> = (0..n).collect();
                    rng.shuffle(&mut perm);
                    let take = (total - out.len()).min(n);
                    out.extend_from_slice(&perm[..take]);
                }
                out
            }
            SamplerKind::SubsetRandom { indices } => {
                let mut out = indices.clone();
                rng.shuffle(&mut out);
                out
            }
            SamplerKind::Indices { indices } => indices.clone(),
            SamplerKind::WeightedRandom {
                weights,
                num_samples,
                replacement: true,
            } => {
                let total = *self.cumulative.last().unwrap_or(&0.0);
                (0..*num_samples)
                    .map(|_| {
                        let u = rng.unit_f64() * total;
                        // First index whose prefix sum exceeds u; zero weights are never chosen.
                        let i = self.cumulative.partition_point(|&c| c <= u);
                        i.min(weights.len() - 1)
                    })
                    .collect()
            }
            SamplerKind::WeightedRandom {
                weights,
                num_samples,
                replacement: false,
            } => {
                // Efraimidis–Spirakis: key_i = ln(u_i) / w_i; the largest keys, in decreasing
                // order, are a sequential weighted draw without replacement.
                let mut keyed: Vec<(f64, usize)> = weights
                    .iter()
                    .enumerate()
                    .filter(|(_, w)| **w > 0.0)
                    .map(|(i, w)| {
                        let u = rng.unit_f64().max(f64::MIN_POSITIVE);
                        (u.ln() / w, i)
                    })
                    .collect();
                keyed.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                keyed.truncate(*num_samples);
                keyed.into_iter().map(|(_, i)| i).collect()
            }
            SamplerKind::QuasiRandom { pages, window } => quasi_random(pages, *window, &mut rng),
            // Dealt in `dealt`; never stored.
            SamplerKind::Distributed { .. } => (0..n).collect(),
        }
    }
}

/// The page-window shuffle of [`SamplerKind::QuasiRandom`].
fn quasi_random(pages: &[u64], window: usize, rng: &mut Rng) -> Vec<usize> {
    // Runs of samples on the same page (pages never decrease with the index).
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (i, page) in pages.iter().enumerate() {
        match runs.last_mut() {
            Some((start, end)) if pages[*start] == *page => *end = i + 1,
            _ => runs.push((i, i + 1)),
        }
    }
    rng.shuffle(&mut runs);
    let mut out = Vec::with_capacity(pages.len());
    for group in runs.chunks(window) {
        let from = out.len();
        for &(start, end) in group {
            out.extend(start..end);
        }
        rng.shuffle(&mut out[from..]);
    }
    out
}

/// One epoch's indices cut into batches (`BatchSampler(sampler, batch_size, drop_last)`):
/// `n / batch_size` batches with `drop_last`, else `ceil(n / batch_size)`, the last one short.
///
/// Each slot also has its *draw*: the entry of the epoch's global order it was dealt from
/// (`first_draw + j * draw_stride` for this rank's `j`-th sample), which keys its augmentation,
/// so that a sample drawn twice in an epoch is augmented independently while the result does
/// not depend on how many ranks or workers there are.
#[derive(Clone, Debug)]
pub struct BatchPlan {
    indices: Vec<usize>,
    batch_size: usize,
    drop_last: bool,
    first_draw: u64,
    draw_stride: u64,
    /// Dealt in global batches: slot draws follow [`GlobalBatches::position`] from
    /// `first_draw`.
    global: Option<GlobalBatches>,
}

/// The draws of one batch's slots (see [`BatchPlan`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Draws {
    /// Keyed by the dataset index of each sample (for batches not cut from a global order).
    ByIndex,
    /// Slot `i` is draw `first + i * stride`.
    Positions {
        /// Draw of slot 0.
        first: u64,
        /// Distance between the draws of consecutive slots (the world size).
        stride: u64,
    },
}

impl Draws {
    /// The key of slot `slot`, which holds dataset index `index`.
    pub fn at(&self, slot: usize, index: usize) -> u64 {
        match *self {
            Draws::ByIndex => index as u64,
            Draws::Positions { first, stride } => {
                first.wrapping_add((slot as u64).wrapping_mul(stride))
            }
        }
    }
}

impl BatchPlan {
    /// A plan whose `j`-th index is draw `j` (one process, a whole epoch).
    pub fn new(indices: Vec<usize>, batch_size: usize, drop_last: bool) -> BatchPlan {
        assert!(
            batch_size > 0,
            "batch_size is validated before a plan is made"
        );
        BatchPlan {
            indices,
            batch_size,
            drop_last,
            first_draw: 0,
            draw_stride: 1,
            global: None,
        }
    }

    /// This rank's plan of epoch `epoch` from entry `start` of the global order on.
    pub fn for_segment(
        sampler: &Sampler,
        epoch: u64,
        start: usize,
        batch_size: usize,
        drop_last: bool,
    ) -> BatchPlan {
        let deal = sampler.deal();
        let plan = BatchPlan::new(sampler.segment_indices(epoch, start), batch_size, drop_last);
        match sampler.global_batches() {
            Some(global) => BatchPlan {
                first_draw: start as u64,
                draw_stride: 1,
                global: Some(global),
                ..plan
            },
            None => BatchPlan {
                first_draw: (start + deal.rank) as u64,
                draw_stride: deal.world_size as u64,
                ..plan
            },
        }
    }

    /// Batches of the plan: `ceil(len / batch_size)`, or `floor` with `drop_last`.
    pub fn num_batches(&self) -> usize {
        batches_for(self.indices.len(), self.batch_size, self.drop_last)
    }

    /// The indices of batch `i` (`i < num_batches()`).
    pub fn batch(&self, i: usize) -> &[usize] {
        let start = i * self.batch_size;
        let end = (start + self.batch_size).min(self.indices.len());
        &self.indices[start..end]
    }

    /// The draws of batch `i`'s slots.
    pub fn draws(&self, i: usize) -> Draws {
        if let Some(global) = self.global {
            // A micro-batch lies within one slice of one global batch: its draws are
            // consecutive entries of the global order.
            return Draws::Positions {
                first: self.first_draw + global.position(i * self.batch_size) as u64,
                stride: 1,
            };
        }
        Draws::Positions {
            first: self.first_draw + (i * self.batch_size) as u64 * self.draw_stride,
            stride: self.draw_stride,
        }
    }
}

/// `len(BatchSampler)` for `samples` samples.
pub fn batches_for(samples: usize, batch_size: usize, drop_last: bool) -> usize {
    if drop_last {
        samples / batch_size
    } else {
        samples.div_ceil(batch_size)
    }
}

#[cfg(test)]
mod tests;
