//! DLPack 1.0 (`DLManagedTensorVersioned`), laid out as in the official `dlpack.h`, so an export
//! goes straight to `torch.from_dlpack` / `at::fromDLPack` and other consumers.
//!
//! The header defines these types only when `dlpack.h` has not been included before it
//! (`#if !defined(DLPACK_DLPACK_H_)`, from the never-set `cfg(stoker_dlpack_external)` below):
//! a C++ file that uses both includes `dlpack.h` (or ATen's copy) first.
//!
//! Each export owns a clone of its batch's `Arc`: the batch's memory returns to the arena (a
//! device batch's buffer to the ring) only when the batch is released and every export's deleter
//! has run, in any order.

use std::ffi::c_void;
use std::sync::Arc;

use stoker_core::{DType, DeviceType};

use crate::types::SharedBatch;

/// DLPack ABI version.
#[cfg(not(stoker_dlpack_external))]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLPackVersion {
    pub major: u32,
    pub minor: u32,
}

/// DLPack device types.
#[cfg(not(stoker_dlpack_external))]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DLDeviceType {
    kDLCPU = 1,
    kDLCUDA = 2,
    kDLCUDAHost = 3,
    kDLOpenCL = 4,
    kDLVulkan = 7,
    kDLMetal = 8,
    kDLVPI = 9,
    kDLROCM = 10,
    kDLROCMHost = 11,
    kDLExtDev = 12,
    kDLCUDAManaged = 13,
    kDLOneAPI = 14,
    kDLWebGPU = 15,
    kDLHexagon = 16,
    kDLMAIA = 17,
}

/// Where a tensor lives.
#[cfg(not(stoker_dlpack_external))]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDevice {
    pub device_type: DLDeviceType,
    pub device_id: i32,
}

/// DLPack type codes (the `code` of `DLDataType`).
#[cfg(not(stoker_dlpack_external))]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DLDataTypeCode {
    kDLInt = 0,
    kDLUInt = 1,
    kDLFloat = 2,
    kDLOpaqueHandle = 3,
    kDLBfloat = 4,
    kDLComplex = 5,
    kDLBool = 6,
}

/// Element type: a `DLDataTypeCode`, bits per lane and lanes.
#[cfg(not(stoker_dlpack_external))]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDataType {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

/// A tensor view; `strides` are in elements.
#[cfg(not(stoker_dlpack_external))]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DLTensor {
    pub data: *mut c_void,
    pub device: DLDevice,
    pub ndim: i32,
    pub dtype: DLDataType,
    pub shape: *mut i64,
    pub strides: *mut i64,
    pub byte_offset: u64,
}

/// A tensor and its owner: the consumer calls `deleter(self)` exactly once when done.
#[cfg(not(stoker_dlpack_external))]
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    pub version: DLPackVersion,
    pub manager_ctx: *mut c_void,
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    /// `DLPACK_FLAG_BITMASK_*`; stoker sets none (writable, not a copy).
    pub flags: u64,
    pub dl_tensor: DLTensor,
}

/// One export: the DLPack struct first (a pointer to it is a pointer to the whole), then what its
/// pointers point into, then the share of the batch that keeps the data alive.
#[repr(C)]
struct Export {
    managed: DLManagedTensorVersioned,
    shape: Vec<i64>,
    strides: Vec<i64>,
    _batch: Arc<SharedBatch>,
}

fn dl_dtype(d: DType) -> DLDataType {
    let (code, bits) = match d {
        DType::U8 => (DLDataTypeCode::kDLUInt, 8),
        DType::I32 => (DLDataTypeCode::kDLInt, 32),
        DType::I64 => (DLDataTypeCode::kDLInt, 64),
        DType::F16 => (DLDataTypeCode::kDLFloat, 16),
        DType::BF16 => (DLDataTypeCode::kDLBfloat, 16),
        DType::F32 => (DLDataTypeCode::kDLFloat, 32),
        DType::U16 => (DLDataTypeCode::kDLUInt, 16),
    };
    DLDataType {
        code: code as u8,
        bits,
        lanes: 1,
    }
}

/// DLPack device of a batch's memory: CUDA for a device batch, CPU for a host batch, pinned or
/// not (see `Batch::device_type`).
pub(crate) fn device(batch: &SharedBatch) -> DLDevice {
    let device_type = match batch.batch.device_type() {
        DeviceType::Cpu => DLDeviceType::kDLCPU,
        DeviceType::Cuda => DLDeviceType::kDLCUDA,
    };
    DLDevice {
        device_type,
        device_id: i32::try_from(batch.batch.device_id()).unwrap_or(i32::MAX),
    }
}

/// Exports field `i` of `batch`, or `None` if there is no such field. The caller owns the result
/// and frees it through its deleter.
pub(crate) fn export(batch: &Arc<SharedBatch>, i: usize) -> Option<*mut DLManagedTensorVersioned> {
    let field = batch.batch.field(i)?;
    let shape: Vec<i64> = field.shape.iter().map(|&d| d as i64).collect();
    let strides = field.strides();
    let mut export = Box::new(Export {
        managed: DLManagedTensorVersioned {
            version: DLPackVersion { major: 1, minor: 0 },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_export),
            flags: 0,
            dl_tensor: DLTensor {
                data: field.address as usize as *mut c_void,
                device: device(batch),
                ndim: field.shape.len() as i32,
                dtype: dl_dtype(field.dtype),
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
        },
        shape,
        strides,
        _batch: Arc::clone(batch),
    });
    // The vectors' heap buffers do not move when the box is handed out.
    export.managed.dl_tensor.shape = export.shape.as_mut_ptr();
    export.managed.dl_tensor.strides = export.strides.as_mut_ptr();
    let raw = Box::into_raw(export);
    // SAFETY: `raw` is the live box just created; `managed` is its first field (repr(C)).
    unsafe { (*raw).managed.manager_ctx = raw.cast::<c_void>() };
    Some(raw.cast::<DLManagedTensorVersioned>())
}

/// The deleter of every export: frees it and drops its share of the batch. NULL is a no-op.
unsafe extern "C" fn delete_export(t: *mut DLManagedTensorVersioned) {
    if t.is_null() {
        return;
    }
    // A panic must not unwind into C; dropping an export cannot panic in practice, and if it did
    // the memory would merely leak.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: the deleter is only reachable through exports made by `export`, where `t`
        // points to the first field of a boxed `Export` (repr(C)); DLPack consumers call it once.
        drop(unsafe { Box::from_raw(t.cast::<Export>()) });
    }));
}
