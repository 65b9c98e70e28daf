//! `stoker tokens order`: a token stream's global order of one epoch, written as an int64
//! `.npy` array — the sample each position of the epoch's global batches holds, the same at any
//! world size — so a job's data order can be inspected, diffed and audited before it runs.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};

use stoker_core::source::write_npy;
use stoker_core::{DType, LoaderOptions};

#[derive(Debug, Subcommand)]
pub(crate) enum TokensCommand {
    /// Writes an epoch's global order of samples as an int64 .npy array: position k of the
    /// epoch's global batches holds sample order[k], whatever the world size (the tail shorter
    /// than a global batch is left out).
    Order(TokensOrderArgs),
}

#[derive(Debug, Args)]
pub(crate) struct TokensOrderArgs {
    /// The source, as the `source` option spells it (megatron:PREFIX, tokens:PATTERN); leave
    /// it out with --set blend=…
    #[arg(value_name = "SOURCE")]
    pub(crate) source: Option<String>,
    /// Where to write the order (int64, 1-D).
    #[arg(long, value_name = "FILE.npy")]
    pub(crate) out: PathBuf,
    /// A loader option as KEY=VALUE (repeat for more): seq_len is required; shuffle, seed,
    /// global_batch_size, blend, token_dtype… as the training job sets them.
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = crate::doctor::key_value)]
    pub(crate) set: Vec<(String, String)>,
    /// The epoch whose order to write.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub(crate) epoch: u64,
}

/// Runs a `stoker tokens` command.
pub(crate) fn run(command: &TokensCommand) -> Result<(), String> {
    match command {
        TokensCommand::Order(args) => run_order(args),
    }
}

/// Runs `stoker tokens order`.
fn run_order(args: &TokensOrderArgs) -> Result<(), String> {
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
