//! An in-memory source: columns of bytes held by the source itself. Used by tests and by
//! embedders that already hold their data in RAM.

use super::{FieldSpec, Sample, Source, MAX_FIELDS};
use crate::dtype::DType;
use crate::error::{Error, Result};

enum Column {
    /// Row `i` is `bytes[i * row .. (i + 1) * row]`.
    Fixed { bytes: Vec<u8>, row: usize },
    /// Row `i` is `rows[i]` (ragged tensors or encoded images).
    Rows(Vec<Vec<u8>>),
}

/// Build with [`MemorySource::new`] and the `with_*` methods; every column must have the same
/// number of samples.
#[derive(Default)]
pub struct MemorySource {
    specs: Vec<FieldSpec>,
    columns: Vec<Column>,
    len: Option<usize>,
}

impl MemorySource {
    /// A source with no field and no sample.
    pub fn new() -> MemorySource {
        MemorySource::default()
    }

    /// A fixed-shape field: `bytes` holds every sample's `shape`-shaped tensor back to back.
    pub fn with_tensor(
        self,
        name: &str,
        dtype: DType,
        shape: &[usize],
        bytes: Vec<u8>,
    ) -> Result<MemorySource> {
        let row = shape.iter().product::<usize>() * dtype.size();
        if row == 0 || !bytes.len().is_multiple_of(row) {
            return Err(Error::InvalidArgument(format!(
                "field `{name}`: {} bytes is not a whole number of {row}-byte samples",
                bytes.len()
            )));
        }
        let n = bytes.len() / row;
        self.push(
            FieldSpec::tensor(name, dtype, shape),
            Column::Fixed { bytes, row },
            n,
        )
    }

    /// A field whose leading dimension varies: `rows[i]` holds sample `i`'s elements.
    pub fn with_ragged(
        self,
        name: &str,
        dtype: DType,
        inner_shape: &[usize],
        rows: Vec<Vec<u8>>,
    ) -> Result<MemorySource> {
        let unit = inner_shape.iter().product::<usize>() * dtype.size();
        if let Some(i) = rows
            .iter()
            .position(|r| unit == 0 || !r.len().is_multiple_of(unit))
        {
            return Err(Error::InvalidArgument(format!(
                "field `{name}`: sample {i} is not a whole number of {unit}-byte rows"
            )));
        }
        let n = rows.len();
        self.push(
            FieldSpec::ragged(name, dtype, inner_shape),
            Column::Rows(rows),
            n,
        )
    }

    /// A field of encoded images (JPEG or PNG bytes), one per sample.
    pub fn with_encoded_images(self, name: &str, rows: Vec<Vec<u8>>) -> Result<MemorySource> {
        let n = rows.len();
        self.push(FieldSpec::encoded_image(name), Column::Rows(rows), n)
    }

    fn push(mut self, spec: FieldSpec, column: Column, n: usize) -> Result<MemorySource> {
        if self.specs.len() == MAX_FIELDS {
            return Err(Error::InvalidArgument(format!(
                "a sample has at most {MAX_FIELDS} fields"
            )));
        }
        if let Some(len) = self.len.filter(|&len| len != n) {
            return Err(Error::InvalidArgument(format!(
                "field `{}` has {n} samples but earlier fields have {len}",
                spec.name
            )));
        }
        self.len = Some(n);
        self.specs.push(spec);
        self.columns.push(column);
        Ok(self)
    }
}

impl Source for MemorySource {
    fn len(&self) -> usize {
        self.len.unwrap_or(0)
    }

    fn fields(&self) -> &[FieldSpec] {
        &self.specs
    }

    fn describe(&self, index: usize) -> String {
        format!("in-memory sample {index}")
    }

    fn read<'a>(&'a self, index: usize, _scratch: &'a mut Vec<u8>) -> Result<Sample<'a>> {
        let mut sample = Sample::default();
        for (f, column) in self.columns.iter().enumerate() {
            let bytes = match column {
                Column::Fixed { bytes, row } => &bytes[index * row..(index + 1) * row],
                Column::Rows(rows) => &rows[index][..],
            };
            sample.set(f, bytes);
        }
        Ok(sample)
    }
}
