//! The resume state: where a loader stands, as a string a new loader continues from exactly.
//!
//! Every random choice is a function of `(seed, epoch, index)`, so `(seed, epoch, position,
//! ahead)` is all a loader needs to continue; the batch count guards against resuming on a
//! different dataset or batching.
//!
//! A streaming loader (`mode=stream`) continues the same way: its epoch's stream and shuffle
//! buffer are replayed from the epoch's start (reading, not decoding) up to `position`; an
//! iterable source that saves its own position adds it (`stream=`, hex-encoded) and is opened
//! there instead.

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
    /// Batches per epoch of the loader that saved it, to catch a mismatched resume
    /// (`usize::MAX`: unknown, a stream with no length).
    pub batches_per_epoch: usize,
    /// Saved by a streaming loader.
    pub streaming: bool,
    /// An iterable stream's own position after batch `position - 1`, when it gives one.
    pub stream_state: Option<String>,
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
        let streaming = match fields.get("mode") {
            None | Some(&"indexed") => false,
            Some(&"stream") => true,
            Some(_) => return Err(bad("has an unknown `mode`")),
        };
        let stream_state = match fields.get("stream") {
            None => None,
            Some(hex) => Some(unhex(hex).ok_or_else(|| bad("has a malformed `stream`"))?),
        };
        Ok(ResumeState {
            seed: num("seed")?,
            epoch: num("epoch")?,
            position: num("position")? as usize,
            ahead,
            batches_per_epoch: num("batches")? as usize,
            streaming,
            stream_state,
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
        )?;
        if self.streaming {
            f.write_str(";mode=stream")?;
        }
        if let Some(state) = &self.stream_state {
            f.write_str(";stream=")?;
            for b in state.bytes() {
                write!(f, "{b:02x}")?;
            }
        }
        Ok(())
    }
}

/// The string whose bytes `hex` spells (lower or upper case), if it is one.
fn unhex(hex: &str) -> Option<String> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_indexed_and_stream_states() {
        let mut state = ResumeState {
            seed: 7,
            epoch: 2,
            position: 5,
            ahead: vec![7, 9],
            batches_per_epoch: 12,
            streaming: false,
            stream_state: None,
        };
        let text = state.to_string();
        assert!(!text.contains("mode"), "{text}");
        assert_eq!(ResumeState::parse(&text).unwrap(), state);
        state.streaming = true;
        state.batches_per_epoch = usize::MAX;
        state.stream_state = Some("offset=3;é".into());
        let text = state.to_string();
        assert!(text.contains(";mode=stream;stream="), "{text}");
        assert_eq!(ResumeState::parse(&text).unwrap(), state);
        for bad in ["mode=fast", "stream=abc", "stream=zz"] {
            let e = ResumeState::parse(&format!(
                "stoker-state-v1;seed=1;epoch=0;position=0;batches=1;{bad}"
            ))
            .unwrap_err();
            assert!(e.to_string().contains("resume_state"), "{e}");
        }
    }
}
