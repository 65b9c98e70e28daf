//! Writing stoker's packed format from C: `stoker_pack` and `stoker_pack_merge`, the same as
//! `stoker pack` and `stoker pack --merge` (see `docs/packed-format.md`).

use std::ffi::c_char;
use std::path::Path;

use stoker_core::pack::{merge, pack_spec, PackOptions};

use crate::error::fail;
use crate::types::stoker_status;

/// Packs the source `src` (a source spec: `image_folder:ROOT`, `tar:PATTERN`, `npy:PATH`,
/// `packed:PATH`) into `out`, read back with `source=packed:OUT`.
///
/// - `max_side`: images with a longer side are shrunk to it (aspect kept); 0 keeps every size.
/// - `quality`: JPEG quality of re-encoded images, 1 to 100 (90 is `stoker pack`'s default).
/// - `mode`: `"jpeg"` (kept, or re-encoded when shrunk), `"raw"` (RGB8 pixels, never decoded
///   when read) or `"smart"` (raw for images of at most 256x256 pixels, else jpeg); NULL is
///   `"jpeg"`.
/// - `shard_size`: start a new shard file past this many bytes of data; 0 writes one file.
/// - `shard_index`, `num_shards`: pack only slice `shard_index` of `num_shards` contiguous
///   slices (packing on many machines; then `stoker_pack_merge(out)`); `num_shards` 0 packs the
///   whole source.
///
/// With `shard_size` or `num_shards` set, `out` is a directory. Files appear atomically
/// (written under a temporary name, then renamed); the bytes are the same for the same input
/// and options. Uses every core (rayon). Blocking; thread-safe.
#[no_mangle]
pub extern "C" fn stoker_pack(
    src: *const c_char,
    out: *const c_char,
    max_side: u32,
    quality: u32,
    mode: *const c_char,
    shard_size: u64,
    shard_index: u32,
    num_shards: u32,
) -> stoker_status {
    ffi_boundary!(stoker_pack => {
        let src = try_str!(src);
        let out = try_str!(out);
        let mode = if mode.is_null() { None } else { Some(try_str!(mode)) };
        let options = match PackOptions::from_arguments(
            max_side, quality, mode, shard_size, shard_index, num_shards,
        ) {
            Ok(options) => options,
            Err(e) => return fail(&e),
        };
        match pack_spec(src, Path::new(out), &options, &|_, _| {}) {
            Ok(_) => stoker_status::STOKER_OK,
            Err(e) => fail(&e),
        }
    })
}

/// Writes the index of the slices packed into the directory `out` by separate `stoker_pack`
/// calls (every slice must be there; all shards must have the same fields), as
/// `stoker pack --merge OUT`.
#[no_mangle]
pub extern "C" fn stoker_pack_merge(out: *const c_char) -> stoker_status {
    ffi_boundary!(stoker_pack_merge => {
        let out = try_str!(out);
        match merge(Path::new(out)) {
            Ok(_) => stoker_status::STOKER_OK,
            Err(e) => fail(&e),
        }
    })
}
