//! Telemetry spans: what a worker notes about each stage of each sample (`Span`), shared by the
//! stats that sum them ([`crate::stats`]) and the timeline that draws them ([`crate::trace`]).

use std::time::Instant;

/// A stage of building one sample, in the order a sample goes through them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Reading the sample's bytes from its source (a file read, a view into a memory map, the
    /// user's callback).
    Read = 0,
    /// Decoding an encoded image to pixels.
    Decode = 1,
    /// The image transform pipeline, written into the batch slot.
    Transform = 2,
    /// Copying, padding and laying out tensor fields in the batch slab (and taking the slab).
    Collate = 3,
}

impl Stage {
    /// Every stage, in the order a sample goes through them.
    pub const ALL: [Stage; 4] = [Stage::Read, Stage::Decode, Stage::Transform, Stage::Collate];

    /// The stage's name in stats (`<name>_ns`) and in the trace: `read`, `decode`, `transform`,
    /// `collate`.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Read => "read",
            Stage::Decode => "decode",
            Stage::Transform => "transform",
            Stage::Collate => "collate",
        }
    }
}

/// One span a worker recorded while building a batch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Span {
    pub(crate) kind: SpanKind,
    /// The sample's slot in the batch, or [`NO_SLOT`] for batch-level work.
    pub(crate) slot: u32,
    /// The dataset index the span worked on (the replacement's, for a replacement).
    pub(crate) index: u64,
    pub(crate) start: Instant,
    pub(crate) end: Instant,
}

pub(crate) const NO_SLOT: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SpanKind {
    Stage(Stage),
    /// Everything phase 1 did for one slot (its reads, replacements included).
    SampleRead,
    /// Everything phase 2 did for one slot (its writes, a replacement included).
    SampleWrite,
}
