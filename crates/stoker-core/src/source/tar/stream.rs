//! Sequential reading of one shard, for streaming mode: samples one at a time, in archive order,
//! from any byte stream (a file read front to back with a read-ahead hint, a gzip stream, a
//! network body).
//!
//! The `tar` crate's streaming `entries()` parses the headers, exactly as in the indexed scan, and
//! the same grouping rule and the same errors apply. Only members of the wanted extensions are
//! read into memory, each bounded by `max_member_bytes` before anything is allocated; the others
//! are skipped. GNU long names and pax headers, which the crate reads into memory itself, are
//! bounded too: the stream refuses to give more than [`MAX_EXTENSION_BYTES`] beyond the end of
//! the current member's data, so a malformed (or gzip-bombed) shard cannot make one header take
//! unbounded memory.
//!
//! gzip-compressed shards (`.tar.gz`, `.tgz`) are recognised by their magic bytes, whatever
//! their name, and decompressed on the fly (concatenated gzip members, as `pigz` writes, work).
//!
//! [`ShardReader`] runs the parse on its own thread, a few samples ahead of the consumer (its
//! read-ahead); [`read_samples`] is the same parse run synchronously with a callback.

use std::cell::Cell;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::rc::Rc;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};

use super::scan::{after, is_meta, name_hint, next_header, split_key, Group, Grouper, BLOCK};
use super::TarConfig;
use crate::error::{Error, Result};
use crate::source::open_file;

/// The most bytes of extension headers (GNU long names, pax records) accepted before a member.
pub const MAX_EXTENSION_BYTES: u64 = 1 << 20;

/// Samples a [`ShardReader`] parses ahead of its consumer.
const READ_AHEAD_SAMPLES: usize = 4;

/// Buffer of the file (or decompressed) stream; large, sequential reads.
const BUFFER_BYTES: usize = 1 << 20;

/// One member of a streamed sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamMember {
    /// Lower-cased extension, without the dot.
    pub ext: String,
    /// Byte offset of the member's data in the (decompressed) tar stream.
    pub offset: u64,
    /// The member's bytes.
    pub data: Vec<u8>,
}

/// One sample read from a stream: its key and the members that were kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamSample {
    /// The shard it came from, as given to the reader.
    pub shard: Arc<str>,
    /// The WebDataset key shared by its members.
    pub key: String,
    /// Byte offset of the tar header of its first member.
    pub offset: u64,
    /// The members kept, in tar order.
    pub members: Vec<StreamMember>,
}

impl StreamSample {
    /// `shard PATH sample KEY (offset N)`, like `TarSource::describe`.
    pub fn describe(&self) -> String {
        format!(
            "shard {} sample {} (offset {})",
            self.shard, self.key, self.offset
        )
    }

    /// The member with extension `ext`, if the sample has one.
    pub fn member(&self, ext: &str) -> Option<&StreamMember> {
        self.members.iter().find(|m| m.ext == ext)
    }
}

/// What a streaming read keeps.
#[derive(Clone, Debug)]
pub struct ReadOptions {
    /// Members larger than this are an error naming them.
    pub max_member_bytes: u64,
    /// Extensions to keep (`None`: every member, e.g. to learn the fields from a first sample).
    pub wanted: Option<Vec<String>>,
}

impl ReadOptions {
    /// Whether members with extension `ext` are kept.
    fn wants(&self, ext: &str) -> bool {
        self.wanted
            .as_ref()
            .is_none_or(|w| w.iter().any(|x| x == ext))
    }

    /// The bound from `config`, and the extensions `fields` reads (every member if `None`).
    pub fn new(config: &TarConfig, fields: Option<&super::TarFields>) -> ReadOptions {
        ReadOptions {
            max_member_bytes: config.max_member_bytes,
            wanted: fields.map(|f| f.wanted_extensions()),
        }
    }
}

/// Reads every sample of a tar (or gzip-compressed tar) stream, in order, calling `emit` for
/// each; `emit` returns `false` to stop early. `shard` names the stream in samples and errors.
/// A malformed stream gives an error naming the shard, the member (or the one before) and the
/// byte offset; the samples before it have been emitted.
pub fn read_samples(
    shard: &str,
    reader: impl Read,
    options: &ReadOptions,
    mut emit: impl FnMut(StreamSample) -> bool,
) -> Result<()> {
    let shard: Arc<str> = Arc::from(shard);
    let stream = decompressing(BufReader::with_capacity(BUFFER_BYTES, reader))
        .map_err(|e| Error::format(&*shard, format!("cannot read: {e}")))?;
    parse(&shard, stream, 0, options, &mut emit).map(|_| ())
}

/// Wraps `reader` in a gzip decoder when it starts with the gzip magic bytes.
fn decompressing<'r, R: BufRead + 'r>(mut reader: R) -> std::io::Result<Box<dyn Read + 'r>> {
    let head = reader.fill_buf()?;
    if head.starts_with(&[0x1f, 0x8b]) {
        let decoder = flate2::bufread::MultiGzDecoder::new(reader);
        Ok(Box::new(BufReader::with_capacity(BUFFER_BYTES, decoder)))
    } else {
        Ok(Box::new(reader))
    }
}

/// A stream that counts what it gives and refuses to give past `limit`.
struct Metered<R> {
    inner: R,
    state: Rc<Meter>,
}

struct Meter {
    /// Bytes given so far.
    pos: Cell<u64>,
    /// Bytes that may be given; past it, reads fail (bounds extension headers).
    limit: Cell<u64>,
    /// The inner stream ended.
    eof: Cell<bool>,
    /// Where the next header starts, and the first bytes read there (its name field), so that
    /// an error about that header can say which member it was.
    header_at: Cell<u64>,
    name_field: Cell<[u8; 100]>,
}

impl Meter {
    /// Records the part of `bytes` (given at `pos`) that falls in the next header's name field.
    fn watch(&self, pos: u64, bytes: &[u8]) {
        let h = self.header_at.get();
        let end = pos + bytes.len() as u64;
        if end <= h || pos >= h + 100 {
            return;
        }
        let mut field = self.name_field.get();
        let from = h.max(pos);
        let to = end.min(h + 100);
        field[(from - h) as usize..(to - h) as usize]
            .copy_from_slice(&bytes[(from - pos) as usize..(to - pos) as usize]);
        self.name_field.set(field);
    }
}

impl<R: Read> Read for Metered<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let s = &self.state;
        let room = s.limit.get().saturating_sub(s.pos.get());
        if room == 0 && !buf.is_empty() {
            return Err(std::io::Error::other(format!(
                "more than {MAX_EXTENSION_BYTES} bytes of extension headers before one member"
            )));
        }
        let want = buf.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        if n == 0 && want > 0 {
            s.eof.set(true);
        }
        s.watch(s.pos.get(), &buf[..n]);
        s.pos.set(s.pos.get() + n as u64);
        Ok(n)
    }
}

/// The parse shared by [`read_samples`] and [`ShardReader`]. `Ok(false)`: `emit` asked to stop.
///
/// `base` is the byte offset in the shard where `stream` starts (a reader that seeked to a
/// sample's first header); every offset reported counts from the start of the shard.
///
/// On damage in a member of another sample (its header read whole, so its name is known), the
/// sample being gathered is whole: it is emitted before the error. A sample is otherwise
/// emitted only when the next one starts, and the last whole sample before such damage would be
/// lost with it. Damage in a header, or a stream that stops at a member's end, may have taken
/// members of the sample being gathered: it is dropped with the damage.
fn parse(
    shard: &Arc<str>,
    stream: impl Read,
    base: u64,
    options: &ReadOptions,
    emit: &mut dyn FnMut(StreamSample) -> bool,
) -> Result<bool> {
    let mut grouper = Grouper::new();
    let mut damaged = Damage::Unknown;
    let outcome = parse_members(
        shard,
        stream,
        base,
        options,
        &mut grouper,
        &mut damaged,
        emit,
    );
    if outcome.is_err() {
        if let (Some(group), Damage::Member(key)) = (grouper.finish(), damaged) {
            if key != group.key {
                emit(sample(shard, group, options));
            }
        }
    }
    outcome
}

/// Where a read failed, as far as the sample it belongs to is known.
enum Damage {
    /// In a member of the sample with this key, whose header was read whole.
    Member(String),
    /// In a header, or at the end of the stream: whose member it is is not known.
    Unknown,
}

/// A gathered group as a sample: its wanted members.
///
/// Unwanted members take part in grouping (as empty placeholders), so that samples are cut
/// exactly as in the indexed scan; they are dropped here. A sample left with no member is still
/// emitted: it lacks its fields, a per-sample error, as in indexed mode.
fn sample(shard: &Arc<str>, group: Group<StreamMember>, options: &ReadOptions) -> StreamSample {
    StreamSample {
        shard: Arc::clone(shard),
        key: group.key,
        offset: group.offset,
        members: group
            .members
            .into_iter()
            .filter(|(ext, _)| options.wants(ext))
            .map(|(_, m)| m)
            .collect(),
    }
}

/// [`parse`]'s reading. On error, `grouper` holds the sample being gathered and `damaged` says
/// whose member the damage is in.
fn parse_members(
    shard: &Arc<str>,
    stream: impl Read,
    base: u64,
    options: &ReadOptions,
    grouper: &mut Grouper<StreamMember>,
    damaged: &mut Damage,
    emit: &mut dyn FnMut(StreamSample) -> bool,
) -> Result<bool> {
    let fail = |reason: String| Error::format(&**shard, reason);
    let member_of = |name: &Option<String>| match name.as_deref().and_then(split_key) {
        Some((key, _)) => Damage::Member(key.to_owned()),
        None => Damage::Unknown,
    };
    let meter = Rc::new(Meter {
        pos: Cell::new(base),
        limit: Cell::new(base.saturating_add(MAX_EXTENSION_BYTES + BLOCK)),
        eof: Cell::new(false),
        header_at: Cell::new(base),
        name_field: Cell::new([0; 100]),
    });
    let mut archive = ::tar::Archive::new(Metered {
        inner: stream,
        state: Rc::clone(&meter),
    });
    let entries = archive
        .entries()
        .map_err(|e| fail(format!("cannot read as tar: {e}")))?;
    // Where the next header starts, where the last member's data started and ended, the last
    // member seen.
    let mut end = base;
    let mut data_at = base;
    let mut data_end = base;
    let mut prev: Option<String> = None;
    for entry in entries {
        let mut entry = entry.map_err(|e| {
            let pos = meter.pos.get();
            let cut = meter.eof.get() && pos < data_end;
            *damaged = if cut { member_of(&prev) } else { Damage::Unknown };
            fail(if cut {
                cut_short(prev.as_deref().unwrap_or("?"), data_at, data_end, pos)
            } else if meter.eof.get() {
                format!(
                    "truncated: the stream ends at byte offset {pos}, inside the tar header at byte offset {end} {}",
                    after(&prev)
                )
            } else {
                format!(
                    "bad tar header{} at byte offset {end} {}: {e}",
                    name_hint(&meter.name_field.get()),
                    after(&prev)
                )
            })
        })?;
        let header_at = base + entry.raw_header_position();
        data_at = base + entry.raw_file_position();
        let size = entry.size();
        let name_bytes = entry.path_bytes();
        *damaged = Damage::Unknown;
        let name = std::str::from_utf8(&name_bytes)
            .map_err(|_| {
                fail(format!(
                    "member name {:?} at byte offset {header_at} is not UTF-8",
                    String::from_utf8_lossy(&name_bytes)
                ))
            })?
            .to_owned();
        prev = Some(name.clone());
        *damaged = member_of(&prev);
        data_end = data_at
            .checked_add(size)
            .ok_or_else(|| fail(format!("member `{name}`: size overflow")))?;
        end =
            next_header(data_end).ok_or_else(|| fail(format!("member `{name}`: size overflow")))?;
        meter
            .limit
            .set(end.saturating_add(MAX_EXTENSION_BYTES + BLOCK));
        meter.header_at.set(end);
        meter.name_field.set([0; 100]);
        let kind = entry.header().entry_type();
        if kind.is_gnu_sparse() {
            return Err(fail(format!(
                "member `{name}` at byte offset {header_at} is a GNU sparse file, which is not supported"
            )));
        }
        let regular = kind.is_file() || kind.is_contiguous();
        if !regular || is_meta(&name) {
            continue;
        }
        let Some((key, ext)) = split_key(&name) else {
            continue;
        };
        let ext = ext.to_lowercase();
        let data = if options.wants(&ext) {
            if size > options.max_member_bytes {
                return Err(fail(format!(
                    "member `{name}` at byte offset {data_at} has {size} bytes, more than max_member_bytes={}",
                    options.max_member_bytes
                )));
            }
            let mut data = Vec::with_capacity(size as usize);
            let read = (&mut entry)
                .take(size)
                .read_to_end(&mut data)
                .map_err(|e| fail(format!("member `{name}` at byte offset {data_at}: {e}")))?;
            if (read as u64) < size {
                return Err(fail(cut_short(
                    &name,
                    data_at,
                    data_end,
                    data_at + read as u64,
                )));
            }
            data
        } else {
            Vec::new()
        };
        let member = StreamMember {
            ext: ext.clone(),
            offset: data_at,
            data,
        };
        let done = grouper
            .push(key, ext, header_at, member)
            .map_err(|reason| {
                fail(format!(
                    "member `{name}` at byte offset {header_at}: {reason}"
                ))
            })?;
        if let Some(group) = done {
            if !emit(sample(shard, group, options)) {
                return Ok(false);
            }
        }
    }
    // The crate stops at EOF or at a zero block; only the zero block is a complete shard.
    let pos = meter.pos.get();
    if pos < data_end {
        *damaged = member_of(&prev);
        return Err(fail(cut_short(
            prev.as_deref().unwrap_or("?"),
            data_at,
            data_end,
            pos,
        )));
    }
    if pos < end.saturating_add(BLOCK) {
        *damaged = Damage::Unknown;
        return Err(fail(format!(
            "truncated: no end-of-archive block at byte offset {end} {} (the stream has {pos} bytes)",
            after(&prev)
        )));
    }
    match grouper.finish() {
        Some(group) => Ok(emit(sample(shard, group, options))),
        None => Ok(true),
    }
}

fn cut_short(name: &str, data_at: u64, data_end: u64, stream_end: u64) -> String {
    format!(
        "member `{name}` is cut short: its {} bytes at byte offset {data_at} run past the end of the stream ({stream_end} bytes)",
        data_end - data_at
    )
}

/// Reads one shard sequentially on a thread of its own, a few samples ahead of the consumer.
///
/// Iterate it (or call [`ShardReader::next_sample`]): samples in archive order, then `None`;
/// after an error, nothing more. Dropping it stops the thread (after the member it is reading)
/// and joins it.
pub struct ShardReader {
    shard: Arc<str>,
    rx: Receiver<Msg>,
    thread: Option<JoinHandle<()>>,
    finished: bool,
    /// Set when dropped, for a source whose reads can wait (a shard still downloading).
    stop: Option<Arc<AtomicBool>>,
}

enum Msg {
    Sample(StreamSample),
    End,
    Failed(Error),
}

impl ShardReader {
    /// Opens `path` for one front-to-back pass, telling the kernel so
    /// (`posix_fadvise(SEQUENTIAL)`, which doubles its read-ahead).
    pub fn open(path: &Path, options: ReadOptions) -> Result<ShardReader> {
        ShardReader::open_at(path, 0, options)
    }

    /// Opens an uncompressed shard for a front-to-back pass from byte `offset`, which must be
    /// where a member's headers start (a sample's start, from the shard's index). Offsets in
    /// samples and errors still count from the start of the shard.
    pub fn open_at(path: &Path, offset: u64, options: ReadOptions) -> Result<ShardReader> {
        use std::io::{Seek, SeekFrom};
        let (mut file, _) = open_file(path, "a tar shard")?;
        advise_sequential(&file);
        if offset > 0 {
            file.seek(SeekFrom::Start(offset))
                .map_err(|e| Error::io(path, format!("seeking to byte offset {offset}: {e}")))?;
        }
        ShardReader::start(&path.to_string_lossy(), file, offset, options)
    }

    /// Reads a shard from any stream (`shard` names it in samples and errors).
    pub fn from_reader(
        shard: &str,
        reader: impl Read + Send + 'static,
        options: ReadOptions,
    ) -> Result<ShardReader> {
        ShardReader::start(shard, reader, 0, options)
    }

    /// Reads a shard from a stream whose reads may wait (a shard still downloading): dropping
    /// the reader sets `stop`, which such a stream checks while it waits, so the drop does
    /// not wait for bytes that are not needed.
    pub fn from_waiting_reader(
        shard: &str,
        reader: impl Read + Send + 'static,
        options: ReadOptions,
        stop: Arc<AtomicBool>,
    ) -> Result<ShardReader> {
        let mut reader = ShardReader::start(shard, reader, 0, options)?;
        reader.stop = Some(stop);
        Ok(reader)
    }

    fn start(
        shard: &str,
        reader: impl Read + Send + 'static,
        base: u64,
        options: ReadOptions,
    ) -> Result<ShardReader> {
        let shard: Arc<str> = Arc::from(shard);
        let (tx, rx) = crossbeam_channel::bounded(READ_AHEAD_SAMPLES);
        let name = Arc::clone(&shard);
        let thread = std::thread::Builder::new()
            .name("stoker-tar-read".into())
            .spawn(move || pump(name, reader, base, options, tx))
            .map_err(|e| Error::Internal(format!("cannot start a thread to read {shard}: {e}")))?;
        Ok(ShardReader {
            shard,
            rx,
            thread: Some(thread),
            finished: false,
            stop: None,
        })
    }

    /// The shard's name, as given.
    pub fn shard(&self) -> &str {
        &self.shard
    }

    /// The next sample, `Ok(None)` at the end of the shard.
    pub fn next_sample(&mut self) -> Result<Option<StreamSample>> {
        if self.finished {
            return Ok(None);
        }
        let msg = self.rx.recv();
        match msg {
            Ok(Msg::Sample(s)) => Ok(Some(s)),
            Ok(Msg::End) => {
                self.finished = true;
                Ok(None)
            }
            Ok(Msg::Failed(e)) => {
                self.finished = true;
                Err(e)
            }
            Err(_) => {
                self.finished = true;
                Err(Error::Internal(format!(
                    "the reader thread of {} stopped without finishing",
                    self.shard
                )))
            }
        }
    }
}

impl Iterator for ShardReader {
    type Item = Result<StreamSample>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_sample().transpose()
    }
}

impl Drop for ShardReader {
    fn drop(&mut self) {
        // Dropping the receiver makes the thread's next send fail, which ends it.
        self.rx = crossbeam_channel::never();
        if let Some(stop) = &self.stop {
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The reader thread: parse, sending each sample; then `End` or the error.
fn pump(shard: Arc<str>, reader: impl Read, base: u64, options: ReadOptions, tx: Sender<Msg>) {
    let outcome = decompressing(BufReader::with_capacity(BUFFER_BYTES, reader))
        .map_err(|e| Error::format(&*shard, format!("cannot read: {e}")))
        .and_then(|stream| {
            parse(&shard, stream, base, &options, &mut |s| {
                tx.send(Msg::Sample(s)).is_ok()
            })
        });
    let _ = match outcome {
        Ok(true) => tx.send(Msg::End),
        Ok(false) => Ok(()),
        Err(e) => tx.send(Msg::Failed(e)),
    };
}

/// The samples of a damaged shard up to the damage, as the scan would list them, and the error
/// that stopped the read (`None` if the shard reads to its end). Every member is read (copied)
/// to learn its size: this is for the rare damaged shard under `on_error=skip`, not for every
/// shard. The sample the damage may be in is not listed (see [`parse`]).
pub(super) fn readable_prefix(
    shard: &str,
    reader: impl Read,
    max_member_bytes: u64,
) -> (Vec<super::scan::ScannedSample>, Option<Error>) {
    use super::scan::{ScannedMember, ScannedSample};
    let options = ReadOptions {
        max_member_bytes,
        wanted: None,
    };
    let mut samples = Vec::new();
    let outcome = read_samples(shard, reader, &options, |s| {
        samples.push(ScannedSample {
            key: s.key,
            offset: s.offset,
            members: s
                .members
                .into_iter()
                .map(|m| ScannedMember {
                    ext: m.ext,
                    offset: m.offset,
                    size: m.data.len() as u64,
                })
                .collect(),
        });
        true
    });
    (samples, outcome.err())
}

/// Tells the kernel `file` is read front to back; only a hint, so failure is ignored.
fn advise_sequential(file: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: the descriptor is open for the duration of the call (borrowed from `file`);
    // posix_fadvise only records an access-pattern hint and touches no memory of ours.
    let _ = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_SEQUENTIAL) };
}

#[cfg(test)]
mod tests {
    use super::super::scan::scan_members;
    use super::*;

    fn gnu_header(name: &[u8], size: u64, kind: ::tar::EntryType) -> Vec<u8> {
        let mut h = ::tar::Header::new_gnu();
        let field = &mut h.as_old_mut().name;
        field[..name.len()].copy_from_slice(name);
        h.set_size(size);
        h.set_mode(0o644);
        h.set_entry_type(kind);
        h.set_cksum();
        h.as_bytes().to_vec()
    }

    fn pad(out: &mut Vec<u8>) {
        out.resize(out.len().div_ceil(512) * 512, 0);
    }

    /// A shard of `n` samples (jpg + cls), written by the tar crate's builder, one with a long
    /// name (a GNU long-name member).
    fn shard(n: usize) -> Vec<u8> {
        let mut b = ::tar::Builder::new(Vec::new());
        for i in 0..n {
            let key = if i == 1 {
                format!("dir/{}{i}", "x".repeat(120))
            } else {
                format!("s{i:04}")
            };
            for (ext, data) in [
                ("jpg", vec![i as u8; 300 + i]),
                ("cls", i.to_string().into_bytes()),
            ] {
                let mut h = ::tar::Header::new_gnu();
                h.set_size(data.len() as u64);
                h.set_mode(0o644);
                b.append_data(&mut h, format!("{key}.{ext}"), &data[..])
                    .unwrap();
            }
        }
        b.into_inner().unwrap()
    }

    fn stream_all(bytes: &[u8], options: &ReadOptions) -> Result<Vec<StreamSample>> {
        let mut out = Vec::new();
        read_samples("mem.tar", bytes, options, |s| {
            out.push(s);
            true
        })?;
        Ok(out)
    }

    #[test]
    fn oversized_extension_headers_are_refused_before_being_read() {
        let mut bytes = gnu_header(b"././@LongLink", 3 << 20, ::tar::EntryType::GNULongName);
        bytes.extend(std::iter::repeat_n(b'a', 3 << 20));
        pad(&mut bytes);
        bytes.extend(gnu_header(b"x.jpg", 1, ::tar::EntryType::Regular));
        bytes.push(1);
        pad(&mut bytes);
        bytes.extend([0u8; 1024]);
        let options = ReadOptions {
            max_member_bytes: 1 << 30,
            wanted: None,
        };
        let e = stream_all(&bytes, &options).unwrap_err().to_string();
        assert!(
            e.contains("mem.tar") && e.contains("extension headers") && e.contains("byte offset 0"),
            "{e}"
        );
    }

    /// A shard cut inside a member's data keeps every whole sample before the damage, the last
    /// one included (it used to be emitted only when a next sample started), and drops the
    /// sample the damage is in.
    #[test]
    fn a_damaged_shard_keeps_every_whole_sample_before_the_damage() {
        let valid = shard(4);
        let whole = readable_prefix("mem.tar", &valid[..], 1 << 20);
        assert!(whole.1.is_none() && whole.0.len() == 4, "{whole:?}");
        let keys = |n: usize| {
            whole.0[..n]
                .iter()
                .map(|s| s.key.clone())
                .collect::<Vec<_>>()
        };
        for (sample, ext, kept) in [(2, "jpg", 2), (2, "cls", 2), (3, "jpg", 3)] {
            let member = whole.0[sample]
                .members
                .iter()
                .find(|m| m.ext == ext)
                .unwrap();
            // Cut where the member's data starts: its header is whole, its data missing.
            let cut = &valid[..member.offset as usize];
            let (samples, error) = readable_prefix("mem.tar", cut, 1 << 20);
            let error = error.expect("a cut shard is damaged").to_string();
            assert!(error.contains("cut short"), "{error}");
            let got: Vec<_> = samples.iter().map(|s| s.key.clone()).collect();
            // Sample 2's jpg cut: samples 0 and 1 are whole. Its cls cut: sample 2 is the
            // damaged one, its jpg kept nowhere. Sample 3's jpg cut: 0 to 2 are whole.
            assert_eq!(got, keys(kept), "cut in sample {sample}'s {ext}");
        }
        // Cut inside the header of sample 3's jpg: whose member that is cannot be known, so
        // sample 2, being gathered, goes with the damage.
        let jpg = whole.0[3].members.iter().find(|m| m.ext == "jpg").unwrap();
        let (samples, error) =
            readable_prefix("mem.tar", &valid[..jpg.offset as usize - 400], 1 << 20);
        assert!(error.is_some());
        let got: Vec<_> = samples.iter().map(|s| s.key.clone()).collect();
        assert_eq!(got, keys(2));
    }

    /// Streaming and the indexed scan agree on every input: both fail, or both give the same
    /// samples at the same offsets. Run over many corruptions of a valid shard (a small,
    /// deterministic fuzz); neither may panic, and scanned members lie inside the input.
    #[test]
    fn streaming_and_scanning_agree_on_corrupted_shards() {
        let valid = shard(4);
        let options = ReadOptions {
            max_member_bytes: 1 << 20,
            wanted: None,
        };
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut both_ok = 0;
        for round in 0..1500 {
            let mut bytes = valid.clone();
            match round % 3 {
                0 => {
                    let at = next() as usize % bytes.len();
                    bytes[at] = next() as u8;
                }
                1 => bytes.truncate(next() as usize % bytes.len()),
                _ => {
                    // Corrupt a size or type field of some header.
                    let block = (next() as usize % (bytes.len() / 512)) * 512;
                    let at = block + [124, 130, 135, 156][next() as usize % 4];
                    bytes[at] = b"0123456789Lx\0 7"[next() as usize % 15];
                }
            }
            let scanned = scan_members("mem.tar", &bytes);
            let streamed = stream_all(&bytes, &options);
            match (&scanned, &streamed) {
                (Ok(a), Ok(b)) => {
                    both_ok += 1;
                    assert_eq!(a.len(), b.len(), "round {round}");
                    for (x, y) in a.iter().zip(b) {
                        assert_eq!((&x.key, x.offset), (&y.key, y.offset), "round {round}");
                        for (m, n) in x.members.iter().zip(&y.members) {
                            assert!(m.offset + m.size <= bytes.len() as u64);
                            let data = &bytes[m.offset as usize..(m.offset + m.size) as usize];
                            assert_eq!((&m.ext, data), (&n.ext, &n.data[..]), "round {round}");
                        }
                    }
                }
                (Err(_), Err(_)) => {}
                _ => panic!("round {round}: scan {scanned:?} but stream {streamed:?}"),
            }
        }
        // The corruptions are not all fatal (a flipped data byte is fine): both paths are
        // exercised.
        assert!(both_ok > 100 && both_ok < 1400, "{both_ok}");
    }
}
