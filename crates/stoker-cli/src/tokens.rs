//! `stoker tokens order`: a token stream's global order of one epoch, written as an int64
//! `.npy` array — the sample each position of the epoch's global batches holds, the same at any
//! world size — so a job's data order can be inspected, diffed and audited before it runs.

use std::path::Path;

use stoker_core::source::write_npy;
use stoker_core::{DType, LoaderOptions};

use crate::args::TokensOrderArgs;

/// Runs `stoker tokens order`.
pub(crate) fn run_order(args: &TokensOrderArgs) -> Result<(), String> {
    let mut options = LoaderOptions::new();
    if let Some(source) = &args.source {
        options.set("source", source).map_err(|e| e.to_string())?;
    }
    for (key, value) in &args.set {
        options.set(key, value).map_err(|e| e.to_string())?;
    }
    let order = options.token_order(args.epoch).map_err(|e| e.to_string())?;
    let bytes: Vec<u8> = order
        .iter()
        .flat_map(|&i| (i as i64).to_ne_bytes())
        .collect();
    write(&args.out, &bytes, order.len())?;
    println!(
        "wrote the {} samples of epoch {} in global order to {}",
        order.len(),
        args.epoch,
        args.out.display()
    );
    Ok(())
}

fn write(path: &Path, bytes: &[u8], n: usize) -> Result<(), String> {
    write_npy(path, DType::I64, &[n], bytes).map_err(|e| format!("{}: {e}", path.display()))
}
