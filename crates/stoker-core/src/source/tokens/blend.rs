//! Weighted mixtures of token sources: Megatron's greedy apportioning.
//!
//! Megatron-LM's `build_blending_indices` (`megatron/core/datasets/helpers.cpp`) assigns sample
//! `k` of a blend to the dataset whose share is furthest behind: the one with the largest
//! `weight · max(k, 1) − count` (the first such, on a tie), and counts it. After `k` samples every
//! dataset's count is within 1 of `weight · k` (a dataset of weight 0 is never drawn). The
//! assignment depends on the (normalised)
//! weights alone: no seed, no rank, no epoch.
//!
//! [`BlendSource`] is such a blend of token sources as one source: its length is the sum of its
//! datasets' lengths, its sample `k` is sample `j` of dataset `d` as apportioned. A dataset
//! whose share is larger than itself wraps around: its pass `w` (`j / len`) is its samples in
//! order for `w = 0`, then a permutation of its own keyed by `(seed, d, w)` for each later
//! pass. The whole map is computed once at open (10 bytes a sample), a pure function of the
//! weights, the datasets' lengths and the seed; the loader's sampler then orders the blend's
//! samples as any other source's.

use super::{TokenConfig, TokenSource, TokenSpec};
use crate::error::{Error, Result};
use crate::rng::{Rng, Stream};
use crate::source::remote::RemoteConfig;
use crate::source::{FieldSpec, Sample, Source};

/// Normalises `weights` (finite, ≥ 0, some > 0) to sum to 1.
pub fn normalise(weights: &[f64]) -> Option<Vec<f64>> {
    let sum: f64 = weights.iter().sum();
    if weights.is_empty() || !sum.is_finite() || sum <= 0.0 {
        return None;
    }
    if weights.iter().any(|w| !w.is_finite() || *w < 0.0) {
        return None;
    }
    Some(weights.iter().map(|w| w / sum).collect())
}

/// The first `n` samples of a blend of `weights` (normalised): for each, its dataset and its
/// index among that dataset's samples (`(dataset, count before it)`), as Megatron's
/// `build_blending_indices` computes them.
pub fn blending_indices(weights: &[f64], n: usize) -> (Vec<u16>, Vec<u64>) {
    let mut dataset = Vec::with_capacity(n);
    let mut within = Vec::with_capacity(n);
    let mut counts = vec![0u64; weights.len()];
    for k in 0..n {
        let at = (k as f64).max(1.0);
        let mut best = 0usize;
        let mut best_error = f64::NEG_INFINITY;
        for (d, w) in weights.iter().enumerate() {
            // A dataset of weight 0 is never drawn (its error, 0, would tie the others' at
            // k = 1).
            if *w <= 0.0 {
                continue;
            }
            let error = w * at - counts[d] as f64;
            if error > best_error {
                best = d;
                best_error = error;
            }
        }
        dataset.push(best as u16);
        within.push(counts[best]);
        counts[best] += 1;
    }
    (dataset, within)
}

/// Weighted token sources as one source (see the module docs).
pub struct BlendSource {
    datasets: Vec<TokenSource>,
    weights: Vec<f64>,
    seed: u64,
    /// Sample `k`'s dataset and its index there.
    dataset: Vec<u16>,
    index: Vec<u64>,
}

impl BlendSource {
    /// Opens every dataset of `blend` (weight, spec) with `config`; `seed` keys the passes of a
    /// dataset shorter than its share. Remote files go through `remote`'s cache.
    pub fn open(
        blend: &[(f64, TokenSpec)],
        config: &TokenConfig,
        remote: &RemoteConfig,
        seed: u64,
    ) -> Result<BlendSource> {
        let raw: Vec<f64> = blend.iter().map(|(w, _)| *w).collect();
        let weights = normalise(&raw).ok_or_else(|| {
            Error::option("blend", "the weights must be finite, >= 0 and not all 0")
        })?;
        if blend.len() > usize::from(u16::MAX) {
            return Err(Error::option(
                "blend",
                format!("{} datasets; at most {}", blend.len(), u16::MAX),
            ));
        }
        let datasets = blend
            .iter()
            .map(|(_, spec)| TokenSource::open_with(spec, config, remote))
            .collect::<Result<Vec<_>>>()?;
        for (d, (w, spec)) in datasets.iter().zip(blend) {
            if d.is_empty() && *w > 0.0 {
                return Err(Error::option(
                    "blend",
                    format!(
                        "{spec} has weight {w} but no sample of seq_len {}",
                        config.seq_len
                    ),
                ));
            }
        }
        let total = datasets.iter().map(|d| d.len()).sum::<usize>();
        crate::sampler::check_order_size("blend", total)?;
        let (dataset, mut index) = blending_indices(&weights, total);
        // Later passes over a dataset shorter than its share: a permutation per pass.
        for (d, source) in datasets.iter().enumerate() {
            let len = source.len() as u64;
            if len == 0 {
                continue;
            }
            let mut pass = 0u64;
            let mut perm: Vec<u64> = Vec::new();
            for (k, j) in index.iter_mut().enumerate() {
                if usize::from(dataset[k]) != d || *j < len {
                    continue;
                }
                if *j / len != pass {
                    pass = *j / len;
                    perm = (0..len).collect();
                    Rng::for_key(seed, Stream::Blend, d as u64, pass).shuffle(&mut perm);
                }
                *j = perm[(*j % len) as usize];
            }
        }
        Ok(BlendSource {
            datasets,
            weights,
            seed,
            dataset,
            index,
        })
    }

    /// Sample `k`'s dataset and its index in it.
    pub fn locate(&self, k: usize) -> (usize, usize) {
        (usize::from(self.dataset[k]), self.index[k] as usize)
    }
}

impl Source for BlendSource {
    fn len(&self) -> usize {
        self.dataset.len()
    }

    fn fields(&self) -> &[FieldSpec] {
        self.datasets[0].fields()
    }

    fn describe(&self, k: usize) -> String {
        if k >= self.len() {
            return format!("blend sample {k} (past the end)");
        }
        let (d, j) = self.locate(k);
        format!("blend sample {k}: {}", self.datasets[d].describe(j))
    }

    fn identity(&self) -> String {
        let parts: Vec<String> = self
            .datasets
            .iter()
            .zip(&self.weights)
            .map(|(d, w)| format!("{w}: {}", d.identity()))
            .collect();
        format!("blend (seed {}) of {}", self.seed, parts.join(", "))
    }

    fn read<'a>(&'a self, k: usize, scratch: &'a mut Vec<u8>) -> Result<Sample<'a>> {
        if k >= self.len() {
            return Err(Error::InvalidArgument(format!(
                "sample {k} is out of range for a blend of {} samples",
                self.len()
            )));
        }
        let (d, j) = self.locate(k);
        self.datasets[d].read(j, scratch)
    }

    fn verify(&self) -> Result<()> {
        self.datasets.iter().try_for_each(|d| d.verify())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_count_stays_within_one_of_its_share() {
        for weights in [
            vec![0.7, 0.3],
            vec![1.0, 1.0, 1.0],
            vec![0.5, 0.25, 0.125, 0.125],
            vec![0.01, 0.99],
            vec![3.0, 0.0, 1.0],
        ] {
            let w = normalise(&weights).unwrap();
            let (dataset, within) = blending_indices(&w, 5000);
            let mut counts = vec![0u64; w.len()];
            for (k, (&d, &i)) in dataset.iter().zip(&within).enumerate() {
                assert_eq!(i, counts[d as usize], "index within the dataset");
                counts[d as usize] += 1;
                for (c, share) in counts.iter().zip(&w) {
                    let want = share * (k + 1) as f64;
                    assert!(
                        (*c as f64 - want).abs() <= 1.0 + 1e-9,
                        "{weights:?} after {} samples: {c} against {want}",
                        k + 1
                    );
                }
            }
        }
    }

    #[test]
    fn weights_must_be_positive_somewhere() {
        assert!(normalise(&[0.0, 0.0]).is_none());
        assert!(normalise(&[]).is_none());
        assert!(normalise(&[1.0, f64::NAN]).is_none());
        assert_eq!(normalise(&[1.0, 3.0]).unwrap(), vec![0.25, 0.75]);
    }
}
