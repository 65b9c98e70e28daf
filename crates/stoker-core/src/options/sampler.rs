//! Which sampler the keys select: an explicit one, else weights, subset, indices, shuffle or
//! sequential; `order=quasi_random` for a paged source.

use std::ops::Range;

use super::{LoaderOptions, OpenedSource, Order, QUASI_RANDOM_WINDOW_PAGES};
use crate::error::{Error, Result};
use crate::launch::RankShare;
use crate::sampler::{Sampler, SamplerKind};
use crate::source::{Access, Source};

impl LoaderOptions {
    /// A token stream's global order of epoch `epoch`: the samples of its whole global batches,
    /// global batch `b` at `b × G`, as every loader of these options deals them at any world
    /// size (`stoker tokens order`). Opens the source.
    pub fn token_order(&self, epoch: u64) -> Result<Vec<usize>> {
        if !self.is_token_stream() {
            return Err(Error::option(
                "source",
                "a token order needs a token source: megatron:PREFIX, tokens:PATTERN or blend=",
            ));
        }
        let launch = self.launch()?;
        let OpenedSource::Indexed(source) =
            self.open_source(&launch, self.seed, epoch, None, 0)?.source
        else {
            return Err(Error::Internal("a token source opened as a stream".into()));
        };
        let global = self
            .global_batch_size
            .unwrap_or(self.batch_size * launch.world_size);
        let kind = self.sampler_kind_for(&*source)?;
        // One process taking whole global batches: the union of every rank's slices.
        let sampler = Sampler::dealt(kind, source.len(), self.seed, RankShare::SINGLE)?
            .in_global_batches(global, global)?;
        // What a loader of these options refuses, the order of its epochs is refused for.
        self.check_a_global_batch(&*source, sampler.global_len(), global)?;
        Ok(sampler.epoch_indices(epoch))
    }

    /// `Err` unless an epoch of token source `source` holds at least one global batch (of
    /// `global` samples; `epoch_len` samples an epoch): a loader that delivers no batch would
    /// make a training loop counted in steps spin through empty epochs. (An empty map-style
    /// dataset is let through, as torch's sequential sampler lets it.)
    pub(crate) fn check_a_global_batch(
        &self,
        source: &dyn Source,
        epoch_len: usize,
        global: usize,
    ) -> Result<()> {
        let seq_len = self.seq_len().unwrap_or(0);
        if source.is_empty() {
            return Err(Error::option(
                "seq_len",
                format!(
                    "{}: no sample of seq_len {seq_len} (the source holds fewer tokens, or \
                     documents of none under token_packing=pad)",
                    source.identity()
                ),
            ));
        }
        if epoch_len < global {
            let key = if self.global_batch_size.is_some() {
                "global_batch_size"
            } else {
                "batch_size"
            };
            return Err(Error::option(
                key,
                format!(
                    "an epoch has {epoch_len} samples of seq_len {seq_len}, fewer than one global \
                     batch of {global}: it would deliver no batch; make the global batch smaller \
                     or seq_len shorter"
                ),
            ));
        }
        Ok(())
    }

    /// The sampler of `source` these options select ([`sampler_kind`](Self::sampler_kind)),
    /// with `order=quasi_random` applied to a shuffle of a paged source; tells the source how
    /// it will be read (`madvise` for packed files).
    pub(crate) fn sampler_kind_for(&self, source: &dyn Source) -> Result<SamplerKind> {
        let mut kind = self.sampler_kind(source.len())?;
        if self.order == Order::QuasiRandom {
            kind = match kind {
                SamplerKind::Random {
                    replacement: false,
                    num_samples: None,
                } => SamplerKind::QuasiRandom {
                    pages: source.pages().ok_or_else(|| {
                        Error::option(
                            "order",
                            "quasi_random applies to page-organised sources (packed:PATH, parquet:PATTERN)",
                        )
                    })?,
                    window: QUASI_RANDOM_WINDOW_PAGES,
                },
                _ => {
                    return Err(Error::option(
                        "order",
                        "quasi_random shuffles: it needs shuffle=true, without replacement, num_samples, weights, subset or indices",
                    ))
                }
            };
        }
        source.advise(match &kind {
            SamplerKind::Sequential | SamplerKind::Indices { .. } => Access::Sequential,
            SamplerKind::QuasiRandom { .. } => Access::PageWindows,
            _ => Access::Random,
        });
        Ok(kind)
    }

    /// The sampler of the global order these options select: an explicit one, else weights →
    /// weighted, subset → subset-random, indices → that order, shuffle → random, otherwise
    /// sequential. Under world_size > 1 it is dealt to the ranks ([`deal`](Self::deal)).
    pub fn sampler_kind(&self, dataset_len: usize) -> Result<SamplerKind> {
        if let Some(kind) = &self.sampler {
            return Ok(kind.clone());
        }
        let chosen = [
            self.weights.is_some(),
            self.subset.is_some(),
            self.indices.is_some(),
        ]
        .iter()
        .filter(|b| **b)
        .count();
        if chosen > 1 {
            return Err(Error::option(
                "weights",
                "weights, subset and indices each select a sampler; set only one of them",
            ));
        }
        if self.indices.is_some() && (self.shuffle || self.replacement) {
            return Err(Error::option(
                "indices",
                "gives the order itself: it cannot be combined with shuffle or replacement",
            ));
        }
        Ok(if let Some(weights) = &self.weights {
            SamplerKind::WeightedRandom {
                weights: weights.clone(),
                num_samples: self.num_samples.unwrap_or(dataset_len),
                replacement: true,
            }
        } else if let Some(ranges) = &self.subset {
            SamplerKind::SubsetRandom {
                indices: materialize_subset("subset", ranges, dataset_len)?,
            }
        } else if let Some(ranges) = &self.indices {
            SamplerKind::Indices {
                indices: materialize_subset("indices", ranges, dataset_len)?,
            }
        } else if self.shuffle || self.replacement || self.num_samples.is_some() {
            SamplerKind::Random {
                replacement: self.replacement,
                num_samples: self.num_samples,
            }
        } else {
            SamplerKind::Sequential
        })
    }
}

/// The subset's indices, once every one is known to be inside the dataset and the list fits
/// in memory.
fn materialize_subset(
    key: &str,
    ranges: &[Range<usize>],
    dataset_len: usize,
) -> Result<Vec<usize>> {
    if let Some(r) = ranges.iter().find(|r| r.end > dataset_len) {
        let i = if r.end - r.start == 1 {
            r.start
        } else {
            r.end - 1
        };
        return Err(Error::option(
            key,
            format!("index {i} is out of range for a dataset of {dataset_len} samples"),
        ));
    }
    let count = ranges
        .iter()
        .try_fold(0usize, |n, r| n.checked_add(r.len()))
        .unwrap_or(usize::MAX);
    crate::sampler::check_order_size(key, count)?;
    Ok(ranges.iter().flat_map(|r| r.clone()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_keys_select_the_sampler() {
        let mut o = LoaderOptions::default();
        assert_eq!(o.sampler_kind(5).unwrap(), SamplerKind::Sequential);
        o.set("subset", "0..3,7").unwrap();
        assert_eq!(
            o.sampler_kind(10).unwrap(),
            SamplerKind::SubsetRandom {
                indices: vec![0, 1, 2, 7]
            }
        );
        o.set("weights", "1,2").unwrap();
        assert!(o.sampler_kind(2).is_err(), "two samplers selected");
        o.subset = None;
        o.set("num_samples", "5").unwrap();
        assert!(matches!(
            o.sampler_kind(2).unwrap(),
            SamplerKind::WeightedRandom {
                num_samples: 5,
                replacement: true,
                ..
            }
        ));
    }

    #[test]
    fn subset_indices_outside_the_dataset_name_the_index() {
        let mut o = LoaderOptions::default();
        o.set("subset", "0..3,12").unwrap();
        let e = o.sampler_kind(10).unwrap_err().to_string();
        assert!(e.contains("`subset`") && e.contains("index 12"), "{e}");
        o.set("subset", "5..20").unwrap();
        let e = o.sampler_kind(10).unwrap_err().to_string();
        assert!(e.contains("index 19"), "{e}");
    }
}
