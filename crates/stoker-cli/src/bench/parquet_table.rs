//! A folder of images written as a Hugging Face image dataset's Parquet file, as earlier releases
//! of `datasets` wrote them: an `image` struct of `bytes` and `path`, an int64 `label`, snappy,
//! row groups of 100 rows. A group of images is larger than the writer's page size, which it
//! checks only every 1,024 values, so each row group is one data page: a shuffled row
//! decompresses its whole group unless the page is kept (`parquet_cache`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parquet::basic::Compression;
use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use stoker_core::{ImageFolderSource, Source};

/// Rows per row group, as `datasets` wrote image datasets
/// (`PARQUET_ROW_GROUP_SIZE_FOR_IMAGE_DATASETS`).
pub(crate) const ROWS_PER_GROUP: usize = 100;

const SCHEMA: &str = "message row {
    optional group image { optional binary bytes; optional binary path (UTF8); }
    required int64 label;
}";

/// The table `dir/hf-NAME-ROWS.parquet` of `rows` rows, the images of the folder `root` (named
/// NAME) in turn, written once.
pub(crate) fn table_in(dir: &Path, root: &Path, rows: usize) -> Result<PathBuf, String> {
    let name = root
        .file_name()
        .map_or_else(|| "images".into(), |n| n.to_string_lossy().into_owned());
    let path = dir.join(format!("hf-{name}-{rows}.parquet"));
    if path.exists() {
        return Ok(path);
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    eprintln!("writing {} ...", path.display());
    let partial = path.with_extension("partial");
    write(root, rows, &partial).map_err(|e| format!("{}: {e}", partial.display()))?;
    std::fs::rename(&partial, &path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

fn write(root: &Path, rows: usize, path: &Path) -> Result<(), String> {
    let folder = ImageFolderSource::open(root).map_err(|e| e.to_string())?;
    if folder.is_empty() {
        return Err(format!("{} holds no images", root.display()));
    }
    let schema = Arc::new(parse_message_type(SCHEMA).map_err(|e| e.to_string())?);
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .build();
    let file = std::fs::File::create(path).map_err(|e| e.to_string())?;
    let mut writer =
        SerializedFileWriter::new(file, schema, Arc::new(props)).map_err(|e| e.to_string())?;
    let mut scratch = Vec::new();
    for first in (0..rows).step_by(ROWS_PER_GROUP) {
        let group_rows = first..(first + ROWS_PER_GROUP).min(rows);
        let (mut images, mut paths, mut labels) = (Vec::new(), Vec::new(), Vec::new());
        for row in group_rows {
            let i = row % folder.len();
            let sample = folder.read(i, &mut scratch).map_err(|e| e.to_string())?;
            images.push(ByteArray::from(sample.get(0).to_vec()));
            let label = sample
                .get(1)
                .try_into()
                .map(i64::from_ne_bytes)
                .map_err(|_| format!("{}: the label is not an int64", folder.describe(i)))?;
            labels.push(label);
            paths.push(ByteArray::from(format!("{row}.jpg").as_str()));
        }
        // Every image and path present: defined at the struct's level 2.
        let defined = vec![2i16; images.len()];
        let mut group = writer.next_row_group().map_err(|e| e.to_string())?;
        for column in 0..3 {
            let mut c = group
                .next_column()
                .map_err(|e| e.to_string())?
                .ok_or("the schema has three columns")?;
            match column {
                0 => c
                    .typed::<ByteArrayType>()
                    .write_batch(&images, Some(&defined), None),
                1 => c
                    .typed::<ByteArrayType>()
                    .write_batch(&paths, Some(&defined), None),
                _ => c.typed::<Int64Type>().write_batch(&labels, None, None),
            }
            .map_err(|e| e.to_string())?;
            c.close().map_err(|e| e.to_string())?;
        }
        group.close().map_err(|e| e.to_string())?;
    }
    writer.close().map_err(|e| e.to_string())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use stoker_core::source::ParquetSource;

    use super::*;

    #[test]
    fn the_table_holds_the_folders_images_in_turn_in_groups_of_100() {
        let dir = std::env::temp_dir().join(format!("stoker-hf-table-{}", std::process::id()));
        let root = crate::photos::synthetic(&dir, "drawn", 2, 16, 12).unwrap();
        let path = table_in(&dir, &root, 250).unwrap();
        assert_eq!(path, dir.join("hf-drawn-250.parquet"));
        // Written once: a second call finds it.
        let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
        assert_eq!(table_in(&dir, &root, 250).unwrap(), path);
        assert_eq!(
            std::fs::metadata(&path).unwrap().modified().unwrap(),
            modified
        );
        let folder = ImageFolderSource::open(&root).unwrap();
        let table = ParquetSource::open(path.to_str().unwrap(), None, &Default::default()).unwrap();
        assert_eq!(table.len(), 250);
        assert_eq!(
            table
                .fields()
                .iter()
                .map(|f| f.name.as_str())
                .collect::<Vec<_>>(),
            ["image", "label"]
        );
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for row in [0, 7, 8, 99, 100, 249] {
            let (t, f) = (
                table.read(row, &mut a).unwrap(),
                folder.read(row % 8, &mut b).unwrap(),
            );
            assert_eq!(t.get(0), f.get(0), "row {row}'s image");
            assert_eq!(t.get(1), f.get(1), "row {row}'s label");
        }
        // Row groups of 100: quasi_random's pages.
        let pages = table.pages().unwrap();
        assert_eq!((pages[99], pages[100], pages[249]), (0, 1, 2));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
