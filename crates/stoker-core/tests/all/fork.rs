//! A process that forks after making a loader: the child gets a clear error from every call that
//! needs the loader's threads (which exist in the parent only), never a hang; dropping the loader
//! and releasing its batches in the child return; a loader made in the child works; the parent
//! goes on as if nothing happened.
//!
//! Each test forks this (multi-threaded) test process. The child reports through a pipe and
//! `_exit`s; it prints nothing, since another test's thread may hold the output locks at the
//! moment of the fork. A child that hangs is killed, and the test fails saying so. Ignored by a
//! plain `cargo test`, and run by the test command in a process of their own (`--ignored fork::`):
//! a fork copies whatever the other tests' threads hold.

use std::fs;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::{counting_source, options};
use stoker_core::testing::{counting_indices, FakeDevice};
use stoker_core::{
    DType, ErrorKind, IterableSource, Loader, LoaderOptions, SampleStream, SampleWriter,
    SourceSpec, StreamInfo,
};

/// Longer than any child here needs by far; reached only by a child that hangs.
const HANG_LIMIT: Duration = Duration::from_secs(120);

/// Runs `child` in a forked child process; returns what it returned (a panic becomes its
/// message). Fails the test if the child does not end within [`HANG_LIMIT`].
fn in_child(child: impl FnOnce() -> Result<(), String>) -> Result<(), String> {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a writable array of two ints, as pipe(2) requires.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
    let [read_end, write_end] = fds;
    // SAFETY: fork has no preconditions; the child only runs `child`, writes to the pipe and
    // leaves with `_exit` (no atexit handlers, no destructors of the parent's statics).
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let outcome = catch_unwind(AssertUnwindSafe(child)).unwrap_or_else(|panic| {
            Err(panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "panic".into()))
        });
        let (code, message) = match outcome {
            Ok(()) => (0, String::new()),
            Err(m) => (1, m),
        };
        // SAFETY: `write_end` is this process's open pipe; the buffer is `message`'s bytes.
        unsafe {
            libc::write(write_end, message.as_ptr().cast(), message.len());
            libc::_exit(code);
        }
    }
    // SAFETY: closing the parent's copy of the write end, opened above.
    unsafe { libc::close(write_end) };
    let started = Instant::now();
    let mut status = 0;
    loop {
        // SAFETY: `pid` is our child; `status` is a writable int.
        let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        assert!(done >= 0, "waitpid: {}", std::io::Error::last_os_error());
        if done == pid {
            break;
        }
        if started.elapsed() > HANG_LIMIT {
            // SAFETY: killing and reaping our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
                libc::close(read_end);
            }
            panic!("the forked child hung (killed after {HANG_LIMIT:?})");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut message = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: reading into `buf`, a writable buffer of its length, from our pipe.
        let n = unsafe { libc::read(read_end, buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            break;
        }
        message.extend_from_slice(&buf[..n as usize]);
    }
    // SAFETY: our pipe's read end, closed once.
    unsafe { libc::close(read_end) };
    assert!(
        libc::WIFEXITED(status),
        "the child did not exit normally (status {status:#x})"
    );
    match libc::WEXITSTATUS(status) {
        0 => Ok(()),
        _ => Err(String::from_utf8_lossy(&message).into_owned()),
    }
}

/// The child's own copy of `value`, to drop there (the parent keeps and drops its own).
///
/// Only inside [`in_child`]'s closure: the child `_exit`s without returning to the frames that own
/// `value`, so nothing there uses or drops it again, and the copy is its only owner.
fn child_copy<T>(value: &T) -> T {
    // SAFETY: see above: in the child, `value`'s owner never touches it again.
    unsafe { std::ptr::read(value) }
}

/// `Ok` when `result` failed with `Unsupported` and the fork message naming `parent`.
fn fork_error<T>(what: &str, result: stoker_core::Result<T>, parent: u32) -> Result<(), String> {
    match result {
        Ok(_) => Err(format!("{what} succeeded in the child")),
        Err(e) if e.kind() != ErrorKind::Unsupported => Err(format!(
            "{what}: {:?} instead of Unsupported: {e}",
            e.kind()
        )),
        Err(e) => {
            let m = e.to_string();
            let expected = format!("created in process {parent} before fork()");
            if m.contains(&expected) && m.contains("create a new loader after the fork") {
                Ok(())
            } else {
                Err(format!("{what}: the message does not say what to do: {m}"))
            }
        }
    }
}

fn check(what: &str, ok: bool) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(format!("{what}: not as expected"))
    }
}

/// Every sample index of one epoch, in delivery order.
fn epoch_indices(l: &mut Loader) -> stoker_core::Result<Vec<i64>> {
    let mut out = Vec::new();
    while let Some(b) = l.next()? {
        out.extend(counting_indices(&b));
    }
    Ok(out)
}

#[test]
#[ignore = "forks the test process, copying whatever other tests' threads hold: run apart, `cargo test --test all -- --ignored fork::`"]
fn a_loader_made_before_fork_fails_in_the_child_and_goes_on_in_the_parent() {
    let trace = std::env::temp_dir().join(format!("stoker-fork-{}.json", std::process::id()));
    let mut o = options(
        counting_source(40),
        &[("batch_size", "4"), ("num_workers", "2"), ("seed", "3")],
    );
    o.set("trace", &trace.to_string_lossy()).unwrap();
    let mut loader = Loader::new(&o).unwrap();
    // Held across the fork: released in the child (and, separately, in the parent).
    let held = loader.next().unwrap().unwrap();
    let parent = std::process::id();

    in_child(|| {
        fork_error("next", loader.next(), parent)?;
        fork_error("set_epoch", loader.set_epoch(1), parent)?;
        fork_error("try_stats", loader.try_stats(), parent)?;
        fork_error(
            "stats_handle().try_snapshot",
            loader.stats_handle().try_snapshot(),
            parent,
        )?;
        fork_error("write_trace", loader.write_trace(), parent)?;
        fork_error("arena().acquire", loader.arena().acquire(64), parent)?;
        // What the loader knows by itself still answers.
        check("epoch", loader.epoch() == 0)?;
        check("position", loader.position() == 1)?;
        check(
            "save_state",
            loader.save_state().starts_with("stoker-state"),
        )?;
        check("batch contents", counting_indices(&held).len() == 4)?;
        // Closing, releasing the batch and dropping the loader all return.
        loader.closer().close();
        drop(child_copy(&held));
        drop(child_copy(&loader));
        Ok(())
    })
    .unwrap();

    // The parent's loader goes on where it was: the rest of the epoch, then the next one.
    let mut seen = counting_indices(&held);
    drop(held);
    seen.extend(epoch_indices(&mut loader).unwrap());
    seen.sort_unstable();
    assert_eq!(seen, (0..40).collect::<Vec<_>>());
    assert_eq!(epoch_indices(&mut loader).unwrap().len(), 40);
    let stats = loader.try_stats().unwrap();
    assert_eq!(stats.batches, 20);
    drop(loader);
    // The trace is the parent's: written once, by the parent's drop.
    assert!(fs::metadata(&trace).unwrap().len() > 0);
    let _ = fs::remove_file(&trace);
}

#[test]
#[ignore = "forks the test process, copying whatever other tests' threads hold: run apart, `cargo test --test all -- --ignored fork::`"]
fn a_loader_made_in_the_child_works_and_indexes_without_the_parents_pool() {
    // An image folder is indexed with rayon: the parent's global pool is started here, and its
    // threads do not exist in the child.
    let root = image_folder("child");
    let mut parent_loader = image_loader(&root);
    let parent_batches = count_batches(&mut parent_loader).unwrap();
    assert_eq!(parent_batches, 3);
    let parent = std::process::id();

    in_child(|| {
        let mut mine = image_loader(&root);
        check("batches per epoch", count_batches(&mut mine)? == 3)?;
        check("second epoch", count_batches(&mut mine)? == 3)?;
        mine.try_stats().map_err(|e| e.to_string())?;
        let mut counting = Loader::new(&options(
            counting_source(10),
            &[("batch_size", "2"), ("num_workers", "2")],
        ))
        .map_err(|e| e.to_string())?;
        let mut seen = epoch_indices(&mut counting).map_err(|e| e.to_string())?;
        seen.sort_unstable();
        check("counting epoch", seen == (0..10).collect::<Vec<_>>())?;
        // The parent's loader is still the parent's.
        fork_error("the parent's loader", parent_loader.next(), parent)?;
        drop(child_copy(&parent_loader));
        Ok(())
    })
    .unwrap();

    assert_eq!(count_batches(&mut parent_loader).unwrap(), 3);
    let _ = fs::remove_dir_all(&root);
}

#[test]
#[ignore = "forks the test process, copying whatever other tests' threads hold: run apart, `cargo test --test all -- --ignored fork::`"]
fn a_streaming_loader_made_before_fork_fails_in_the_child() {
    let mut o = LoaderOptions::new().with_source(SourceSpec::Iterable(Arc::new(Counter(30))));
    for (k, v) in [("batch_size", "5"), ("num_workers", "2")] {
        o.set(k, v).unwrap();
    }
    let mut loader = Loader::new(&o).unwrap();
    let first = loader.next().unwrap().unwrap();
    let parent = std::process::id();

    in_child(|| {
        fork_error("next", loader.next(), parent)?;
        fork_error("try_stats", loader.try_stats(), parent)?;
        drop(child_copy(&first));
        drop(child_copy(&loader));
        Ok(())
    })
    .unwrap();

    drop(first);
    let mut batches = 1;
    while loader.next().unwrap().is_some() {
        batches += 1;
    }
    assert_eq!(batches, 6);
}

#[test]
#[ignore = "forks the test process, copying whatever other tests' threads hold: run apart, `cargo test --test all -- --ignored fork::`"]
fn a_device_loader_made_before_fork_fails_in_the_child() {
    let fake = FakeDevice::new(0).unwrap();
    let o = options(
        counting_source(24),
        &[
            ("batch_size", "4"),
            ("num_workers", "1"),
            ("prefetch_factor", "2"),
        ],
    );
    let mut loader = Loader::with_device_backend(&o, fake.clone()).unwrap();
    let held = loader.next().unwrap().unwrap();
    held.synchronize().unwrap();
    let parent = std::process::id();

    in_child(|| {
        fork_error("next", loader.next(), parent)?;
        fork_error("set_epoch", loader.set_epoch(2), parent)?;
        fork_error("synchronize", held.synchronize(), parent)?;
        drop(child_copy(&held));
        drop(child_copy(&loader));
        // The fake device's own thread is the parent's too: it is not dropped here (the real
        // driver has no thread of stoker's).
        Ok(())
    })
    .unwrap();

    drop(held);
    let mut batches = 1;
    while let Some(b) = loader.next().unwrap() {
        b.synchronize().unwrap();
        batches += 1;
    }
    assert_eq!(batches, 6);
}

/// An iterable source of `n` samples, each a label.
struct Counter(usize);

struct CounterStream {
    next: usize,
    end: usize,
}

impl IterableSource for Counter {
    fn open(
        &self,
        _info: &StreamInfo,
        _resume: Option<&str>,
    ) -> Result<Box<dyn SampleStream>, String> {
        Ok(Box::new(CounterStream {
            next: 0,
            end: self.0,
        }))
    }
}

impl SampleStream for CounterStream {
    fn next(&mut self, out: &mut SampleWriter<'_>) -> Result<bool, String> {
        if self.next == self.end {
            return Ok(false);
        }
        out.put_tensor("x", DType::I64, &[1], &(self.next as i64).to_ne_bytes())?;
        out.put_label(self.next as i64)?;
        self.next += 1;
        Ok(true)
    }
}

/// A folder of 6 fixture photos in two classes.
fn image_folder(name: &str) -> PathBuf {
    let root = std::env::temp_dir().join(format!("stoker-fork-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&root);
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/images");
    for (rel, fixture) in [
        ("a/1.jpg", "photo_444.jpg"),
        ("a/2.jpg", "photo_baseline.jpg"),
        ("a/3.jpg", "photo_gray.jpg"),
        ("b/1.jpg", "photo_progressive.jpg"),
        ("b/2.jpg", "photo_444.jpg"),
        ("b/3.jpg", "tiny_1x1.jpg"),
    ] {
        let path = root.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::copy(data.join(fixture), path).unwrap();
    }
    root
}

fn image_loader(root: &Path) -> Loader {
    let mut o = LoaderOptions::new();
    for (k, v) in [
        (
            "source",
            format!("image_folder:{}", root.display()).as_str(),
        ),
        ("transform", "resize(16)|center_crop(16)"),
        ("batch_size", "2"),
        ("num_workers", "2"),
    ] {
        o.set(k, v).unwrap_or_else(|e| panic!("{k}={v}: {e}"));
    }
    Loader::new(&o).unwrap()
}

fn count_batches(l: &mut Loader) -> Result<usize, String> {
    let mut n = 0;
    while l.next().map_err(|e| e.to_string())?.is_some() {
        n += 1;
    }
    Ok(n)
}
