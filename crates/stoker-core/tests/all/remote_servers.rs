//! Reads shards served by real servers on 127.0.0.1: nginx over HTTP and HTTPS, and an
//! S3-compatible server (moto) over `s3://`. `ctests/remote/run.sh` starts the servers, uploads
//! the shards, sets `STOKER_REMOTE_HTTP`, `STOKER_REMOTE_HTTPS` (nginx over TLS, its authority
//! trusted through `SSL_CERT_FILE`), `STOKER_REMOTE_S3` (shard patterns), `STOKER_REMOTE_SAMPLES`,
//! `STOKER_REMOTE_WWW` (the directory nginx serves, where a packed dataset is written) and the
//! `AWS_*` variables, and runs these with `--ignored`; plain `cargo test` skips them. The token
//! files it also serves (`tok-web.idx`/`.bin`, a Megatron dataset, `tok-flat.bin`, and
//! `tok-docs.bin` with its sidecar of lengths) are read remotely and compared with the same files
//! read from the served directory; so is a Parquet file of text the nginx tests write there.
#![cfg(feature = "remote")]

use std::path::PathBuf;

use stoker_core::{Loader, LoaderOptions};

fn env(key: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| panic!("{key} is set by ctests/remote/run.sh"))
}

fn labels(l: &mut Loader) -> Vec<i64> {
    let mut out: Vec<i64> = l
        .epoch_iter()
        .flat_map(|b| {
            let b = b.unwrap();
            b.field_by_name("label")
                .unwrap()
                .data
                .unwrap()
                .chunks_exact(8)
                .map(|c| i64::from_ne_bytes(c.try_into().unwrap()))
                .collect::<Vec<_>>()
        })
        .collect();
    out.sort();
    out
}

/// Every sample once, in both modes, the second loader from the cache, the second epoch too.
fn read_all(pattern: &str, tag: &str) {
    let samples: i64 = env("STOKER_REMOTE_SAMPLES").parse().unwrap();
    let cache: PathBuf = std::env::temp_dir().join(format!(
        "stoker-remote-servers-{tag}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&cache);
    for shuffle_buffer in ["0", "16"] {
        let mut o = LoaderOptions::new();
        o.set("source", &format!("tar:{pattern}")).unwrap();
        o.set("fields", "cls:label").unwrap();
        o.set("batch_size", "5").unwrap();
        o.set("shuffle_buffer", shuffle_buffer).unwrap();
        o.set("cache_dir", cache.to_str().unwrap()).unwrap();
        o.set("shard_prefetch", "3").unwrap();
        let mut l = Loader::new(&o).unwrap();
        assert_eq!(labels(&mut l), (0..samples).collect::<Vec<_>>());
        l.set_epoch(1).unwrap();
        assert_eq!(labels(&mut l), (0..samples).collect::<Vec<_>>());
    }
    let parts = std::fs::read_dir(&cache)
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_str().unwrap().ends_with(".part")
        })
        .count();
    assert_eq!(parts, 0);
    std::fs::remove_dir_all(&cache).unwrap();
}

#[test]
#[ignore = "needs nginx on 127.0.0.1: run by ctests/remote/run.sh"]
fn nginx_http_shards() {
    read_all(&env("STOKER_REMOTE_HTTP"), "http");
}

#[test]
#[ignore = "needs nginx with TLS on 127.0.0.1: run by ctests/remote/run.sh"]
fn nginx_https_shards() {
    read_all(&env("STOKER_REMOTE_HTTPS"), "https");
}

#[test]
#[ignore = "needs an S3 server on 127.0.0.1: run by ctests/remote/run.sh"]
fn s3_server_shards() {
    read_all(&env("STOKER_REMOTE_S3"), "s3");
}

#[test]
#[ignore = "needs nginx on 127.0.0.1: run by ctests/remote/run.sh"]
fn nginx_missing_shard_is_a_404_naming_the_url() {
    let pattern = env("STOKER_REMOTE_HTTP").replace("shard-", "absent-");
    let mut o = LoaderOptions::new();
    o.set("source", &format!("tar:{pattern}")).unwrap();
    let err = Loader::new(&o).err().unwrap().to_string();
    assert!(err.contains("absent-000.tar"), "{err}");
    assert!(err.contains("HTTP 404"), "{err}");
}

#[test]
#[ignore = "needs an S3 server on 127.0.0.1: run by ctests/remote/run.sh"]
fn s3_wrong_credentials_fail_without_showing_them() {
    let secret = std::env::var("AWS_SECRET_ACCESS_KEY").unwrap();
    let pattern = env("STOKER_REMOTE_S3").replace("stoker-test", "no-such-bucket");
    let mut o = LoaderOptions::new();
    o.set("source", &format!("tar:{pattern}")).unwrap();
    let err = Loader::new(&o).err().unwrap().to_string();
    assert!(err.contains("s3://no-such-bucket/"), "{err}");
    assert!(err.contains("HTTP 404"), "{err}");
    assert!(!err.contains(&secret), "{err}");
}

#[test]
#[ignore = "needs nginx on 127.0.0.1: run by ctests/remote/run.sh"]
fn nginx_packed_dataset() {
    use stoker_core::pack::{pack, PackOptions};
    use stoker_core::source::MemorySource;
    use stoker_core::DType;

    // Packed into the directory nginx serves, then read back by its URL.
    let samples: i64 = env("STOKER_REMOTE_SAMPLES").parse().unwrap();
    let www = PathBuf::from(env("STOKER_REMOTE_WWW"));
    let ids: Vec<u8> = (0..samples).flat_map(|i| i.to_ne_bytes()).collect();
    let pixels: Vec<u8> = (0..samples as usize * 2048).map(|i| i as u8).collect();
    let source = MemorySource::new()
        .with_tensor("label", DType::I64, &[], ids)
        .unwrap()
        .with_tensor("pixels", DType::U8, &[2048], pixels)
        .unwrap();
    let options = PackOptions {
        page_size: 4096,
        shard_size: Some(24 << 10),
        ..PackOptions::default()
    };
    let report = pack(&source, &www.join("packed"), &options, &|_, _| {}).unwrap();
    assert!(report.files.len() > 1, "{:?}", report.files);
    let http = env("STOKER_REMOTE_HTTP");
    let base = format!("{}/packed/", &http[..http.rfind('/').unwrap()]);
    let cache = std::env::temp_dir().join(format!("stoker-remote-packed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    for _ in 0..2 {
        // The second loader finds every file in the cache.
        let mut o = LoaderOptions::new();
        o.set("source", &format!("packed:{base}")).unwrap();
        o.set("batch_size", "5").unwrap();
        o.set("shuffle", "true").unwrap();
        o.set("cache_dir", cache.to_str().unwrap()).unwrap();
        let mut l = Loader::new(&o).unwrap();
        assert_eq!(labels(&mut l), (0..samples).collect::<Vec<_>>());
    }
    std::fs::remove_dir_all(&cache).unwrap();
}

/// Every sample of a token source, each field's bytes, through a loader with `extra` options.
fn token_rows(source: &str, extra: &[(&str, &str)]) -> Vec<Vec<u8>> {
    let mut o = LoaderOptions::new();
    o.set("source", source).unwrap();
    o.set("seq_len", "16").unwrap();
    o.set("document_boundaries", "reset").unwrap();
    o.set("batch_size", "4").unwrap();
    o.set("num_workers", "0").unwrap();
    for (k, v) in extra {
        o.set(k, v).unwrap();
    }
    let mut l = Loader::new(&o).unwrap_or_else(|e| panic!("{source}: {e}"));
    l.epoch_iter()
        .flat_map(|b| {
            let b = b.unwrap();
            ["input_ids", "labels", "position_ids"]
                .iter()
                .map(|name| b.field_by_name(name).unwrap().data.unwrap().to_vec())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// `megatron:` and `tokens:` sources at `base` (a URL ending in `/`) equal the same files read
/// locally, the second time from the cache (whose files are then the only copies read); a flat
/// file's sidecar of document lengths is found and read as a local one is (its documents are
/// in `position_ids`), and a flat file without one (a 404) is one document.
fn read_tokens(base: &str, tag: &str) {
    let www = PathBuf::from(env("STOKER_REMOTE_WWW"));
    let cache: PathBuf =
        std::env::temp_dir().join(format!("stoker-remote-tokens-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let cache_dir = cache.to_str().unwrap();
    for (remote, local, extra) in [
        (
            format!("megatron:{base}tok-web"),
            format!("megatron:{}", www.join("tok-web").display()),
            vec![],
        ),
        (
            format!("tokens:{base}tok-flat.bin"),
            format!("tokens:{}", www.join("tok-flat.bin").display()),
            vec![("token_dtype", "uint16")],
        ),
        (
            format!("tokens:{base}tok-docs.bin"),
            format!("tokens:{}", www.join("tok-docs.bin").display()),
            vec![("token_dtype", "uint16")],
        ),
        (
            format!("tokens:{base}tok-docs.bin"),
            format!("tokens:{}", www.join("tok-docs.bin").display()),
            vec![("token_dtype", "uint16"), ("token_packing", "pad")],
        ),
    ] {
        let want = token_rows(&local, &extra);
        assert!(!want.is_empty());
        let mut with_cache = extra.clone();
        with_cache.push(("cache_dir", cache_dir));
        for round in 0..2 {
            assert_eq!(
                token_rows(&remote, &with_cache),
                want,
                "{remote} round {round}"
            );
        }
        // Without cache_dir: a private cache, removed with the loader.
        assert_eq!(token_rows(&remote, &extra), want, "{remote}, private cache");
    }
    // The index's tables were cached beside its downloaded copy, and loaded the second time.
    let names: Vec<String> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names
            .iter()
            .any(|n| n.starts_with('.') && n.ends_with("-tok-web.idx.stkidx")),
        "{names:?}"
    );
    std::fs::remove_dir_all(&cache).unwrap();
}

/// A `parquet:` file at `base` (a URL ending in `/` of the served directory, where it is
/// written now) equals the same file read locally; its tokenizer is a local file.
#[cfg(feature = "tokenizers")]
fn read_parquet(base: &str, tag: &str) {
    use crate::token_parquet::{rows, write_parquet, write_tokenizer};
    let www = PathBuf::from(env("STOKER_REMOTE_WWW"));
    let name = format!("text-{tag}.parquet");
    write_parquet(&www.join(&name), &rows(40, 3), 8);
    let tokenizer = www.join(format!("tokenizer-{tag}.json"));
    write_tokenizer(&tokenizer);
    let extra = [
        ("tokenizer", tokenizer.to_str().unwrap()),
        ("eos_token", "1"),
    ];
    let want = token_rows(&format!("parquet:{}", www.join(&name).display()), &extra);
    assert!(!want.is_empty());
    assert_eq!(
        token_rows(&format!("parquet:{base}{name}"), &extra),
        want,
        "{base}{name}"
    );
}

/// A `parquet:` table at `base` (written into the served directory now) reads, row for row,
/// as the same file read locally.
#[cfg(feature = "parquet")]
fn read_parquet_table(base: &str, tag: &str) {
    use crate::parquet_table::{rows, write_table};
    let www = PathBuf::from(env("STOKER_REMOTE_WWW"));
    let name = format!("table-{tag}.parquet");
    write_table(&www.join(&name), &rows(9, 0), 4);
    let every_row = |spec: String| {
        let mut o = LoaderOptions::new();
        o.set("source", &spec).unwrap();
        let source = o.source().unwrap().open(None, false).unwrap();
        let mut scratch = Vec::new();
        (0..source.len())
            .map(|i| {
                let sample = source.read(i, &mut scratch).unwrap();
                (0..source.fields().len())
                    .map(|k| sample.get(k).to_vec())
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
    };
    let want = every_row(format!("parquet:{}", www.join(&name).display()));
    assert_eq!(want.len(), 9);
    assert_eq!(
        every_row(format!("parquet:{base}{name}")),
        want,
        "{base}{name}"
    );
}

#[test]
#[ignore = "needs nginx on 127.0.0.1: run by ctests/remote/run.sh"]
fn nginx_http_token_files() {
    let http = env("STOKER_REMOTE_HTTP");
    read_tokens(&http[..=http.rfind('/').unwrap()], "http");
    #[cfg(feature = "tokenizers")]
    read_parquet(&http[..=http.rfind('/').unwrap()], "http");
    #[cfg(feature = "parquet")]
    read_parquet_table(&http[..=http.rfind('/').unwrap()], "http");
}

#[test]
#[ignore = "needs nginx with TLS on 127.0.0.1: run by ctests/remote/run.sh"]
fn nginx_https_token_files() {
    let https = env("STOKER_REMOTE_HTTPS");
    read_tokens(&https[..=https.rfind('/').unwrap()], "https");
    #[cfg(feature = "tokenizers")]
    read_parquet(&https[..=https.rfind('/').unwrap()], "https");
    #[cfg(feature = "parquet")]
    read_parquet_table(&https[..=https.rfind('/').unwrap()], "https");
}

#[test]
#[ignore = "needs an S3 server on 127.0.0.1: run by ctests/remote/run.sh"]
fn s3_server_token_files() {
    let s3 = env("STOKER_REMOTE_S3");
    read_tokens(&s3[..=s3.rfind('/').unwrap()], "s3");
}

#[test]
#[ignore = "needs nginx on 127.0.0.1: run by ctests/remote/run.sh"]
fn nginx_missing_megatron_dataset_is_a_404_naming_the_url() {
    let http = env("STOKER_REMOTE_HTTP");
    let url = format!("{}absent-web", &http[..=http.rfind('/').unwrap()]);
    let mut o = LoaderOptions::new();
    o.set("source", &format!("megatron:{url}")).unwrap();
    o.set("seq_len", "16").unwrap();
    let err = Loader::new(&o).err().unwrap().to_string();
    assert!(err.contains(&format!("{url}.idx")), "{err}");
    assert!(err.contains("404"), "{err}");
}
