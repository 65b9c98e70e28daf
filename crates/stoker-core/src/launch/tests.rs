use super::*;

#[test]
fn global_batches_are_the_same_for_every_world_size() {
    let order: Vec<usize> = (0..50).map(|i| (i * 7) % 50).collect();
    // 50 entries, global batches of 24: two whole ones, the tail of 2 not dealt.
    for world in [1, 2, 3, 4, 6, 12] {
        let mut union = Vec::new();
        for rank in 0..world {
            let share = RankShare {
                rank,
                world_size: world,
                drop_last: false,
            };
            let deal = GlobalBatches::new(share, 24, 24 / world).unwrap();
            let mine = deal.dealt(&order);
            assert_eq!(mine.len(), deal.per_rank(order.len()));
            for (j, &entry) in mine.iter().enumerate() {
                assert_eq!(order[deal.position(j)], entry);
                union.push((deal.position(j), entry));
            }
        }
        union.sort_unstable();
        let want: Vec<(usize, usize)> = order[..48].iter().copied().enumerate().collect();
        assert_eq!(union, want, "world {world}");
    }
    let share = RankShare {
        rank: 0,
        world_size: 5,
        drop_last: false,
    };
    let e = GlobalBatches::new(share, 24, 2).unwrap_err().to_string();
    assert!(
        e.contains("global_batch_size") && e.contains("24") && e.contains("world_size 5"),
        "{e}"
    );
}
use std::collections::HashMap;

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

fn auto(pairs: &[(&str, &str)]) -> Result<Launch> {
    detect(&env(pairs), None, None)
}

#[test]
fn nothing_set_is_one_process() {
    assert_eq!(auto(&[]).unwrap(), Launch::SINGLE);
}

#[test]
fn torchrun_variables_resolve_the_launch() {
    let l = auto(&[
        ("RANK", "5"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "4"),
    ])
    .unwrap();
    assert_eq!(
        l,
        Launch {
            rank: 5,
            world_size: 8,
            local_rank: 1,
            local_world_size: 4,
            launcher: Launcher::Torchrun
        }
    );
}

#[test]
fn slurm_variables_with_the_node_task_list() {
    let base = [
        ("SLURM_PROCID", "4"),
        ("SLURM_NTASKS", "7"),
        ("SLURM_LOCALID", "0"),
        ("SLURM_NODEID", "2"),
        ("SLURM_TASKS_PER_NODE", "2(x2),3"),
    ];
    let l = auto(&base).unwrap();
    assert_eq!(
        (l.rank, l.world_size, l.local_rank, l.local_world_size),
        (4, 7, 0, 3)
    );
    assert_eq!(l.launcher, Launcher::Slurm);
    // Without the list, SLURM_NTASKS_PER_NODE gives the node's size.
    let l = auto(&[
        ("SLURM_PROCID", "1"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_NTASKS_PER_NODE", "2"),
    ])
    .unwrap();
    assert_eq!(
        (l.rank, l.world_size, l.local_rank, l.local_world_size),
        (1, 2, 1, 2)
    );
    let e = auto(&[
        ("SLURM_PROCID", "1"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_NODEID", "0"),
        ("SLURM_TASKS_PER_NODE", "two"),
    ])
    .unwrap_err();
    assert!(e.to_string().contains("SLURM_TASKS_PER_NODE=two"), "{e}");
}

#[test]
fn open_mpi_and_pmi_variables() {
    let l = auto(&[
        ("OMPI_COMM_WORLD_RANK", "1"),
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
    ])
    .unwrap();
    assert_eq!(
        (l.rank, l.world_size, l.local_rank, l.local_world_size),
        (1, 2, 1, 2)
    );
    assert_eq!(l.launcher, Launcher::OpenMpi);
    let l = auto(&[("PMI_RANK", "2"), ("PMI_SIZE", "3")]).unwrap();
    assert_eq!((l.rank, l.world_size, l.launcher), (2, 3, Launcher::Pmi));
    assert_eq!((l.local_rank, l.local_world_size), (0, 1));
    // srun --mpi=pmi2 sets both, agreeing.
    let l = auto(&[
        ("PMI_RANK", "2"),
        ("PMI_SIZE", "3"),
        ("SLURM_PROCID", "2"),
        ("SLURM_NTASKS", "3"),
    ])
    .unwrap();
    assert_eq!((l.rank, l.launcher), (2, Launcher::Pmi));
}

#[test]
fn torchrun_inside_srun_wins() {
    // One srun task per node, each a torchrun starting 4 trainers.
    let l = auto(&[
        ("RANK", "6"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "2"),
        ("LOCAL_WORLD_SIZE", "4"),
        ("SLURM_PROCID", "1"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_LOCALID", "0"),
    ])
    .unwrap();
    assert_eq!(
        (l.rank, l.world_size, l.launcher),
        (6, 8, Launcher::Torchrun)
    );
    assert_eq!((l.local_rank, l.local_world_size), (2, 4));
}

#[test]
fn inconsistent_variables_are_errors_naming_them() {
    for (pairs, needles) in [
        (
            vec![("RANK", "2"), ("WORLD_SIZE", "2")],
            vec!["RANK=2", "WORLD_SIZE=2"],
        ),
        (vec![("RANK", "1")], vec!["RANK=1", "WORLD_SIZE is not"]),
        (
            vec![("WORLD_SIZE", "4")],
            vec!["WORLD_SIZE=4", "RANK is not"],
        ),
        (vec![("RANK", "x"), ("WORLD_SIZE", "2")], vec!["RANK=x"]),
        (
            vec![
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("LOCAL_RANK", "3"),
                ("LOCAL_WORLD_SIZE", "2"),
            ],
            vec!["LOCAL_RANK=3", "LOCAL_WORLD_SIZE=2"],
        ),
        // A stale torchrun pair inside a bigger srun step.
        (
            vec![
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("SLURM_PROCID", "3"),
                ("SLURM_NTASKS", "4"),
            ],
            vec![
                "RANK=0",
                "WORLD_SIZE=2",
                "SLURM_PROCID=3",
                "SLURM_NTASKS=4",
                "disagree",
            ],
        ),
        // Two MPI launchers over the same processes with different ranks.
        (
            vec![
                ("OMPI_COMM_WORLD_RANK", "0"),
                ("OMPI_COMM_WORLD_SIZE", "2"),
                ("PMI_RANK", "1"),
                ("PMI_SIZE", "2"),
            ],
            vec!["OMPI_COMM_WORLD_RANK=0", "PMI_RANK=1", "disagree"],
        ),
    ] {
        let e = auto(&pairs).unwrap_err().to_string();
        for n in needles {
            assert!(e.contains(n), "{pairs:?}: {e} lacks {n}");
        }
    }
}

#[test]
fn explicit_values_win() {
    let torchrun = [
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "2"),
    ];
    let l = detect(&env(&torchrun), Some(0), Some(2)).unwrap();
    assert_eq!(
        (l.rank, l.world_size, l.launcher),
        (0, 2, Launcher::Explicit)
    );
    assert_eq!(
        (l.local_rank, l.local_world_size),
        (1, 2),
        "the node layout still holds"
    );
    // Both explicit: broken variables are not consulted.
    let l = detect(
        &env(&[("RANK", "9"), ("WORLD_SIZE", "2")]),
        Some(1),
        Some(4),
    )
    .unwrap();
    assert_eq!((l.rank, l.world_size, l.local_world_size), (1, 4, 1));
    // One explicit: the other comes from the launcher, and must fit.
    let l = detect(&env(&torchrun), None, Some(4)).unwrap();
    assert_eq!(
        (l.rank, l.world_size, l.launcher),
        (1, 4, Launcher::Torchrun)
    );
    let e = detect(&env(&torchrun), Some(3), None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("rank 3 (rank set explicitly)") && e.contains("RANK=1"),
        "{e}"
    );
    let e = detect(&env(&[]), Some(1), None).unwrap_err().to_string();
    assert!(e.contains("no launcher variables"), "{e}");
}

#[test]
fn usable_cores_is_at_least_one() {
    assert!(usable_cores() >= 1);
    assert!(usable_cores() <= std::thread::available_parallelism().unwrap().get());
}
