//! `parquet:` tables: Hugging Face-style image datasets (an `image` struct of `bytes` and
//! `path`, an int64 `label`) written by the `parquet` crate's own writer, read a row a sample:
//! images decode as a tar shard's `jpg` does, numbers keep their values, reads in any order
//! equal reads in order, and the errors name the file, row and column. The Python suite checks
//! the same against files pyarrow writes.

use std::fs;
use std::path::Path;
use std::sync::Arc;

use parquet::basic::Compression;
use parquet::data_type::{BoolType, ByteArray, ByteArrayType, DoubleType, Int32Type, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use stoker_core::pack::{open_source_with_fields, pack, PackOptions};
use stoker_core::source::FieldSpec;
use stoker_core::source::PackedSource;
use stoker_core::{Batch, DType, Loader, LoaderOptions, Source};

use crate::support::files::{test_image, tmp, write_tar};

const SCHEMA: &str = "message row {
    optional group image { optional binary bytes; optional binary path (UTF8); }
    required int64 label;
    optional double score;
    optional binary caption (UTF8);
    optional int32 small (UINT_32);
    optional boolean flag;
}";

/// The test photos, JPEG and PNG, in turn.
fn photos() -> Vec<Vec<u8>> {
    ["photo_444.jpg", "photo_png.png", "photo_progressive.jpg"]
        .map(test_image)
        .into()
}

/// One row: its image (`None`: null bytes) and numbers.
#[derive(Clone)]
pub(crate) struct Row {
    image: Option<Vec<u8>>,
    label: i64,
    score: f64,
    small: u32,
}

pub(crate) fn rows(n: usize, base: usize) -> Vec<Row> {
    let photos = photos();
    (0..n)
        .map(|i| Row {
            image: Some(photos[(i + base) % photos.len()].clone()),
            label: ((i + base) % 7) as i64,
            score: (i + base) as f64 * 0.25 - 1.0,
            small: u32::MAX - (i + base) as u32,
        })
        .collect()
}

/// `rows` as a Parquet file of `group` rows a row group (snappy).
pub(crate) fn write_table(path: &Path, rows: &[Row], group: usize) {
    let schema = Arc::new(parse_message_type(SCHEMA).unwrap());
    let props = Arc::new(
        WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .build(),
    );
    let mut writer =
        SerializedFileWriter::new(fs::File::create(path).unwrap(), schema, props).unwrap();
    for chunk in rows.chunks(group) {
        let mut g = writer.next_row_group().unwrap();
        // image.bytes: defined at level 2; level 1 is an image struct without bytes.
        let mut c = g.next_column().unwrap().unwrap();
        let bytes: Vec<ByteArray> = chunk
            .iter()
            .filter_map(|r| r.image.clone().map(ByteArray::from))
            .collect();
        let defs: Vec<i16> = chunk
            .iter()
            .map(|r| if r.image.is_some() { 2 } else { 1 })
            .collect();
        c.typed::<ByteArrayType>()
            .write_batch(&bytes, Some(&defs), None)
            .unwrap();
        c.close().unwrap();
        let mut c = g.next_column().unwrap().unwrap();
        let paths: Vec<ByteArray> = (0..chunk.len())
            .map(|i| ByteArray::from(format!("{i}.jpg").as_str()))
            .collect();
        c.typed::<ByteArrayType>()
            .write_batch(&paths, Some(&vec![2; chunk.len()]), None)
            .unwrap();
        c.close().unwrap();
        let mut c = g.next_column().unwrap().unwrap();
        let labels: Vec<i64> = chunk.iter().map(|r| r.label).collect();
        c.typed::<Int64Type>()
            .write_batch(&labels, None, None)
            .unwrap();
        c.close().unwrap();
        let mut c = g.next_column().unwrap().unwrap();
        let scores: Vec<f64> = chunk.iter().map(|r| r.score).collect();
        c.typed::<DoubleType>()
            .write_batch(&scores, Some(&vec![1; chunk.len()]), None)
            .unwrap();
        c.close().unwrap();
        let mut c = g.next_column().unwrap().unwrap();
        let captions: Vec<ByteArray> = chunk.iter().map(|_| ByteArray::from("a photo")).collect();
        c.typed::<ByteArrayType>()
            .write_batch(&captions, Some(&vec![1; chunk.len()]), None)
            .unwrap();
        c.close().unwrap();
        let mut c = g.next_column().unwrap().unwrap();
        let small: Vec<i32> = chunk.iter().map(|r| r.small as i32).collect();
        c.typed::<Int32Type>()
            .write_batch(&small, Some(&vec![1; chunk.len()]), None)
            .unwrap();
        c.close().unwrap();
        let mut c = g.next_column().unwrap().unwrap();
        let flags: Vec<bool> = chunk.iter().map(|r| r.label % 2 == 1).collect();
        c.typed::<BoolType>()
            .write_batch(&flags, Some(&vec![1; chunk.len()]), None)
            .unwrap();
        c.close().unwrap();
        g.close().unwrap();
    }
    writer.close().unwrap();
}

/// Two files of 11 and 6 rows, row groups of 4; returns the `parquet:` pattern and the rows.
fn two_files(dir: &Path) -> (String, Vec<Row>) {
    let (a, b) = (rows(11, 0), rows(6, 11));
    write_table(&dir.join("t-0.parquet"), &a, 4);
    write_table(&dir.join("t-1.parquet"), &b, 4);
    (
        format!("{}/t-{{0..1}}.parquet", dir.display()),
        a.into_iter().chain(b).collect(),
    )
}

fn open(pattern: &str, kv: &[(&str, &str)]) -> stoker_core::Result<Loader> {
    let mut o = LoaderOptions::new();
    o.set("source", &format!("parquet:{pattern}"))?;
    for (k, v) in kv {
        o.set(k, v)?;
    }
    Loader::new(&o)
}

fn values<const N: usize, T>(b: &Batch, name: &str, from: fn([u8; N]) -> T) -> Vec<T> {
    b.field_by_name(name)
        .unwrap()
        .data
        .unwrap()
        .chunks_exact(N)
        .map(|c| from(c.try_into().unwrap()))
        .collect()
}

#[test]
fn image_tables_decode_like_tar_shards_and_keep_their_numbers() {
    let dir = tmp("pq-table");
    let (pattern, rows) = two_files(&dir);
    let members: Vec<(String, Vec<u8>)> = rows
        .iter()
        .enumerate()
        .flat_map(|(i, r)| {
            [
                (format!("{i:04}.jpg"), r.image.clone().unwrap()),
                (format!("{i:04}.cls"), r.label.to_string().into_bytes()),
            ]
        })
        .collect();
    write_tar(&dir.join("same.tar"), &members);
    let kv = [
        ("batch_size", "5"),
        ("transform", "resize(20) | center_crop(20) | hflip(0.5)"),
        ("dtype", "uint8"),
        ("seed", "3"),
        ("num_workers", "2"),
    ];
    let mut table = open(&pattern, &kv).unwrap();
    let mut tar = {
        let mut o = LoaderOptions::new();
        o.set("source", &format!("tar:{}/same.tar", dir.display()))
            .unwrap();
        for (k, v) in kv {
            o.set(k, v).unwrap();
        }
        Loader::new(&o).unwrap()
    };
    let mut seen = 0;
    while let Some(b) = table.next().unwrap() {
        let t = tar.next().unwrap().unwrap();
        let image = b.field_by_name("image").unwrap();
        assert_eq!(image.dtype, DType::U8);
        assert_eq!(image.shape[1..], [3, 20, 20]);
        assert_eq!(image.data, t.field_by_name("image").unwrap().data);
        let labels = values(&b, "label", i64::from_le_bytes);
        assert_eq!(labels, values(&t, "label", i64::from_le_bytes));
        // The tar shard's samples are in the table's order: the same shuffle draws the same
        // rows, so the labels say which rows these are.
        let index: Vec<usize> = values(&b, "score", f32::from_le_bytes)
            .iter()
            .map(|s| ((s + 1.0) * 4.0) as usize)
            .collect();
        for (k, &i) in index.iter().enumerate() {
            assert_eq!(labels[k], rows[i].label);
            assert_eq!(
                values(&b, "small", i64::from_le_bytes)[k],
                i64::from(rows[i].small)
            );
            assert_eq!(
                values(&b, "flag", u8::from_le_bytes)[k],
                u8::from(rows[i].label % 2 == 1)
            );
        }
        assert!(b.field_by_name("caption").is_none(), "text is not a field");
        seen += labels.len();
    }
    assert_eq!(seen, rows.len());
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn rows_read_in_any_order_equal_rows_read_in_order() {
    let dir = tmp("pq-order");
    let (pattern, rows) = two_files(&dir);
    let mut o = LoaderOptions::new();
    o.set("source", &format!("parquet:{pattern}")).unwrap();
    let source = o.source().unwrap().open(None, false).unwrap();
    assert_eq!(source.len(), rows.len());
    assert_eq!(
        source.fields(),
        [
            FieldSpec::encoded_image("image"),
            FieldSpec::tensor("label", DType::I64, &[]),
            FieldSpec::tensor("score", DType::F32, &[]),
            FieldSpec::tensor("small", DType::I64, &[]),
            FieldSpec::tensor("flag", DType::U8, &[]),
        ]
    );
    let expect = |i: usize| -> Vec<Vec<u8>> {
        let r = &rows[i];
        vec![
            r.image.clone().unwrap(),
            r.label.to_le_bytes().to_vec(),
            (r.score as f32).to_le_bytes().to_vec(),
            i64::from(r.small).to_le_bytes().to_vec(),
            vec![u8::from(r.label % 2 == 1)],
        ]
    };
    let mut scratch = Vec::new();
    // In order, backwards, jumping between files and row groups, and the same row twice.
    let order: Vec<usize> = (0..rows.len())
        .chain((0..rows.len()).rev())
        .chain([3, 3, 16, 0, 12, 7, 8, 4, 11, 2])
        .collect();
    for i in order.iter().copied() {
        let sample = source.read(i, &mut scratch).unwrap();
        let got: Vec<Vec<u8>> = (0..5).map(|k| sample.get(k).to_vec()).collect();
        assert_eq!(got, expect(i), "row {i}");
    }
    // The same without the cache of decompressed pages, and with one that holds a single row
    // group's image dictionary (136 KB: the three photos), so it drops pages as it goes.
    for cache in [0, 200 << 10] {
        let source = stoker_core::source::ParquetSource::open(&pattern, None, &Default::default())
            .unwrap()
            .with_cache(cache);
        for i in order.iter().copied() {
            let sample = source.read(i, &mut scratch).unwrap();
            let got: Vec<Vec<u8>> = (0..5).map(|k| sample.get(k).to_vec()).collect();
            assert_eq!(got, expect(i), "row {i}, parquet_cache={cache}");
        }
    }
    assert!(source.describe(12).ends_with("t-1.parquet row 1"));
    // Row groups of 4 rows hold less than 2 MiB: a row group is a page, and quasi_random reads
    // whole row groups in shuffled order (runs of data pages:
    // `quasi_random_pages_are_runs_of_2_mib_where_the_page_index_says`).
    let pages = source.pages().unwrap();
    assert_eq!(&pages[..12], &[0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 3]);
    assert_eq!(pages[16], 4);
    for (order, shuffle, cache) in [("quasi_random", "true", "200KiB"), ("random", "false", "0")] {
        let mut l = open(
            &pattern,
            &[
                ("batch_size", "4"),
                ("parquet_cache", cache),
                ("order", order),
                ("shuffle", shuffle),
                ("num_workers", "2"),
                ("columns", "score"),
            ],
        )
        .unwrap();
        let mut scores: Vec<f32> = Vec::new();
        while let Some(b) = l.next().unwrap() {
            scores.extend(values(&b, "score", f32::from_le_bytes));
        }
        scores.sort_by(f32::total_cmp);
        let mut expected: Vec<f32> = rows.iter().map(|r| r.score as f32).collect();
        expected.sort_by(f32::total_cmp);
        assert_eq!(
            scores, expected,
            "every row once: order={order}, shuffle={shuffle}"
        );
    }
    fs::remove_dir_all(&dir).unwrap();
}

/// `order=quasi_random` on a table written with small data pages and a page index, as
/// Hugging Face `datasets` 5 writes 100 MB row groups: a page is a run of the largest column's
/// data pages of at least 2 MiB (the packed format's page) within a row group, so that a window
/// holds about as many bytes as on packed data and not a whole 100 MB row group per page.
#[test]
fn quasi_random_pages_are_runs_of_2_mib_where_the_page_index_says() {
    let dir = tmp("pq-pages");
    let schema =
        parse_message_type("message row { required binary image; required int64 label; }").unwrap();
    let write = |name: &str, offset_index: bool| {
        // A data page a row: 100 KB of random bytes (snappy cannot shrink them), not in a
        // dictionary. The offset index is the page index's half that says where pages begin; it
        // is written unless disabled, which statistics per page would override.
        let props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_dictionary_enabled(false)
            .set_data_page_row_count_limit(1)
            .set_write_batch_size(1)
            .set_statistics_enabled(parquet::file::properties::EnabledStatistics::Chunk)
            .set_offset_index_disabled(!offset_index)
            .build();
        let path = dir.join(name);
        let mut writer = SerializedFileWriter::new(
            fs::File::create(&path).unwrap(),
            Arc::new(schema.clone()),
            Arc::new(props),
        )
        .unwrap();
        let mut x = 1u64;
        let mut row = 0i64;
        for rows in [50, 30] {
            let mut g = writer.next_row_group().unwrap();
            let images: Vec<ByteArray> = (0..rows)
                .map(|_| {
                    let bytes: Vec<u8> = (0..100_000)
                        .map(|_| {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            x as u8
                        })
                        .collect();
                    ByteArray::from(bytes)
                })
                .collect();
            let mut c = g.next_column().unwrap().unwrap();
            c.typed::<ByteArrayType>()
                .write_batch(&images, None, None)
                .unwrap();
            c.close().unwrap();
            let labels: Vec<i64> = (row..row + rows as i64).collect();
            row += rows as i64;
            let mut c = g.next_column().unwrap().unwrap();
            c.typed::<Int64Type>()
                .write_batch(&labels, None, None)
                .unwrap();
            c.close().unwrap();
            g.close().unwrap();
        }
        writer.close().unwrap();
        path
    };
    let pages_of = |path: &Path| {
        stoker_core::source::ParquetSource::open(path.to_str().unwrap(), None, &Default::default())
            .unwrap()
            .pages()
            .unwrap()
    };
    let runs = |runs: &[(u64, usize)]| -> Vec<u64> {
        runs.iter()
            .flat_map(|&(page, rows)| std::iter::repeat_n(page, rows))
            .collect()
    };
    // 21 pages of 100 KB are the first run of at least 2 MiB; a row group's last run is shorter.
    // The labels' pages are not the largest column's and play no part.
    let indexed = write("indexed.parquet", true);
    assert_eq!(
        pages_of(&indexed),
        runs(&[(0, 21), (1, 21), (2, 8), (3, 21), (4, 9)])
    );
    // Without the page index, where pages begin is not known without reading every header: a
    // row group is a page.
    let plain = write("plain.parquet", false);
    assert_eq!(pages_of(&plain), runs(&[(0, 50), (1, 30)]));
    // Every row once, in windows of those pages.
    let mut l = open(
        indexed.to_str().unwrap(),
        &[
            ("batch_size", "16"),
            ("shuffle", "true"),
            ("order", "quasi_random"),
            ("columns", "label"),
        ],
    )
    .unwrap();
    let mut labels: Vec<i64> = Vec::new();
    while let Some(b) = l.next().unwrap() {
        labels.extend(values(&b, "label", i64::from_le_bytes));
    }
    labels.sort_unstable();
    assert_eq!(labels, (0..80).collect::<Vec<i64>>());
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn columns_pick_and_name_the_fields_and_stoker_pack_keeps_them() {
    let dir = tmp("pq-columns");
    let (pattern, rows) = two_files(&dir);
    let mut l = open(
        &pattern,
        &[
            ("columns", "image:img, label"),
            ("batch_size", "17"),
            ("transform", "resize(8) | center_crop(8)"),
        ],
    )
    .unwrap();
    let b = l.next().unwrap().unwrap();
    let names: Vec<&str> = b.fields().map(|f| f.name).collect();
    assert_eq!(names, ["img", "label"]);
    let out = dir.join("packed");
    let source =
        open_source_with_fields(&format!("parquet:{pattern}"), Some("image, label")).unwrap();
    pack(&*source, &out, &PackOptions::default(), &|_, _| {}).unwrap();
    let packed = PackedSource::open(&out.display().to_string()).unwrap();
    assert_eq!(packed.len(), rows.len());
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for i in [0, 9, 16] {
        let (x, y) = (
            source.read(i, &mut a).unwrap(),
            packed.read(i, &mut b).unwrap(),
        );
        assert_eq!(x.get(0), y.get(0), "the image bytes are packed as they are");
        assert_eq!(x.get(1), y.get(1));
    }
    fs::remove_dir_all(&dir).unwrap();
}

fn open_error(pattern: &str, kv: &[(&str, &str)]) -> String {
    match open(pattern, kv) {
        Ok(_) => panic!("parquet:{pattern} with {kv:?} opened"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_tables_and_options_are_errors_naming_what_is_wrong() {
    let dir = tmp("pq-errors");
    let (pattern, _) = two_files(&dir);
    let e = open_error(&pattern, &[("columns", "picture")]);
    assert!(
        e.contains("t-0.parquet") && e.contains("no column `picture`") && e.contains("label"),
        "{e}"
    );
    let e = open_error(&pattern, &[("columns", "caption")]);
    assert!(e.contains("holds text") && e.contains("tokenizer"), "{e}");
    let e = open_error(&pattern, &[("columns", "image.path:p")]);
    assert!(e.contains("image.path"), "{e}");
    let e = open_error(&pattern, &[("seq_len", "8")]);
    assert!(e.contains("tokenizer"), "{e}");
    let e = open_error(&pattern, &[("fields", "jpg:image")]);
    assert!(e.contains("tar sources only"), "{e}");
    let e = open_error(&format!("{}/absent.parquet", dir.display()), &[]);
    assert!(
        e.contains("absent.parquet") && e.contains("not found"),
        "{e}"
    );
    fs::write(dir.join("not.parquet"), b"PAR1 but not really").unwrap();
    let e = open_error(&format!("{}/not.parquet", dir.display()), &[]);
    assert!(
        e.contains("not.parquet") && e.contains("is not a Parquet file"),
        "{e}"
    );
    // A later file whose column has another type.
    let text =
        Arc::new(parse_message_type("message row { required binary label (UTF8); }").unwrap());
    let mut w = SerializedFileWriter::new(
        fs::File::create(dir.join("t-2.parquet")).unwrap(),
        text,
        Arc::new(WriterProperties::builder().build()),
    )
    .unwrap();
    let mut g = w.next_row_group().unwrap();
    let mut c = g.next_column().unwrap().unwrap();
    c.typed::<ByteArrayType>()
        .write_batch(&[ByteArray::from("cat")], None, None)
        .unwrap();
    c.close().unwrap();
    g.close().unwrap();
    w.close().unwrap();
    let e = open_error(
        &format!("{}/t-{{0..2}}.parquet", dir.display()),
        &[("columns", "label")],
    );
    assert!(
        e.contains("t-2.parquet") && e.contains("`label` holds text"),
        "{e}"
    );
    let e = open_error(&format!("{}/t-2.parquet", dir.display()), &[]);
    assert!(e.contains("no image or number column"), "{e}");
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_null_or_corrupt_image_fails_its_sample_only() {
    let dir = tmp("pq-null");
    let mut rows = rows(9, 0);
    rows[4].image = None;
    rows[6].image = Some(b"\xff\xd8\xff not a JPEG".to_vec());
    write_table(&dir.join("t.parquet"), &rows, 3);
    let pattern = format!("{}/t.parquet", dir.display());
    let kv = [
        ("batch_size", "3"),
        ("transform", "resize(8) | center_crop(8)"),
    ];
    let mut l = open(&pattern, &kv).unwrap();
    assert!(l.next().unwrap().is_some());
    let e = match l.next() {
        Ok(_) => panic!("row 4 is null"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("t.parquet row 4") || (e.contains("row 4") && e.contains("t.parquet")),
        "{e}"
    );
    assert!(e.contains("image") && e.contains("null"), "{e}");
    let skip = [kv[0], kv[1], ("on_error", "skip")];
    let mut l = open(&pattern, &skip).unwrap();
    let mut labels = Vec::new();
    while let Some(b) = l.next().unwrap() {
        labels.extend(values(&b, "label", i64::from_le_bytes));
    }
    assert_eq!(labels.len(), 9, "skipped samples are replaced");
    assert_eq!(
        l.stats().samples_skipped,
        2,
        "the null and the corrupt image"
    );
    fs::remove_dir_all(&dir).unwrap();
}

/// A committed Parquet file of `tests/data/parquet`.
fn data_file(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/parquet")
        .join(name)
}

/// The table source of one local file, opened.
fn source_of(file: &Path) -> stoker_core::source::ParquetSource {
    stoker_core::source::ParquetSource::open(&file.display().to_string(), None, &Default::default())
        .unwrap()
}

#[test]
fn damaged_footers_are_errors_naming_the_file() {
    // Found by the parquet_table fuzz target: a compact-Thrift bool field written with another
    // type, on which the parquet crate's footer reader once panicked.
    let bad = data_file("thrift-bool-of-another-type.parquet");
    let e = open_error(&bad.display().to_string(), &[]);
    assert!(
        e.contains("thrift-bool-of-another-type.parquet") && e.contains("is not a Parquet file"),
        "{e}"
    );
    assert!(!e.contains("a bug in stoker"), "{e}");

    // Found by the parquet_table fuzz target: an unknown footer field of a list declaring more
    // booleans than there are bytes, which the parquet crate's skip counted through (23 s in the
    // fuzz build); now refused by the walk before its parse (see the test below).
    let bad = data_file("thrift-skip-of-booleans.parquet");
    let e = open_error(&bad.display().to_string(), &[]);
    assert!(
        e.contains("thrift-skip-of-booleans.parquet: is not a Parquet file: its footer is damaged"),
        "{e}"
    );

    // A row group that says more rows than its columns hold (its footer rewritten): refused at
    // open, not discovered as short reads at every row past the real ones.
    let dir = tmp("pq-rows");
    let good = dir.join("good.parquet");
    write_table(&good, &rows(5, 0), 5);
    let bytes = fs::read(&good).unwrap();
    let reader =
        parquet::file::reader::SerializedFileReader::new(bytes::Bytes::from(bytes.clone()))
            .unwrap();
    let metadata = parquet::file::reader::FileReader::metadata(&reader).clone();
    let group = metadata.row_group(0).clone().into_builder().set_num_rows(7);
    let metadata = metadata
        .into_builder()
        .set_row_groups(vec![group.build().unwrap()])
        .build();
    let footer_len =
        u32::from_le_bytes(bytes[bytes.len() - 8..bytes.len() - 4].try_into().unwrap());
    let mut damaged = bytes[..bytes.len() - 8 - footer_len as usize].to_vec();
    parquet::file::metadata::ParquetMetaDataWriter::new(&mut damaged, &metadata)
        .finish()
        .unwrap();
    fs::write(dir.join("bad.parquet"), &damaged).unwrap();
    let e = open_error(&format!("{}/bad.parquet", dir.display()), &[]);
    assert!(
        e.contains("bad.parquet") && e.contains("row group 0 says 7 rows") && e.contains("holds 5"),
        "{e}"
    );
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_panic_in_the_parquet_reader_fails_its_row_only() {
    // Found by the parquet_table fuzz target: an offset index whose first page lies before its
    // column chunk, on which parquet 60.1.0 subtracts with overflow (a panic where overflow is
    // checked, as in this test build) when a row's column reader is made.
    let source = source_of(&data_file("page-before-its-column-chunk.parquet"));
    let mut scratch = Vec::new();
    let errors: Vec<String> = (0..source.len())
        .filter_map(|i| source.read(i, &mut scratch).err())
        .map(|e| e.to_string())
        .collect();
    assert!(!errors.is_empty(), "{} rows read", source.len());
    for e in &errors {
        assert!(
            e.contains("page-before-its-column-chunk.parquet row") && e.contains("column `"),
            "{e}"
        );
    }
    assert!(
        errors
            .iter()
            .any(|e| e.contains("the Parquet reader failed")),
        "{errors:?}"
    );
}

/// A compact-Thrift field no reader knows (id 100, its id written out): a list that declares
/// 2^31 - 1 booleans and holds none. The parquet crate's own skip of an unknown field takes a
/// list's booleans as holding no bytes and counts through the declared number: seconds to hours
/// for a few bytes.
pub(crate) const UNKNOWN_BOOLEANS: [u8; 9] = [0x09, 0xc8, 0x01, 0xf1, 0xff, 0xff, 0xff, 0xff, 0x07];

/// `bytes` with `UNKNOWN_BOOLEANS` written over the start of column `column`'s chunk in row
/// group `g` (its first page header), or of that chunk's column index.
pub(crate) fn damage_chunk(bytes: &[u8], g: usize, column: &str, index: bool) -> Vec<u8> {
    let reader =
        parquet::file::reader::SerializedFileReader::new(bytes::Bytes::from(bytes.to_vec()))
            .unwrap();
    let metadata = parquet::file::reader::FileReader::metadata(&reader);
    let chunk = metadata
        .row_group(g)
        .columns()
        .iter()
        .find(|c| c.column_path().string() == column)
        .unwrap();
    let at = if index {
        chunk
            .column_index_offset()
            .expect("the writer wrote a column index")
    } else {
        chunk
            .dictionary_page_offset()
            .unwrap_or(chunk.data_page_offset())
    } as usize;
    let mut damaged = bytes.to_vec();
    damaged[at..at + UNKNOWN_BOOLEANS.len()].copy_from_slice(&UNKNOWN_BOOLEANS);
    damaged
}

#[test]
fn a_footer_page_index_or_page_header_declaring_more_than_it_holds_is_refused_at_once() {
    let dir = tmp("pq-thrift");
    let good = dir.join("good.parquet");
    write_table(&good, &rows(8, 0), 4);
    let bytes = fs::read(&good).unwrap();
    let n = bytes.len();

    // The field added to the footer, before its closing stop byte.
    let footer_len = u32::from_le_bytes(bytes[n - 8..n - 4].try_into().unwrap()) as usize;
    let mut damaged = bytes[..n - 9].to_vec();
    damaged.extend(UNKNOWN_BOOLEANS);
    damaged.push(0);
    damaged.extend(((footer_len + UNKNOWN_BOOLEANS.len()) as u32).to_le_bytes());
    damaged.extend(b"PAR1");
    fs::write(dir.join("footer.parquet"), &damaged).unwrap();
    let e = open_error(&format!("{}/footer.parquet", dir.display()), &[]);
    assert!(
        e.contains(
            "footer.parquet: is not a Parquet file: its footer is damaged: the list at byte"
        ) && e.contains("declares 2147483647 elements where 1 bytes are left"),
        "{e}"
    );

    // Over a column index: the table reads the page index at open.
    fs::write(
        dir.join("index.parquet"),
        damage_chunk(&bytes, 1, "label", true),
    )
    .unwrap();
    let e = open_error(&format!("{}/index.parquet", dir.display()), &[]);
    assert!(
        e.contains("index.parquet: is not a Parquet file: row group 1: the column index of column `label` is damaged")
            && e.contains("declares 2147483647 elements"),
        "{e}"
    );

    // Over a page header: the rows of that row group fail, as rows, and every other row reads.
    let file = dir.join("page.parquet");
    fs::write(&file, damage_chunk(&bytes, 1, "label", false)).unwrap();
    let source = source_of(&file);
    let mut scratch = Vec::new();
    for i in 0..source.len() {
        match (i, source.read(i, &mut scratch)) {
            (0..4, Ok(_)) => {}
            (4.., Err(e)) => {
                let e = e.to_string();
                assert!(
                    e.contains(&format!(
                        "page.parquet row {i} (row group 1), column `label`"
                    )) && e.contains("a page header is damaged: the list at byte")
                        && e.contains("declares 2147483647 elements"),
                    "{e}"
                );
            }
            (i, r) => panic!("row {i}: {:?}", r.err()),
        }
    }
    fs::remove_dir_all(&dir).unwrap();
}
