//! A batch: named, typed tensors laid out in one block of memory, held as a lease.
//!
//! There is one batch type for every loader. A host batch's memory is an arena slab; a device
//! batch's (`device=cuda[:N]`) is a buffer of the CUDA prefetcher's ring. The header — fields,
//! epoch, position, counts — is the same for both, so every face handles one type. Dropping the
//! batch returns its memory (the slab to the arena, the buffer to the ring); batches may outlive
//! the loader that made them.

use std::sync::Arc;

use crate::arena::SlabLease;
use crate::cuda::device::{CastJob, DevicePtr, Event, Stream};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::transform::DeviceCast;

mod decodes;
pub(crate) use decodes::{DeviceDecodes, OneSample, OwnedSamples, ReplaceRouted, RoutedImage};

/// Alignment of every field inside a batch's memory, host or device (DLPack recommends 256
/// bytes for device copies).
pub const FIELD_ALIGN: usize = 256;

/// Where one field lives inside the batch's memory. Fields are C-contiguous.
#[derive(Clone, Debug, PartialEq)]
pub struct FieldMeta {
    /// The field's name (`image`, `label`, `<name>_lengths`, ...).
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Dimensions, the batch's sample count first.
    pub shape: Vec<usize>,
    /// Byte offset of the first element from the start of the batch's memory.
    pub offset: usize,
}

impl FieldMeta {
    /// Bytes the field occupies: the product of `shape` times the element size.
    pub fn num_bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size()
    }
}

/// Where a batch's memory lives, as DLPack device codes (`stoker_tensor.device_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum DeviceType {
    /// Host memory, pinned (`pin_memory`) or not: `kDLCPU`.
    Cpu = 1,
    /// Device memory: `kDLCUDA`.
    Cuda = 2,
}

impl DeviceType {
    /// The DLPack `DLDeviceType` code.
    pub fn dlpack_code(self) -> i32 {
        self as i32
    }
}

/// A borrowed view of one field.
#[derive(Clone, Copy, Debug)]
pub struct FieldRef<'a> {
    /// The field's name.
    pub name: &'a str,
    /// Element type.
    pub dtype: DType,
    /// Dimensions, the batch's sample count first; C-contiguous.
    pub shape: &'a [usize],
    /// Address of the first element: a host address, or for a device batch a device address
    /// (`CUdeviceptr`). Valid as long as the batch lives; the batch owns the memory exclusively,
    /// so a consumer may write through it (a training step normalizing in place, say).
    pub address: u64,
    /// The field's bytes when they are in host memory; `None` for a device batch.
    pub data: Option<&'a [u8]>,
}

impl FieldRef<'_> {
    /// The field's C-contiguous strides in elements, as DLPack and the faces give them (a zero
    /// dimension counts as one, so every stride stays a valid step).
    pub fn strides(&self) -> Vec<i64> {
        contiguous_strides(self.shape)
    }
}

/// C-contiguous strides in elements of `shape` (see [`FieldRef::strides`]).
pub fn contiguous_strides(shape: &[usize]) -> Vec<i64> {
    let mut strides = vec![1i64; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        let dim = i64::try_from(shape[k + 1].max(1)).unwrap_or(i64::MAX);
        strides[k] = strides[k + 1].saturating_mul(dim);
    }
    strides
}

/// Device memory holding a batch (one buffer of the CUDA prefetcher's ring), with the copy that
/// fills it. Implemented in [`crate::cuda`].
pub(crate) trait DeviceMemory: Send + Sync {
    fn address(&self) -> DevicePtr;
    /// The device ordinal (`N` of `cuda:N`).
    fn device_id(&self) -> u32;
    /// The stream the copy was queued on.
    fn stream(&self) -> Stream;
    /// Completes when the copy has.
    fn event(&self) -> Event;
    fn is_ready(&self) -> Result<bool>;
    fn synchronize(&self) -> Result<()>;
    fn wait(&self, stream: Stream) -> Result<()>;
}

enum Memory {
    Host(SlabLease),
    Device(Box<dyn DeviceMemory>),
}

/// One batch: its fields laid out in host memory (an arena slab) or device memory (a buffer of
/// the CUDA prefetch ring), which it holds until dropped.
pub struct Batch {
    fields: Vec<FieldMeta>,
    epoch: u64,
    position: usize,
    samples: usize,
    skipped: usize,
    memory: Memory,
    /// For a host batch bound for a device under `gpu_normalize`: how each field is cast there
    /// (by field index; `None` for a field copied as is).
    casts: Option<Arc<[Option<DeviceCast>]>>,
    /// For a host batch bound for a device: the images left for it to decode.
    decodes: Option<Box<DeviceDecodes>>,
}

impl Batch {
    /// A host batch laid out in `memory`.
    pub(crate) fn host(
        fields: Vec<FieldMeta>,
        memory: SlabLease,
        epoch: u64,
        position: usize,
        samples: usize,
        skipped: usize,
    ) -> Batch {
        Batch {
            fields,
            epoch,
            position,
            samples,
            skipped,
            memory: Memory::Host(memory),
            casts: None,
            decodes: None,
        }
    }

    /// This host batch, with the casts that make its uint8 image fields floats on the device
    /// (`gpu_normalize`, see [`DeviceCast`]).
    pub(crate) fn with_casts(mut self, casts: Option<Arc<[Option<DeviceCast>]>>) -> Batch {
        self.casts = casts;
        self
    }

    /// This host batch, with the images it leaves for the device to decode.
    pub(crate) fn with_decodes(mut self, decodes: DeviceDecodes) -> Batch {
        self.decodes = (!decodes.is_empty()).then(|| Box::new(decodes));
        self
    }

    /// The images left for the device to decode, when any are.
    pub(crate) fn decodes(&self) -> Option<&DeviceDecodes> {
        self.decodes.as_deref()
    }

    /// [`decodes`](Self::decodes), to fill in the CPU's decodes of the images the device
    /// refused.
    pub(crate) fn decodes_mut(&mut self) -> Option<&mut DeviceDecodes> {
        self.decodes.as_deref_mut()
    }

    /// How each field is cast on the device, when any is.
    pub(crate) fn casts(&self) -> Option<&[Option<DeviceCast>]> {
        self.casts.as_deref()
    }

    /// A device batch with this batch's header and `fields` (the device layout), in `memory`;
    /// the samples the prefetcher replaced count as skipped.
    pub(crate) fn on_device(&self, fields: Vec<FieldMeta>, memory: Box<dyn DeviceMemory>) -> Batch {
        Batch {
            fields,
            epoch: self.epoch,
            position: self.position,
            samples: self.samples,
            skipped: self.skipped + self.decodes().map_or(0, |d| d.replaced),
            memory: Memory::Device(memory),
            casts: None,
            decodes: None,
        }
    }

    /// Samples in this batch (the leading dimension of every field).
    pub fn len(&self) -> usize {
        self.samples
    }

    /// Whether the batch holds no sample.
    pub fn is_empty(&self) -> bool {
        self.samples == 0
    }

    /// The epoch this batch belongs to.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Position of this batch within its epoch, in sampler order.
    pub fn position(&self) -> usize {
        self.position
    }

    /// Samples that `on_error=skip` replaced in this batch.
    pub fn skipped(&self) -> usize {
        self.skipped
    }

    /// Fields in the batch, `<name>_lengths` fields of ragged fields included.
    pub fn num_fields(&self) -> usize {
        self.fields.len()
    }

    /// Every field, in field order.
    pub fn fields(&self) -> impl Iterator<Item = FieldRef<'_>> {
        (0..self.fields.len()).filter_map(|i| self.field(i))
    }

    /// Field `i`; `None` when `i >= num_fields()`.
    pub fn field(&self, i: usize) -> Option<FieldRef<'_>> {
        let meta = self.fields.get(i)?;
        let (address, data) = match &self.memory {
            Memory::Host(lease) => {
                let bytes = &lease.as_slice()[meta.offset..meta.offset + meta.num_bytes()];
                (bytes.as_ptr() as u64, Some(bytes))
            }
            Memory::Device(memory) => (memory.address() + meta.offset as u64, None),
        };
        Some(FieldRef {
            name: &meta.name,
            dtype: meta.dtype,
            shape: &meta.shape,
            address,
            data,
        })
    }

    /// The index of the field called `name`, if any.
    pub fn field_index(&self, name: &str) -> Option<usize> {
        self.fields.iter().position(|f| f.name == name)
    }

    /// The field called `name`, if any.
    pub fn field_by_name(&self, name: &str) -> Option<FieldRef<'_>> {
        self.field(self.field_index(name)?)
    }

    /// The field names, in field order.
    pub fn field_names(&self) -> Vec<&str> {
        self.fields.iter().map(|f| f.name.as_str()).collect()
    }

    /// Field `i`'s layout; `None` when `i >= num_fields()`.
    pub fn field_meta(&self, i: usize) -> Option<&FieldMeta> {
        self.fields.get(i)
    }

    /// Every field's layout, in field order.
    pub fn field_metas(&self) -> &[FieldMeta] {
        &self.fields
    }

    /// A raw pointer to field `i`'s first element in host memory, for zero-copy export
    /// (DLPack, NumPy); `None` for a device batch. Valid for `num_bytes()` bytes while the
    /// batch lives; writable (the batch owns the memory exclusively).
    pub fn host_ptr(&self, i: usize) -> Option<*mut u8> {
        let meta = self.fields.get(i)?;
        match &self.memory {
            // SAFETY: `offset` lies within the lease (checked when the layout was made).
            Memory::Host(lease) => Some(unsafe { lease.as_ptr().add(meta.offset) }),
            Memory::Device(_) => None,
        }
    }

    /// Bytes of the memory the fields are laid out in (every field's `offset + num_bytes` fits).
    pub fn byte_len(&self) -> usize {
        match &self.memory {
            Memory::Host(lease) => lease.len(),
            Memory::Device(_) => self
                .fields
                .iter()
                .map(|f| f.offset + f.num_bytes())
                .max()
                .unwrap_or(0),
        }
    }

    /// Whether the fields are in device memory (a `device=cuda[:N]` loader).
    pub fn is_device(&self) -> bool {
        matches!(self.memory, Memory::Device(_))
    }

    /// Whether host memory is page-locked (`pin_memory`: registered with the CUDA driver where
    /// one is present, else `mlock`); false for a device batch.
    pub fn is_pinned(&self) -> bool {
        matches!(&self.memory, Memory::Host(lease) if lease.is_locked())
    }

    /// Whether host memory is registered with a device driver (CUDA host memory).
    pub fn is_device_registered(&self) -> bool {
        matches!(&self.memory, Memory::Host(lease) if lease.is_registered())
    }

    /// `Cuda` for a device batch, else `Cpu`. Host memory registered with the CUDA driver
    /// (`pin_memory`) is `Cpu` too: it is ordinary memory to a reader, torch's `from_dlpack`
    /// refuses DLPack's `kDLCUDAHost`, and torch tells pinned memory by asking the driver.
    pub fn device_type(&self) -> DeviceType {
        match &self.memory {
            Memory::Device(_) => DeviceType::Cuda,
            Memory::Host(_) => DeviceType::Cpu,
        }
    }

    /// The DLPack `device_id`: the CUDA ordinal of a device batch, 0 for host memory.
    pub fn device_id(&self) -> u32 {
        match &self.memory {
            Memory::Device(memory) => memory.device_id(),
            Memory::Host(_) => 0,
        }
    }

    fn device(&self) -> Option<&dyn DeviceMemory> {
        match &self.memory {
            Memory::Device(memory) => Some(memory.as_ref()),
            Memory::Host(_) => None,
        }
    }

    /// The stream a device batch's copy was queued on; `None` for a host batch.
    pub fn cuda_stream(&self) -> Option<Stream> {
        self.device().map(|m| m.stream())
    }

    /// Completes when a device batch's copy has (a `CUevent`); `None` for a host batch.
    pub fn cuda_event(&self) -> Option<Event> {
        self.device().map(|m| m.event())
    }

    /// Whether the batch's data is in place: a device batch's copy has completed (an error if
    /// it failed); always true for a host batch.
    pub fn is_ready(&self) -> Result<bool> {
        self.device()
            .map_or(Ok(true), |m| m.is_ready().map_err(|e| self.named(e)))
    }

    /// Blocks until a device batch's copy has completed; nothing for a host batch.
    pub fn synchronize(&self) -> Result<()> {
        self.device()
            .map_or(Ok(()), |m| m.synchronize().map_err(|e| self.named(e)))
    }

    /// Orders work queued on `stream` after a device batch's copy, without blocking the CPU,
    /// and makes the buffer's reuse wait for work queued on `stream` before the batch is
    /// dropped. Call it for every stream that reads the batch. Nothing for a host batch.
    pub fn wait(&self, stream: Stream) -> Result<()> {
        self.device()
            .map_or(Ok(()), |m| m.wait(stream).map_err(|e| self.named(e)))
    }

    /// Adds which batch an error concerns, keeping its kind.
    fn named(&self, e: Error) -> Error {
        let at = format!("batch {} of epoch {}", self.position, self.epoch);
        match e {
            Error::Cuda(m) => Error::Cuda(format!("{at}: {m}")),
            Error::OutOfMemory(m) => Error::OutOfMemory(format!("{at}: {m}")),
            other => other,
        }
    }
}

/// What the prefetcher queues for one field of a host batch bound for a device.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Step {
    /// Copied as is, to `offset` of the device buffer.
    Copy { field: usize, offset: usize },
    /// Copied to the cast's input, its table beside it, and cast into the field
    /// (`gpu_normalize`): `job`'s addresses are offsets in the device buffer.
    Cast { field: usize, job: CastJob },
}

/// Where a host batch's fields lie in its device buffer, and the steps that put them there.
pub(crate) struct DeviceLayout {
    /// The device batch's fields: a cast field has the cast's type, and offsets follow from the
    /// device sizes.
    pub fields: Vec<FieldMeta>,
    pub steps: Vec<Step>,
    /// Where the resize taps of the images left for the device to decode go.
    pub taps: usize,
    /// Bytes of device memory the batch needs, the uint8 inputs and tables of casts and the
    /// taps included.
    pub bytes: usize,
}

impl DeviceLayout {
    /// The device layout of a host batch with `fields`, `casts[i]` saying how field `i` is
    /// cast (none: every field copied as is). The fields come first at their device sizes, each
    /// on a [`FIELD_ALIGN`] boundary as collate lays them out on the host, then the uint8 inputs
    /// and the tables the casts read, then `taps` bytes of resize taps.
    pub(crate) fn new(
        fields: &[FieldMeta],
        casts: Option<&[Option<DeviceCast>]>,
        taps: usize,
    ) -> Result<DeviceLayout> {
        let cast_of = |i: usize| casts.and_then(|c| c.get(i)?.as_ref());
        let mut end = 0usize;
        let mut device = Vec::with_capacity(fields.len());
        for (i, meta) in fields.iter().enumerate() {
            let mut meta = meta.clone();
            if let Some(cast) = cast_of(i) {
                meta.dtype = cast.dtype();
            }
            meta.offset = end.next_multiple_of(FIELD_ALIGN);
            end = meta.offset + meta.num_bytes();
            device.push(meta);
        }
        let mut steps = Vec::with_capacity(fields.len());
        for (field, (host, on_device)) in fields.iter().zip(&device).enumerate() {
            let Some(cast) = cast_of(field) else {
                steps.push(Step::Copy {
                    field,
                    offset: on_device.offset,
                });
                continue;
            };
            let g = cast.geometry(&host.shape)?;
            let staging = end.next_multiple_of(FIELD_ALIGN);
            let table = (staging + host.num_bytes()).next_multiple_of(FIELD_ALIGN);
            end = table + cast.table().len();
            steps.push(Step::Cast {
                field,
                job: CastJob {
                    src: staging as DevicePtr,
                    dst: on_device.offset as DevicePtr,
                    table: table as DevicePtr,
                    elem_bytes: cast.dtype().size(),
                    rows: g.rows,
                    plane: g.plane,
                    channels: cast.channels() as u32,
                    channel_by_column: g.channel_by_column,
                },
            });
        }
        let taps_at = end.next_multiple_of(FIELD_ALIGN);
        Ok(DeviceLayout {
            fields: device,
            steps,
            taps: taps_at,
            bytes: if taps > 0 { taps_at + taps } else { end },
        })
    }
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("epoch", &self.epoch)
            .field("position", &self.position)
            .field("samples", &self.samples)
            .field("device_type", &self.device_type())
            .field("fields", &self.fields)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strides_are_c_order_in_elements() {
        assert_eq!(contiguous_strides(&[4, 3, 2]), vec![6, 2, 1]);
        assert_eq!(contiguous_strides(&[5]), vec![1]);
        assert_eq!(
            contiguous_strides(&[2, 0, 3]),
            vec![3, 3, 1],
            "a zero dimension steps by one"
        );
        assert!(contiguous_strides(&[]).is_empty());
    }

    fn meta(name: &str, dtype: DType, shape: &[usize], offset: usize) -> FieldMeta {
        FieldMeta {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
            offset,
        }
    }

    fn float32_cast() -> DeviceCast {
        let table = (0..3 * 256)
            .flat_map(|v| (v as f32).to_ne_bytes())
            .collect();
        DeviceCast::new(DType::F32, crate::dtype::Layout::Nchw, 3, table)
    }

    #[test]
    fn a_device_layout_widens_cast_fields_and_puts_inputs_and_tables_after_the_fields() {
        let fields = [
            meta("image", DType::U8, &[2, 3, 4, 4], 0),
            meta("label", DType::I64, &[2], 256),
        ];
        let casts = [Some(float32_cast()), None];
        let layout = DeviceLayout::new(&fields, Some(&casts), 0).unwrap();
        assert_eq!(layout.fields[0].dtype, DType::F32);
        assert_eq!(layout.fields[0].offset, 0);
        // 96 float32s take 384 bytes: the label moves to the next 256-byte boundary.
        assert_eq!(layout.fields[1].offset, 512);
        let Step::Cast { job, .. } = layout.steps[0] else {
            panic!("the image is cast: {:?}", layout.steps[0]);
        };
        // The uint8 input after the fields, its table after it.
        assert_eq!((job.src, job.dst, job.table), (768, 0, 1024));
        assert_eq!(layout.bytes, 1024 + 3 * 256 * 4);
        assert_eq!((job.rows, job.plane, job.elements()), (6, 16, 96));
        assert!(matches!(
            layout.steps[1],
            Step::Copy {
                field: 1,
                offset: 512
            }
        ));
    }

    #[test]
    fn the_taps_of_images_decoded_on_the_device_go_last_on_a_field_boundary() {
        let fields = [meta("image", DType::U8, &[2, 3, 4, 4], 0)];
        let casts = [Some(float32_cast())];
        let without = DeviceLayout::new(&fields, Some(&casts), 0).unwrap();
        let with = DeviceLayout::new(&fields, Some(&casts), 100).unwrap();
        assert_eq!(with.taps, without.bytes.next_multiple_of(FIELD_ALIGN));
        assert_eq!(with.bytes, with.taps + 100);
        assert_eq!(with.fields, without.fields);
    }

    #[test]
    fn without_casts_the_device_layout_is_the_host_layout() {
        let fields = [
            meta("x", DType::F32, &[4, 10], 0),
            meta("y", DType::I64, &[4], 256),
        ];
        let layout = DeviceLayout::new(&fields, None, 0).unwrap();
        assert_eq!(layout.fields, fields);
        assert_eq!(layout.bytes, 256 + 32);
    }
}
