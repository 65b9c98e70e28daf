//! Progress bars and statistics printing.

use std::io::IsTerminal;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use stoker_core::Stats;

/// Progress over a known number of batches. On a terminal (stdout and stderr both), an
/// indicatif bar on stderr with the sample rate; otherwise (output piped or logged) one plain
/// line on stderr when the run ends, so that logs carry no carriage returns or escape codes.
pub(crate) struct Progress {
    bar: Option<ProgressBar>,
    label: String,
    total: usize,
    done: usize,
    samples: usize,
    start: Instant,
}

impl Progress {
    pub(crate) fn new(label: impl Into<String>, total: usize) -> Progress {
        let label = label.into();
        let interactive = std::io::stdout().is_terminal() && std::io::stderr().is_terminal();
        let bar = interactive.then(|| {
            // The template is a constant; should indicatif ever reject it, the default bar
            // still shows progress.
            let style = ProgressStyle::with_template(
                "{prefix} [{bar:30}] {pos}/{len} batches  {msg} {elapsed_precise}",
            )
            .map(|s| s.progress_chars("#>."))
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            let bar = ProgressBar::new(total as u64).with_style(style);
            bar.set_prefix(label.clone());
            bar
        });
        Progress {
            bar,
            label,
            total,
            done: 0,
            samples: 0,
            start: Instant::now(),
        }
    }

    /// One more batch of `samples` samples.
    pub(crate) fn advance(&mut self, samples: usize) {
        self.done += 1;
        self.samples += samples;
        if let Some(bar) = &self.bar {
            // indicatif redraws at most 20 times a second, whatever the batch rate.
            bar.set_message(format!("{:.0} samples/s", self.rate()));
            bar.inc(1);
        }
        if self.done == self.total {
            self.finish();
        }
    }

    fn rate(&self) -> f64 {
        self.samples as f64 / self.start.elapsed().as_secs_f64().max(1e-9)
    }

    fn finish(&mut self) {
        match self.bar.take() {
            Some(bar) => bar.finish(),
            None => eprintln!(
                "{}: {}/{} batches  {:.0} samples/s  {:.1} s",
                self.label,
                self.done,
                self.total,
                self.rate(),
                self.start.elapsed().as_secs_f64()
            ),
        }
    }
}

impl Drop for Progress {
    /// A run that stopped early (an error, a short epoch) still leaves its last state visible.
    fn drop(&mut self) {
        if self.done == self.total {
            return; // finished in advance()
        }
        match self.bar.take() {
            Some(bar) => bar.abandon(),
            None if self.done > 0 => self.finish(),
            None => {}
        }
    }
}

pub(crate) fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

pub(crate) fn print_stats(s: &Stats) {
    // Replacements happen under on_error=skip only: a count of none is not said.
    let replaced = match s.samples_skipped {
        0 => String::new(),
        n => format!(" ({n} bad ones replaced under on_error=skip)"),
    };
    println!(
        "delivered      {} batches, {} samples{replaced}",
        s.batches, s.samples
    );
    println!(
        "throughput     {:.0} samples/s over {:.2} s",
        s.samples as f64 / (s.elapsed_ns as f64 / 1e9).max(1e-9),
        s.elapsed_ns as f64 / 1e9
    );
    println!(
        "wait per batch p50 {:.2} ms  p95 {:.2} ms  max {:.2} ms  total {:.1} ms",
        ms(s.wait_ns_p50),
        ms(s.wait_ns_p95),
        ms(s.wait_ns_max),
        ms(s.wait_ns_total)
    );
    println!(
        "readiness      {:.3}  (1 - waited/elapsed: the share of time the consumer was not starved)",
        s.readiness
    );
    println!("worker busy    {:.3}", s.worker_busy);
    println!(
        "in flight      {} batches at most now, of a cap of {}; batch memory {:.1} MiB now, \
         {:.1} MiB at most, {} page faults taken by it",
        s.in_flight_depth,
        s.in_flight_cap,
        s.batch_memory_bytes as f64 / (1 << 20) as f64,
        s.batch_memory_peak_bytes as f64 / (1 << 20) as f64,
        s.page_faults
    );
    let decoded = s.decoded_zune + s.decoded_turbo + s.decoded_turbo_region;
    if decoded > 0 {
        println!(
            "decoded        {} crop regions by libjpeg-turbo ({} of them DCT-scaled), {} whole by \
             libjpeg-turbo, {} whole by zune",
            s.decoded_turbo_region, s.decoded_turbo_scaled, s.decoded_turbo, s.decoded_zune
        );
    }
    if s.slabs_pinned + s.pin_failures > 0 {
        println!(
            "pinned slabs   {} locked, {} fell back to pageable (RLIMIT_MEMLOCK)",
            s.slabs_pinned, s.pin_failures
        );
    }
}
