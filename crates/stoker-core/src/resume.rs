//! The resume state: where a job stands, as a string a new loader continues from exactly.
//!
//! Every random choice is a function of `(seed, epoch, position in the global order)`, and
//! every rank deals itself entries of one global order (see [`crate::launch::RankShare`]), so with
//! each rank having delivered `k` batches of `B` the job has consumed exactly the first
//! `k * B * W` entries of the epoch's padded global order. That prefix length — `consumed`,
//! capped at the order's length — is the job's position: the same on every rank, and
//! meaningful at any world size. A loader resumed at `W′` ranks deals the rest of the epoch
//! among them (padded to equal shares as `DistributedSampler` pads), then runs whole epochs.
//!
//! The state also carries a fingerprint of what the order and the batches depend on (the source,
//! the sampler, `batch_size`, `drop_last`, the transform); resuming with any of them changed is an
//! error naming it. States of the first format (`stoker-state-v1`, stoker 0.1's: a batch position,
//! checked by the batch count only) are still read, for the same world size and an order without
//! draws (0.1 mixed the random key differently).
//!
//! A streaming loader (`mode=stream`: tar shards with `shuffle_buffer ≥ 1`, an iterable source)
//! has no global order: each rank reads its own stream. Its state is this rank's batch position
//! in the epoch and the world size; it resumes at the same world size only, by replaying the
//! epoch's stream and shuffle buffer from the epoch's start (reading, not decoding) up to the
//! position. An iterable source that saves its own position adds it (`stream=`, hex-encoded) and
//! is opened there instead.

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::source::tokens::{Packing, SAMPLE_SETTINGS};

/// What a resume state depends on, hashed where the value is large. Two loaders with the same
/// fingerprint (and seed) have the same global order and the same batches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fingerprint {
    /// Hash of the source's identity (`Source::identity`).
    pub source: u64,
    /// Samples in the source.
    pub source_len: usize,
    /// Hash of the global order's sampler and the shard padding rule (`shard_drop_last`); not
    /// the rank or world size, which may change.
    pub sampler: u64,
    /// Samples per batch (`batch_size`).
    pub batch_size: usize,
    /// Whether the last, short batch of an epoch is dropped (`drop_last`).
    pub drop_last: bool,
    /// Hash of the image stages (`transform`, `dtype`, `layout`).
    pub transform: u64,
    /// A token stream's settings; `None` for other sources.
    pub tokens: Option<TokensPrint>,
}

/// What a token stream's order and samples depend on besides the source: its global batches
/// are the unit of position, so `batch_size` (the micro-batch) may change between runs and
/// `global_batch_size` may not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokensPrint {
    /// Tokens per sample (`seq_len`).
    pub seq_len: usize,
    /// Samples per global batch (`global_batch_size`).
    pub global_batch_size: usize,
    /// Hash of the other settings that change samples (`document_boundaries`,
    /// `token_output_dtype`, `token_dtype`, `eos_token`, `vocab_size`, and under `pad`,
    /// `pad_token`): [`TokenConfig::settings_hash`](crate::source::tokens::TokenConfig).
    pub settings: u64,
    /// Those settings by key, in words, so that a resume names the one that changed; empty in
    /// a state saved before they were written out.
    pub named: Vec<(String, String)>,
    /// `token_packing`: written as `token_packing=pad` when not `concat`, so that states of
    /// concatenated streams read as before, and named on its own when it changes (it changes
    /// what a sample is, not just its tokens).
    pub packing: Packing,
}

/// Where the loader that saved a state stood.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Position {
    /// `stoker-state-v1`: batches of the epoch this rank delivered in order, with the loader's
    /// batches per epoch as the only check.
    Batches {
        /// Batches of the epoch delivered in order.
        position: usize,
        /// The saving loader's batches per epoch.
        batches_per_epoch: usize,
    },
    /// Entries of the epoch's global order consumed by the whole job (the same on every rank),
    /// the world size that consumed them, and the fingerprint.
    Global {
        /// Entries of the epoch's padded global order consumed, capped at its length.
        consumed: usize,
        /// Ranks in the job that saved the state.
        world_size: usize,
        /// What the order and the batches depended on.
        fingerprint: Fingerprint,
        /// With `in_order=false`, the rank that saved it: the state is then that rank's own
        /// (where its in-order delivery stood, and the batches it delivered ahead), and resumes
        /// that rank at the same world size only. `None`: the same state on every rank.
        rank: Option<usize>,
    },
    /// `mode=stream`: batches of the epoch this rank delivered in order out of its own stream,
    /// the world size (a stream resumes at the same world size only), the batches per epoch
    /// (`None`: unknown, a stream with no length) and the stream's own position after batch
    /// `position - 1`, when it gives one.
    Stream {
        /// Batches of the epoch this rank delivered in order.
        position: usize,
        /// Ranks in the job that saved the state; resuming needs the same.
        world_size: usize,
        /// The saving loader's batches per epoch; `None` for a stream with no length.
        batches_per_epoch: Option<usize>,
        /// The iterable source's own position after batch `position - 1`, as it saved it.
        state: Option<String>,
    },
}

/// A job's position: everything needed to continue exactly where it stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResumeState {
    /// The saving loader's `seed`: every random choice depends on it.
    pub seed: u64,
    /// The epoch the position is in.
    pub epoch: u64,
    /// Where in that epoch the job stood.
    pub at: Position,
    /// With `in_order=false`: batches after the position also delivered by this rank, as
    /// offsets from it (v2 indexed; v1 and streaming states hold absolute positions).
    pub ahead: Vec<usize>,
}

const V1: &str = "stoker-state-v1";
const V2: &str = "stoker-state-v2";

impl ResumeState {
    /// Reads a state written by [`Display`](std::fmt::Display) (this version's or the first
    /// format); a malformed or newer state is an `InvalidOption` error for `resume_state`.
    pub fn parse(s: &str) -> Result<ResumeState> {
        let bad = |why: &str| Error::option("resume_state", format!("`{s}` {why}"));
        let mut parts = s.split(';');
        let version = parts.next().unwrap_or_default();
        if version != V1 && version != V2 {
            return Err(bad(&format!(
                "is not a stoker state this version reads (expected it to start with {V2} or \
                 {V1}{})",
                if version.starts_with("stoker-state-") {
                    "; it was written by a newer stoker"
                } else {
                    ""
                }
            )));
        }
        let mut fields = BTreeMap::new();
        for part in parts {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| bad("has a part without `=`"))?;
            fields.insert(k, v);
        }
        let field = |k: &str| -> Result<&str> {
            fields
                .get(k)
                .copied()
                .ok_or_else(|| bad(&format!("lacks `{k}`")))
        };
        let num = |k: &str| -> Result<u64> {
            field(k)?
                .parse()
                .map_err(|_| bad(&format!("has a malformed `{k}`")))
        };
        let count = |k: &str| -> Result<usize> {
            usize::try_from(num(k)?).map_err(|_| bad(&format!("has a malformed `{k}`")))
        };
        let hash = |k: &str| -> Result<u64> {
            u64::from_str_radix(field(k)?, 16).map_err(|_| bad(&format!("has a malformed `{k}`")))
        };
        let ahead = match fields.get("ahead") {
            None | Some(&"") => Vec::new(),
            Some(list) => list
                .split(',')
                .map(|p| p.parse().map_err(|_| bad("has a malformed `ahead`")))
                .collect::<Result<Vec<usize>>>()?,
        };
        let mode = match fields.get("mode") {
            None | Some(&"indexed") => "indexed",
            Some(&"stream") if version == V2 => "stream",
            Some(_) => return Err(bad("has an unknown `mode`")),
        };
        let at = if version == V1 {
            Position::Batches {
                position: count("position")?,
                batches_per_epoch: count("batches")?,
            }
        } else if mode == "stream" {
            let world_size = count("world_size")?;
            if world_size == 0 {
                return Err(bad("has world_size 0"));
            }
            Position::Stream {
                position: count("position")?,
                world_size,
                batches_per_epoch: match field("batches")? {
                    "unknown" => None,
                    _ => Some(count("batches")?),
                },
                state: match fields.get("stream") {
                    None => None,
                    Some(hex) => Some(unhex(hex).ok_or_else(|| bad("has a malformed `stream`"))?),
                },
            }
        } else {
            let drop_last = match field("drop_last")? {
                "true" => true,
                "false" => false,
                _ => return Err(bad("has a malformed `drop_last`")),
            };
            let world_size = count("world_size")?;
            if world_size == 0 {
                return Err(bad("has world_size 0"));
            }
            Position::Global {
                consumed: count("consumed")?,
                world_size,
                fingerprint: Fingerprint {
                    source: hash("source")?,
                    source_len: count("source_len")?,
                    sampler: hash("sampler")?,
                    batch_size: count("batch_size")?,
                    drop_last,
                    transform: hash("transform")?,
                    tokens: match fields.get("seq_len") {
                        None => None,
                        Some(_) => Some(TokensPrint {
                            seq_len: count("seq_len")?,
                            global_batch_size: count("global_batch_size")?,
                            settings: hash("tokens")?,
                            named: SAMPLE_SETTINGS
                                .iter()
                                .filter_map(|&k| Some((k.to_owned(), (*fields.get(k)?).to_owned())))
                                .collect(),
                            packing: match fields.get("token_packing") {
                                None | Some(&"concat") => Packing::Concat,
                                Some(&"pad") => Packing::Pad,
                                Some(_) => return Err(bad("has an unknown `token_packing`")),
                            },
                        }),
                    },
                },
                rank: match fields.get("rank") {
                    None => None,
                    Some(_) => Some(count("rank")?),
                },
            }
        };
        Ok(ResumeState {
            seed: num("seed")?,
            epoch: num("epoch")?,
            at,
            ahead,
        })
    }
}

impl std::fmt::Display for ResumeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ahead: Vec<String> = self.ahead.iter().map(|p| p.to_string()).collect();
        let ahead = ahead.join(",");
        match &self.at {
            Position::Stream {
                position,
                world_size,
                batches_per_epoch,
                state,
            } => {
                write!(
                    f,
                    "{V2};seed={};epoch={};mode=stream;position={position};world_size={world_size};ahead={ahead};batches=",
                    self.seed, self.epoch
                )?;
                match batches_per_epoch {
                    Some(n) => write!(f, "{n}")?,
                    None => f.write_str("unknown")?,
                }
                if let Some(state) = state {
                    f.write_str(";stream=")?;
                    for b in state.bytes() {
                        write!(f, "{b:02x}")?;
                    }
                }
                Ok(())
            }
            Position::Batches {
                position,
                batches_per_epoch,
            } => write!(
                f,
                "{V1};seed={};epoch={};position={position};ahead={ahead};batches={batches_per_epoch}",
                self.seed, self.epoch
            ),
            Position::Global {
                consumed,
                world_size,
                fingerprint: fp,
                rank,
            } => write!(
                f,
                "{V2};seed={};epoch={};consumed={consumed};world_size={world_size};ahead={ahead};\
                 source={:016x};source_len={};sampler={:016x};batch_size={};drop_last={};\
                 transform={:016x}",
                self.seed,
                self.epoch,
                fp.source,
                fp.source_len,
                fp.sampler,
                fp.batch_size,
                fp.drop_last,
                fp.transform
            )
            .and_then(|()| match &fp.tokens {
                Some(t) => write!(
                    f,
                    ";seq_len={};global_batch_size={};tokens={:016x}",
                    t.seq_len, t.global_batch_size, t.settings
                )
                .and_then(|()| match t.packing {
                    Packing::Concat => Ok(()),
                    other => write!(f, ";token_packing={}", other.name()),
                })
                .and_then(|()| {
                    t.named
                        .iter()
                        .try_for_each(|(key, value)| write!(f, ";{key}={value}"))
                }),
                None => Ok(()),
            })
            .and_then(|()| match rank {
                Some(rank) => write!(f, ";rank={rank}"),
                None => Ok(()),
            }),
        }
    }
}

impl Fingerprint {
    /// Why a state saved with `saved` cannot resume a loader with `self`, or `None` if it can;
    /// `here` describes this loader's source, sampler and transform for the message.
    pub fn mismatch(&self, saved: &Fingerprint, here: &FingerprintText) -> Option<String> {
        let mut diffs = Vec::new();
        if saved.source_len != self.source_len {
            diffs.push(format!(
                "source ({} samples there; here {} samples: {})",
                saved.source_len, self.source_len, here.source
            ));
        } else if saved.source != self.source {
            // The state holds the identity's hash only: what differs cannot be said.
            diffs.push(format!(
                "source (of as many samples, {}, but other files, fields or labels there; \
                 here: {})",
                self.source_len, here.source
            ));
        }
        if saved.sampler != self.sampler {
            diffs.push(format!(
                "sampler settings (shuffle, replacement, num_samples, weights, subset, \
                 indices or shard_drop_last; here {})",
                here.sampler
            ));
        }
        match (&saved.tokens, &self.tokens) {
            (Some(there), Some(here_t)) => {
                if there.seq_len != here_t.seq_len {
                    diffs.push(format!(
                        "seq_len ({} there, {} here)",
                        there.seq_len, here_t.seq_len
                    ));
                }
                if there.packing != here_t.packing {
                    diffs.push(format!(
                        "token_packing ({} there, {} here)",
                        there.packing.name(),
                        here_t.packing.name()
                    ));
                }
                if there.global_batch_size != here_t.global_batch_size {
                    diffs.push(format!(
                        "global_batch_size ({} there, {} here)",
                        there.global_batch_size, here_t.global_batch_size
                    ));
                }
                if there.settings != here_t.settings {
                    let named: Vec<String> = here_t
                        .named
                        .iter()
                        .filter_map(|(key, value)| {
                            let (_, was) = there.named.iter().find(|(k, _)| k == key)?;
                            (was != value).then(|| format!("{key} ({was} there, {value} here)"))
                        })
                        .collect();
                    if named.is_empty() {
                        // A state saved before the settings were written out holds their hash.
                        diffs.push(format!("token settings (here {})", here.tokens));
                    } else {
                        diffs.extend(named);
                    }
                }
            }
            (None, None) => {}
            _ => diffs.push("kind of source (a token stream on one side only)".into()),
        }
        // A token stream's position is in global batches: its micro-batch may change.
        if saved.batch_size != self.batch_size && self.tokens.is_none() {
            diffs.push(format!(
                "batch_size ({} there, {} here)",
                saved.batch_size, self.batch_size
            ));
        }
        if saved.drop_last != self.drop_last {
            diffs.push(format!(
                "drop_last ({} there, {} here)",
                saved.drop_last, self.drop_last
            ));
        }
        if saved.transform != self.transform {
            diffs.push(format!(
                "transform, dtype or layout (here {})",
                here.transform
            ));
        }
        (!diffs.is_empty()).then(|| {
            format!(
                "was saved by a loader that differs in its {}: resume with the options it \
                 was saved with",
                diffs.join(", ")
            )
        })
    }
}

/// Readable forms of what a [`Fingerprint`] hashes, for messages.
#[derive(Clone, Debug, Default)]
pub struct FingerprintText {
    /// The source's identity (`Source::identity`).
    pub source: String,
    /// The sampler's kind and settings in words (`random, replacement=false, ...`).
    pub sampler: String,
    /// `transform`, `dtype` and `layout`.
    pub transform: String,
    /// A token stream's settings in words.
    pub tokens: String,
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

    fn fp() -> Fingerprint {
        Fingerprint {
            source: 0xabc,
            source_len: 100,
            sampler: 7,
            batch_size: 8,
            drop_last: false,
            transform: 0,
            tokens: None,
        }
    }

    /// A state of 4 entries consumed by 2 ranks under `fingerprint`.
    fn global_state(fingerprint: Fingerprint) -> ResumeState {
        ResumeState {
            seed: 1,
            epoch: 0,
            at: Position::Global {
                consumed: 4,
                world_size: 2,
                fingerprint,
                rank: None,
            },
            ahead: vec![],
        }
    }

    #[test]
    fn v2_round_trips() {
        let s = ResumeState {
            seed: 3,
            epoch: 2,
            at: Position::Global {
                consumed: 48,
                world_size: 3,
                fingerprint: fp(),
                rank: None,
            },
            ahead: vec![1, 3],
        };
        let text = s.to_string();
        assert!(
            text.starts_with("stoker-state-v2;seed=3;epoch=2;consumed=48;"),
            "{text}"
        );
        assert_eq!(ResumeState::parse(&text).unwrap(), s);
    }

    #[test]
    fn token_states_round_trip_and_name_changed_settings() {
        let tokens = Fingerprint {
            tokens: Some(TokensPrint {
                seq_len: 2048,
                global_batch_size: 48,
                settings: 0x5,
                named: vec![],
                packing: Packing::Concat,
            }),
            ..fp()
        };
        let s = ResumeState {
            seed: 1,
            epoch: 0,
            at: Position::Global {
                consumed: 96,
                world_size: 8,
                fingerprint: tokens.clone(),
                rank: None,
            },
            ahead: vec![],
        };
        let text = s.to_string();
        assert!(
            text.ends_with(";seq_len=2048;global_batch_size=48;tokens=0000000000000005"),
            "{text}"
        );
        assert_eq!(ResumeState::parse(&text).unwrap(), s);
        let here = Fingerprint {
            batch_size: 2,
            tokens: Some(TokensPrint {
                seq_len: 1024,
                global_batch_size: 96,
                settings: 0x5,
                named: vec![],
                packing: Packing::Concat,
            }),
            ..fp()
        };
        let m = here.mismatch(&tokens, &FingerprintText::default()).unwrap();
        assert!(m.contains("seq_len (2048 there, 1024 here)"), "{m}");
        assert!(!m.contains("token settings"), "{m}");
        assert!(m.contains("global_batch_size (48 there, 96 here)"), "{m}");
        assert!(
            !m.contains("batch_size (8"),
            "the micro-batch may change: {m}"
        );
    }

    #[test]
    fn token_settings_are_written_out_and_each_changed_one_is_named() {
        let print = |settings, eos: &str| Fingerprint {
            tokens: Some(TokensPrint {
                seq_len: 8,
                global_batch_size: 4,
                settings,
                named: vec![
                    ("document_boundaries".into(), "ignore".into()),
                    ("eos_token".into(), eos.into()),
                ],
                packing: Packing::Concat,
            }),
            ..fp()
        };
        let saved = global_state(print(0x9, "none"));
        let text = saved.to_string();
        assert!(
            text.ends_with(";tokens=0000000000000009;document_boundaries=ignore;eos_token=none"),
            "{text}"
        );
        let Position::Global { fingerprint, .. } = ResumeState::parse(&text).unwrap().at else {
            panic!("{text}");
        };
        let here = FingerprintText {
            tokens: "document_boundaries=ignore, eos_token=2".into(),
            ..FingerprintText::default()
        };
        let m = print(0xa, "2").mismatch(&fingerprint, &here).unwrap();
        assert!(m.contains("its eos_token (none there, 2 here):"), "{m}");
        // A state from before the settings were written out has only their hash.
        let old = text.replace(";document_boundaries=ignore;eos_token=none", "");
        let Position::Global { fingerprint, .. } = ResumeState::parse(&old).unwrap().at else {
            panic!("{old}");
        };
        let m = print(0xa, "2").mismatch(&fingerprint, &here).unwrap();
        assert!(
            m.contains("token settings (here document_boundaries=ignore, eos_token=2)"),
            "{m}"
        );
    }

    #[test]
    fn token_packing_round_trips_and_states_without_it_are_concat() {
        let print = |packing| Fingerprint {
            tokens: Some(TokensPrint {
                seq_len: 8,
                global_batch_size: 4,
                settings: 0x9,
                named: vec![],
                packing,
            }),
            ..fp()
        };
        let padded = global_state(print(Packing::Pad));
        let text = padded.to_string();
        assert!(
            text.ends_with(";tokens=0000000000000009;token_packing=pad"),
            "{text}"
        );
        assert_eq!(ResumeState::parse(&text).unwrap(), padded);
        // A concatenated stream's state is as it was before the key existed.
        let concat = global_state(print(Packing::Concat)).to_string();
        assert!(concat.ends_with(";tokens=0000000000000009"), "{concat}");
        assert_eq!(
            ResumeState::parse(&concat).unwrap(),
            global_state(print(Packing::Concat))
        );
        let m = print(Packing::Concat)
            .mismatch(&print(Packing::Pad), &FingerprintText::default())
            .unwrap();
        assert!(m.contains("token_packing (pad there, concat here)"), "{m}");
        assert!(ResumeState::parse(&text.replace("=pad", "=ragged")).is_err());
    }

    #[test]
    fn v1_states_are_read() {
        let s = ResumeState::parse("stoker-state-v1;seed=3;epoch=1;position=2;ahead=4;batches=6")
            .unwrap();
        assert_eq!(
            s.at,
            Position::Batches {
                position: 2,
                batches_per_epoch: 6
            }
        );
        assert_eq!((s.seed, s.epoch, s.ahead.clone()), (3, 1, vec![4]));
        assert_eq!(
            s.to_string(),
            "stoker-state-v1;seed=3;epoch=1;position=2;ahead=4;batches=6"
        );
    }

    #[test]
    fn malformed_and_unknown_states_are_refused() {
        for (text, needle) in [
            ("garbage", "is not a stoker state"),
            ("stoker-state-v9;seed=1", "newer stoker"),
            ("stoker-state-v2;seed=1;epoch=0", "lacks `"),
            (
                "stoker-state-v2;seed=1;epoch=0;consumed=0;world_size=1;source=zz;source_len=1;sampler=0;batch_size=1;drop_last=false;transform=0",
                "malformed `source`",
            ),
        ] {
            let e = ResumeState::parse(text).unwrap_err().to_string();
            assert!(e.contains(needle) && e.contains("resume_state"), "{text}: {e}");
        }
    }

    #[test]
    fn mismatches_name_what_differs() {
        let here = FingerprintText {
            source: "npy x.npy".into(),
            sampler: "random".into(),
            transform: "none".into(),
            tokens: String::new(),
        };
        assert_eq!(fp().mismatch(&fp(), &here), None);
        let saved = Fingerprint {
            batch_size: 16,
            source_len: 99,
            ..fp()
        };
        let m = fp().mismatch(&saved, &here).unwrap();
        assert!(m.contains("batch_size (16 there, 8 here)"), "{m}");
        assert!(
            m.contains("its source (99 samples there; here 100 samples: npy x.npy)"),
            "{m}"
        );
        assert!(!m.contains("sampler"), "{m}");
    }

    #[test]
    fn stream_states_round_trip() {
        let mut state = ResumeState {
            seed: 7,
            epoch: 2,
            at: Position::Stream {
                position: 5,
                world_size: 2,
                batches_per_epoch: Some(12),
                state: None,
            },
            ahead: vec![7, 9],
        };
        let text = state.to_string();
        assert!(
            text.starts_with("stoker-state-v2;seed=7;epoch=2;mode=stream;position=5;world_size=2;"),
            "{text}"
        );
        assert!(!text.contains("stream="), "{text}");
        assert_eq!(ResumeState::parse(&text).unwrap(), state);
        state.at = Position::Stream {
            position: 5,
            world_size: 1,
            batches_per_epoch: None,
            state: Some("offset=3;é".into()),
        };
        let text = state.to_string();
        assert!(text.contains(";batches=unknown;stream="), "{text}");
        assert_eq!(ResumeState::parse(&text).unwrap(), state);
        for bad in ["mode=fast", "stream=abc", "stream=zz", "world_size=0"] {
            let e = ResumeState::parse(&format!(
                "stoker-state-v2;seed=1;epoch=0;mode=stream;position=0;batches=1;world_size=1;{bad}"
            ))
            .unwrap_err();
            assert!(e.to_string().contains("resume_state"), "{bad}: {e}");
        }
        // v1 never had streaming states.
        assert!(ResumeState::parse(
            "stoker-state-v1;seed=1;epoch=0;position=0;batches=1;mode=stream"
        )
        .is_err());
    }
}
