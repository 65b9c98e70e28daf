//! A sidecar of document lengths (`NAME.lengths.npy`) gives a flat token file its documents:
//! the same samples as a Megatron dataset of the same documents, under both packings; a sum
//! that disagrees with the file, or a sidecar beside `eos_token`, is an error naming both; a
//! glob never takes a sidecar for a token file; its document starts are cached like an index's.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use stoker_core::source::tokens::{Packing, TokenType};
use stoker_core::source::{write_npy, TokenConfig, TokenSource, TokenSpec};
use stoker_core::DType;

use crate::support::files::tmp;
use crate::token_index::{config, docs, fresh};

fn flat_config(packing: Packing) -> TokenConfig {
    TokenConfig {
        raw: Some(TokenType::U16),
        ..config(packing)
    }
}

fn flat_samples(spec: &TokenSpec, packing: Packing) -> Vec<Vec<Vec<u8>>> {
    let source = TokenSource::open(spec, &flat_config(packing)).unwrap_or_else(|e| panic!("{e}"));
    let mut scratch = Vec::new();
    (0..stoker_core::source::Source::len(&source))
        .map(|i| {
            let s = stoker_core::source::Source::read(&source, i, &mut scratch).unwrap();
            (0..stoker_core::source::Source::fields(&source).len())
                .map(|f| s.get(f).to_vec())
                .collect()
        })
        .collect()
}

/// `docs` as raw uint16 tokens at `path`.
fn write_raw(path: &Path, docs: &[Vec<i64>]) {
    let bytes: Vec<u8> = docs
        .concat()
        .iter()
        .flat_map(|&t| (t as u16).to_le_bytes())
        .collect();
    std::fs::write(path, bytes).unwrap();
}

/// `docs`' lengths as an int64 `.npy` at `path`.
fn write_lengths(path: &Path, lengths: &[i64]) {
    let bytes: Vec<u8> = lengths.iter().flat_map(|l| l.to_le_bytes()).collect();
    write_npy(path, DType::I64, &[lengths.len()], &bytes).unwrap();
}

fn lengths_of(docs: &[Vec<i64>]) -> Vec<i64> {
    docs.iter().map(|d| d.len() as i64).collect()
}

#[test]
fn a_sidecar_gives_the_documents_a_megatron_index_would() {
    let dir = tmp("token-lengths");
    let (a, b) = (docs(&[3, 0, 9, 1, 12, 4], 100), docs(&[7, 2, 6, 11], 5000));
    write_raw(&dir.join("a.bin"), &a);
    write_lengths(&dir.join("a.lengths.npy"), &lengths_of(&a));
    // An int32 .npy token file, its lengths as int32.
    let tokens: Vec<u8> = b
        .concat()
        .iter()
        .flat_map(|&t| (t as i32).to_le_bytes())
        .collect();
    let count = tokens.len() / 4;
    write_npy(&dir.join("b.npy"), DType::I32, &[count], &tokens).unwrap();
    let lengths: Vec<u8> = lengths_of(&b)
        .iter()
        .flat_map(|&l| (l as i32).to_le_bytes())
        .collect();
    write_npy(&dir.join("b.lengths.npy"), DType::I32, &[b.len()], &lengths).unwrap();

    let spec = TokenSpec::Flat(format!(
        "{},{}",
        dir.join("a.bin").display(),
        dir.join("b.npy").display()
    ));
    for packing in [Packing::Concat, Packing::Pad] {
        let want = fresh("token-lengths-ref", &[a.clone(), b.clone()], packing);
        assert_eq!(flat_samples(&spec, packing), want, "{packing:?}");
        let cache = dir.join(".a.lengths.npy.stkidx");
        let at = std::fs::metadata(&cache).unwrap().ino();
        assert_eq!(flat_samples(&spec, packing), want, "{packing:?}: cached");
        assert_eq!(std::fs::metadata(&cache).unwrap().ino(), at, "loaded");
    }
    // A glob takes the token files only.
    let glob = TokenSpec::Flat(format!("{}/*.npy", dir.display()));
    let only_b = fresh("token-lengths-ref", std::slice::from_ref(&b), Packing::Pad);
    assert_eq!(flat_samples(&glob, Packing::Pad), only_b);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_sidecar_that_disagrees_is_an_error_naming_both_files() {
    let dir = tmp("token-lengths-bad");
    let data = dir.join("d.bin");
    let sidecar = dir.join("d.lengths.npy");
    let d = docs(&[4, 5, 6], 10);
    write_raw(&data, &d);
    let spec = TokenSpec::Flat(data.display().to_string());
    let open = |config: &TokenConfig| match TokenSource::open(&spec, config) {
        Ok(_) => panic!("opened"),
        Err(e) => e.to_string(),
    };

    write_lengths(&sidecar, &[4, 5, 7]);
    let e = open(&flat_config(Packing::Pad));
    for needle in [
        sidecar.display().to_string(),
        data.display().to_string(),
        "sum to 16 tokens".into(),
        "holds 15 tokens".into(),
    ] {
        assert!(e.contains(&needle), "{needle}: {e}");
    }
    write_lengths(&sidecar, &[4, -1, 12]);
    let e = open(&flat_config(Packing::Concat));
    assert!(e.contains("document 1 has length -1"), "{e}");
    write_npy(&sidecar, DType::F32, &[1], &15f32.to_le_bytes()).unwrap();
    let e = open(&flat_config(Packing::Concat));
    assert!(e.contains("'<f4'") && e.contains("integers"), "{e}");

    write_lengths(&sidecar, &lengths_of(&d));
    let e = open(&TokenConfig {
        eos: Some(3),
        ..flat_config(Packing::Concat)
    });
    assert!(
        e.contains("eos_token") && e.contains(&sidecar.display().to_string()),
        "{e}"
    );
    let only = TokenSpec::Flat(sidecar.display().to_string());
    match TokenSource::open(&only, &flat_config(Packing::Concat)) {
        Ok(_) => panic!("a sidecar alone opened"),
        Err(e) => assert!(e.to_string().contains("only sidecars"), "{e}"),
    }
    // Fixed, it opens: the failed opens cached nothing wrong.
    assert_eq!(
        flat_samples(&spec, Packing::Pad),
        fresh("token-lengths-bad-ref", &[d], Packing::Pad)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `stoker pack` of a flat file whose documents `eos_token` ends (nanoGPT's layout): packing
/// reads every token anyway, so it finds the documents there and writes them as the sidecar,
/// which opening alone cannot. The packed file then gives the samples of a Megatron dataset of
/// the same documents, the end-of-document token ending each but the last.
#[test]
fn a_flat_file_ended_by_eos_token_packs_with_its_documents_as_the_sidecar() {
    let dir = tmp("token-lengths-eos-pack");
    let eos = 9;
    let documents = vec![
        vec![1, 2, eos],
        vec![eos],
        vec![3, 4, 5, 6, 7, 8, 10, 11, eos],
        vec![12, 13],
    ];
    write_raw(&dir.join("text.bin"), &documents);
    let spec = TokenSpec::Flat(dir.join("text.bin").display().to_string());
    let config = TokenConfig {
        eos: Some(eos as u64),
        ..flat_config(Packing::Concat)
    };
    let source = TokenSource::open(&spec, &config).unwrap();
    let out = dir.join("packed.npy");
    let report = source.write_flat(&out, &mut |_| {}).unwrap();
    assert_eq!((report.documents, report.tokens), (4, 15));
    let packed = TokenSpec::Flat(out.display().to_string());
    for packing in [Packing::Pad, Packing::Concat] {
        assert_eq!(
            flat_samples(&packed, packing),
            fresh(
                &format!("token-lengths-eos-pack-{packing:?}"),
                std::slice::from_ref(&documents),
                packing
            ),
            "{packing:?}"
        );
    }
}
