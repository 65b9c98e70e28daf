//! Inputs the fuzz targets (crates/stoker-core/fuzz) found to crash, kept as tests so that the
//! fix stays fixed on stable Rust, without the fuzzer. Crashes fixed where they were found
//! live next to their code (the npy header's are in `source/npy.rs`); these are the ones whose
//! fix belongs to another module.

use stoker_core::{ErrorKind, LoaderOptions};

/// `options` target, crash-df7fc0815f3d0ed907330c8e2c30861f70c7a710 and
/// oom-b7a42cf3969300f35ed8e199c1623acc74c151c1: a `subset` range is expanded into a Vec of
/// every index before anything bounds it, so `0..31849551616` asks for 254 GB and aborts the
/// process ("memory allocation of ... bytes failed"), and `3..307767095,7:9` allocates 2.4 GB
/// before the malformed `7:9` is even read.
#[test]
fn a_huge_subset_range_is_an_error_not_an_abort() {
    // Ranges are kept as ranges when set, and checked against the dataset (and memory) when
    // the loader is made: nothing is expanded before that.
    let source = stoker_core::testing::counting_source(10);
    for value in ["0..31849551616", "0..18446744073709551615"] {
        let o = LoaderOptions::new()
            .with_source(stoker_core::SourceSpec::Custom(source.clone()))
            .with("subset", value)
            .expect("a range is stored, not expanded");
        let err = stoker_core::Loader::new(&o).expect_err("a subset this large must be refused");
        assert!(err.to_string().contains("`subset`"), "{err}");
    }
    let err = LoaderOptions::new()
        .set("subset", "3..307767095,7:9 ,}cuda:bstt=e5o5")
        .expect_err("malformed");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.to_string().contains("`subset`"), "{err}");
}
