//! `--workers`, the flag every command that builds a loader shares.

use clap::Args;

/// `--workers`, shared by every command that builds a loader.
#[derive(Debug, Args)]
pub(crate) struct Workers {
    /// Worker threads: a number, or `auto` for the cores this process may run on.
    #[arg(long = "workers", value_name = "N|auto", default_value = "auto", value_parser = workers)]
    pub(crate) value: String,
}

/// Accepts what the loader's `num_workers` option accepts, so that a typo fails before any
/// dataset is built, with clap's message naming the flag.
pub(crate) fn workers(value: &str) -> Result<String, String> {
    if value == "auto" || value.parse::<usize>().is_ok() {
        Ok(value.to_owned())
    } else {
        Err(format!("`{value}` is neither a number nor `auto`"))
    }
}
