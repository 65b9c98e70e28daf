//! A batch: named, typed tensors laid out in one arena slab, held as a lease. Dropping the batch
//! returns the slab to the arena; batches may outlive the loader that made them.

use crate::arena::SlabLease;
use crate::dtype::DType;

/// Where one field lives inside the batch's slab. Fields are C-contiguous.
#[derive(Clone, Debug, PartialEq)]
pub struct FieldMeta {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub offset: usize,
}

impl FieldMeta {
    pub fn num_bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size()
    }
}

/// Where a batch's memory lives, as DLPack device codes (`stoker_tensor.device_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum DeviceType {
    /// Ordinary (possibly `mlock`ed) host memory: `kDLCPU`.
    Cpu = 1,
    /// Device memory: `kDLCUDA`.
    Cuda = 2,
    /// Host memory registered with the CUDA driver (page-locked for DMA): `kDLCUDAHost`.
    CudaHost = 3,
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
    pub name: &'a str,
    pub dtype: DType,
    pub shape: &'a [usize],
    pub data: &'a [u8],
}

pub struct Batch {
    fields: Vec<FieldMeta>,
    memory: SlabLease,
    epoch: u64,
    position: usize,
    samples: usize,
    skipped: usize,
}

impl Batch {
    pub(crate) fn new(
        fields: Vec<FieldMeta>,
        memory: SlabLease,
        epoch: u64,
        position: usize,
        samples: usize,
        skipped: usize,
    ) -> Batch {
        Batch {
            fields,
            memory,
            epoch,
            position,
            samples,
            skipped,
        }
    }

    /// Samples in this batch (the leading dimension of every field).
    pub fn len(&self) -> usize {
        self.samples
    }

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

    pub fn num_fields(&self) -> usize {
        self.fields.len()
    }

    pub fn fields(&self) -> impl Iterator<Item = FieldRef<'_>> {
        (0..self.fields.len()).filter_map(|i| self.field(i))
    }

    pub fn field(&self, i: usize) -> Option<FieldRef<'_>> {
        let meta = self.fields.get(i)?;
        Some(FieldRef {
            name: &meta.name,
            dtype: meta.dtype,
            shape: &meta.shape,
            data: &self.memory.as_slice()[meta.offset..meta.offset + meta.num_bytes()],
        })
    }

    pub fn field_index(&self, name: &str) -> Option<usize> {
        self.fields.iter().position(|f| f.name == name)
    }

    pub fn field_by_name(&self, name: &str) -> Option<FieldRef<'_>> {
        self.field(self.field_index(name)?)
    }

    pub fn field_meta(&self, i: usize) -> Option<&FieldMeta> {
        self.fields.get(i)
    }

    /// A raw pointer to field `i`'s first element, for zero-copy export (DLPack, NumPy). It is
    /// valid for `num_bytes()` bytes as long as this batch lives. Consumers may write through it
    /// (a training step normalizing in place, say): the batch owns the memory exclusively.
    pub fn field_ptr(&self, i: usize) -> Option<*mut u8> {
        let meta = self.fields.get(i)?;
        // SAFETY: `offset` lies within the lease (checked when the layout was made).
        Some(unsafe { self.memory.as_ptr().add(meta.offset) })
    }

    /// Whether the memory is page-locked (`mlock`).
    pub fn is_pinned(&self) -> bool {
        self.memory.is_locked()
    }

    /// Whether the memory is registered with a device driver (CUDA host memory).
    pub fn is_device_registered(&self) -> bool {
        self.memory.is_registered()
    }

    /// `CudaHost` when the memory is registered with the CUDA driver, else `Cpu`.
    pub fn device_type(&self) -> DeviceType {
        if self.is_device_registered() {
            DeviceType::CudaHost
        } else {
            DeviceType::Cpu
        }
    }

    /// Every field's layout, in field order.
    pub fn field_metas(&self) -> &[FieldMeta] {
        &self.fields
    }

    /// Bytes of the slab the fields are laid out in (every field's `offset + num_bytes` fits).
    pub fn byte_len(&self) -> usize {
        self.memory.len()
    }
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("epoch", &self.epoch)
            .field("position", &self.position)
            .field("samples", &self.samples)
            .field("fields", &self.fields)
            .finish()
    }
}
