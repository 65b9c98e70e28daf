//! Weighted mixtures of token sources: Megatron's greedy apportioning.
//!
//! Megatron-LM's `build_blending_indices` (`megatron/core/datasets/helpers.cpp`) assigns sample
//! `k` of a blend to the dataset whose share is furthest behind: the one with the largest
//! `weight · max(k, 1) − count` (the first such, on a tie), and counts it. After `k` samples every
//! dataset's count is within 1 of `weight · k`. The assignment depends on the (normalised)
//! weights alone: no seed, no rank, no epoch.

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
