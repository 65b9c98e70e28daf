//! The stoker C ABI: `libstoker.so` / `libstoker.a` and, generated from this crate by cbindgen,
//! `include/stoker.h`, which documents the contract (every export, every option key); this
//! crate is a thin face over `stoker-core`.
//!
//! Every export does three things only: check its arguments, call the safe core, translate the
//! result. They all run inside `ffi_boundary!` (a caught panic becomes `STOKER_ERR_INTERNAL`
//! with its message); raw pointers become references, boxes and strings in [`ffi`] only, and
//! core errors become `stoker_status` in [`error::fail`] only.
//!
//! Layout: [`types`] holds the C-visible types, [`dlpack`] the DLPack 1.0 structs and exports,
//! and one module per handle holds its functions ([`version`], [`options`], [`source`],
//! [`iterable`], [`loader`], [`batch`]); [`pack`] writes stoker's packed format.

// The C names (`stoker_status`, `STOKER_OK`, ...) are the contract, spelled as C spells them.
#![allow(non_camel_case_types)]
// Exports take raw pointers from C and are `extern "C"`; making them `unsafe fn` would change
// nothing for C callers. Every dereference happens in `ffi`, after a NULL check, under the C
// contract documented on each function.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

#[macro_use]
pub mod ffi;

// The header declares items in this order (cbindgen.toml `sort_by = "None"`); the blank lines
// keep rustfmt from sorting them.
pub mod types;

pub mod version;

pub mod error;

pub mod options;

pub mod source;

pub mod iterable;

pub mod loader;

pub mod batch;

pub mod pack;

pub mod dlpack;

pub mod transform;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod cuda_tests;
