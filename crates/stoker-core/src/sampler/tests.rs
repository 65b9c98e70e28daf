use super::*;
use std::collections::HashSet;

fn sampler(kind: SamplerKind, n: usize, seed: u64) -> Sampler {
    Sampler::new(kind, n, seed).unwrap()
}

fn random(replacement: bool, num_samples: Option<usize>) -> SamplerKind {
    SamplerKind::Random {
        replacement,
        num_samples,
    }
}

#[test]
fn sequential_is_identity() {
    let s = sampler(SamplerKind::Sequential, 5, 0);
    assert_eq!(s.epoch_indices(3), vec![0, 1, 2, 3, 4]);
    assert_eq!(s.len(), 5);
}

#[test]
fn quasi_random_shuffles_pages_and_samples_within_windows_of_pages() {
    // 4 pages of 3 samples each, windows of 2 pages.
    let pages: Vec<u64> = (0..12).map(|i| i / 3).collect();
    let kind = SamplerKind::QuasiRandom {
        pages: pages.clone(),
        window: 2,
    };
    let s = Sampler::new(kind, 12, 5).unwrap();
    let e0 = s.global_indices(0);
    let mut sorted = e0.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..12).collect::<Vec<_>>(), "every sample once");
    assert_eq!(e0, s.global_indices(0), "a function of (seed, epoch)");
    assert!(
        (1..8).any(|e| s.global_indices(e) != e0),
        "changes per epoch"
    );
    for window in e0.chunks(6) {
        let mut touched: Vec<u64> = window.iter().map(|&i| pages[i]).collect();
        touched.sort_unstable();
        touched.dedup();
        assert_eq!(touched.len(), 2, "each window reads whole pages: {e0:?}");
    }
    let bad = SamplerKind::QuasiRandom {
        pages: vec![1, 0],
        window: 2,
    };
    assert!(Sampler::new(bad, 2, 0).is_err());
}

#[test]
fn permutations_cover_every_index_once_and_change_per_epoch() {
    for n in [0, 1, 2, 7, 100, 1001] {
        for seed in 0..5 {
            let s = sampler(random(false, None), n, seed);
            let e0 = s.epoch_indices(0);
            let mut sorted = e0.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "n={n} seed={seed}");
            assert_eq!(s.epoch_indices(0), e0, "pure function of (seed, epoch)");
            if n > 10 {
                assert_ne!(s.epoch_indices(1), e0, "new permutation each epoch");
            }
        }
    }
}

#[test]
fn random_num_samples_concatenates_permutations() {
    let s = sampler(random(false, Some(25)), 10, 1);
    let idx = s.epoch_indices(0);
    assert_eq!(idx.len(), 25);
    for chunk in [&idx[0..10], &idx[10..20]] {
        let set: HashSet<_> = chunk.iter().collect();
        assert_eq!(set.len(), 10);
    }
    let tail: HashSet<_> = idx[20..].iter().collect();
    assert_eq!(tail.len(), 5);
}

#[test]
fn with_replacement_draws_num_samples_in_range() {
    let s = sampler(random(true, Some(1000)), 7, 3);
    let idx = s.epoch_indices(0);
    assert_eq!(idx.len(), 1000);
    assert!(idx.iter().all(|&i| i < 7));
    let distinct: HashSet<_> = idx.iter().collect();
    assert_eq!(distinct.len(), 7);
    assert!(Sampler::new(random(true, None), 0, 0).is_err());
    assert!(Sampler::new(random(false, Some(0)), 3, 0).is_err());
}

#[test]
fn subset_random_permutes_the_subset() {
    let subset = vec![9, 3, 5, 1];
    let s = sampler(
        SamplerKind::SubsetRandom {
            indices: subset.clone(),
        },
        10,
        0,
    );
    let mut got = s.epoch_indices(2);
    got.sort_unstable();
    assert_eq!(got, vec![1, 3, 5, 9]);
    let err = Sampler::new(SamplerKind::SubsetRandom { indices: vec![10] }, 10, 0);
    assert!(err.unwrap_err().to_string().contains("subset index 10"));
}

#[test]
fn weighted_with_replacement_follows_weights() {
    let s = sampler(
        SamplerKind::WeightedRandom {
            weights: vec![1.0, 0.0, 3.0],
            num_samples: 40_000,
            replacement: true,
        },
        3,
        0,
    );
    let idx = s.epoch_indices(0);
    let c0 = idx.iter().filter(|&&i| i == 0).count() as f64;
    let c2 = idx.iter().filter(|&&i| i == 2).count() as f64;
    assert!(!idx.contains(&1), "zero weight is never drawn");
    assert!((c2 / c0 - 3.0).abs() < 0.25, "ratio {}", c2 / c0);
}

#[test]
fn weighted_without_replacement_is_distinct_and_favours_heavy() {
    let mut heavy_first = 0;
    for epoch in 0..400 {
        let s = sampler(
            SamplerKind::WeightedRandom {
                weights: vec![1.0, 9.0, 0.0, 1.0],
                num_samples: 3,
                replacement: false,
            },
            4,
            5,
        );
        let idx = s.epoch_indices(epoch);
        let set: HashSet<_> = idx.iter().collect();
        assert_eq!(set.len(), 3);
        assert!(!idx.contains(&2));
        heavy_first += usize::from(idx[0] == 1);
    }
    // P(first draw is index 1) = 9/11 ≈ 0.82.
    assert!((290..370).contains(&heavy_first), "{heavy_first}");
    let too_many = Sampler::new(
        SamplerKind::WeightedRandom {
            weights: vec![1.0, 0.0],
            num_samples: 2,
            replacement: false,
        },
        2,
        0,
    );
    assert!(too_many.is_err());
}

fn dist(rank: usize, world_size: usize, shuffle: bool, drop_last: bool) -> SamplerKind {
    SamplerKind::Distributed {
        rank,
        world_size,
        shuffle,
        drop_last,
    }
}

/// PyTorch's `DistributedSampler.__len__`, written as in its source.
fn torch_num_samples(n: usize, world: usize, drop_last: bool) -> usize {
    if drop_last && !n.is_multiple_of(world) {
        ((n as f64 - world as f64) / world as f64).ceil().max(0.0) as usize
    } else {
        (n as f64 / world as f64).ceil() as usize
    }
}

#[test]
fn distributed_shards_are_disjoint_cover_and_match_torch_lengths() {
    for n in [1, 2, 5, 10, 11, 17, 64, 101] {
        for world in 1..=6 {
            for shuffle in [false, true] {
                for drop_last in [false, true] {
                    let shards: Vec<Vec<usize>> = (0..world)
                        .map(|r| sampler(dist(r, world, shuffle, drop_last), n, 9).epoch_indices(4))
                        .collect();
                    let expect = torch_num_samples(n, world, drop_last);
                    for s in &shards {
                        assert_eq!(s.len(), expect, "n={n} world={world} drop={drop_last}");
                    }
                    let all: Vec<usize> = shards.iter().flatten().copied().collect();
                    let distinct: HashSet<_> = all.iter().collect();
                    if drop_last {
                        // Disjoint: no index twice, and only a tail of < world dropped.
                        assert_eq!(distinct.len(), all.len());
                        assert!(n - all.len() < world);
                    } else {
                        // Cover: every index appears; repeats only the padding.
                        assert_eq!(distinct.len(), n);
                        assert_eq!(all.len() - n, expect * world - n);
                    }
                }
            }
        }
    }
}

#[test]
fn distributed_pads_with_head_and_splits_strided() {
    // n=5, world=2 → total 6, order [0,1,2,3,4,0]; rank 0 takes 0,2,4 and rank 1 takes 1,3,0.
    assert_eq!(
        sampler(dist(0, 2, false, false), 5, 0).epoch_indices(0),
        vec![0, 2, 4]
    );
    assert_eq!(
        sampler(dist(1, 2, false, false), 5, 0).epoch_indices(0),
        vec![1, 3, 0]
    );
    // drop_last: total 4 → rank 1 takes 1,3.
    assert_eq!(
        sampler(dist(1, 2, false, true), 5, 0).epoch_indices(0),
        vec![1, 3]
    );
    // Padding longer than the dataset repeats it: n=2, world=5 → [0,1,0,1,0].
    assert_eq!(
        sampler(dist(4, 5, false, false), 2, 0).epoch_indices(0),
        vec![0]
    );
    assert!(Sampler::new(dist(2, 2, false, false), 5, 0).is_err());
}

#[test]
fn batch_plan_lengths_match_batch_sampler() {
    for n in 0..40 {
        for bs in 1..9 {
            for drop_last in [false, true] {
                let plan = BatchPlan::new((0..n).collect(), bs, drop_last);
                let expect = if drop_last { n / bs } else { n.div_ceil(bs) };
                assert_eq!(plan.num_batches(), expect);
                let total: usize = (0..plan.num_batches()).map(|i| plan.batch(i).len()).sum();
                assert_eq!(total, if drop_last { expect * bs } else { n });
            }
        }
    }
}
