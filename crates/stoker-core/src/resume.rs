//! The resume state: where a loader stands, as a string a new loader continues from exactly.
//!
//! Every random choice is a function of `(seed, epoch, index)`, so `(seed, epoch, position,
//! ahead)` is all a loader needs to continue; the batch count guards against resuming on a
//! different dataset or batching.

use std::collections::BTreeMap;

use crate::error::{Error, Result};

/// A loader's position: everything needed to continue exactly where it stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResumeState {
    pub seed: u64,
    pub epoch: u64,
    /// Batches of `epoch` delivered in sampler order: every position below this one.
    pub position: usize,
    /// Positions at or after `position` also delivered (only with `in_order=false`).
    pub ahead: Vec<usize>,
    /// Batches per epoch of the loader that saved it, to catch a mismatched resume.
    pub batches_per_epoch: usize,
}

impl ResumeState {
    const PREFIX: &'static str = "stoker-state-v1";

    pub fn parse(s: &str) -> Result<ResumeState> {
        let bad = |why: &str| Error::option("resume_state", format!("`{s}` {why}"));
        let mut parts = s.split(';');
        if parts.next() != Some(Self::PREFIX) {
            return Err(bad(
                "is not a stoker state (expected it to start with stoker-state-v1)",
            ));
        }
        let mut fields = BTreeMap::new();
        for part in parts {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| bad("has a part without `=`"))?;
            fields.insert(k, v);
        }
        let num = |k: &str| -> Result<u64> {
            fields
                .get(k)
                .ok_or_else(|| bad(&format!("lacks `{k}`")))?
                .parse()
                .map_err(|_| bad(&format!("has a malformed `{k}`")))
        };
        let ahead = match fields.get("ahead") {
            None | Some(&"") => Vec::new(),
            Some(list) => list
                .split(',')
                .map(|p| p.parse().map_err(|_| bad("has a malformed `ahead`")))
                .collect::<Result<Vec<usize>>>()?,
        };
        Ok(ResumeState {
            seed: num("seed")?,
            epoch: num("epoch")?,
            position: num("position")? as usize,
            ahead,
            batches_per_epoch: num("batches")? as usize,
        })
    }
}

impl std::fmt::Display for ResumeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ahead: Vec<String> = self.ahead.iter().map(|p| p.to_string()).collect();
        write!(
            f,
            "{};seed={};epoch={};position={};ahead={};batches={}",
            Self::PREFIX,
            self.seed,
            self.epoch,
            self.position,
            ahead.join(","),
            self.batches_per_epoch
        )
    }
}
