//! Progress bar and statistics printing.

use std::io::Write;
use std::time::Instant;

use stoker_core::Stats;

/// A one-line progress bar on stderr, redrawn at most every 100 ms.
pub(crate) struct Progress {
    label: String,
    total: usize,
    done: usize,
    samples: usize,
    start: Instant,
    last_draw: Option<Instant>,
}

impl Progress {
    pub(crate) fn new(label: impl Into<String>, total: usize) -> Progress {
        Progress {
            label: label.into(),
            total,
            done: 0,
            samples: 0,
            start: Instant::now(),
            last_draw: None,
        }
    }

    pub(crate) fn advance(&mut self, samples: usize) {
        self.done += 1;
        self.samples += samples;
        let due = self
            .last_draw
            .is_none_or(|t| t.elapsed().as_millis() >= 100);
        if due || self.done == self.total {
            self.draw();
        }
    }

    fn draw(&mut self) {
        const WIDTH: usize = 30;
        let filled = (self.done * WIDTH).checked_div(self.total).unwrap_or(WIDTH);
        let rate = self.samples as f64 / self.start.elapsed().as_secs_f64().max(1e-9);
        eprint!(
            "\r{} [{}{}] {}/{} batches  {:.0} samples/s ",
            self.label,
            "#".repeat(filled),
            ".".repeat(WIDTH - filled),
            self.done,
            self.total,
            rate
        );
        if self.done == self.total {
            eprintln!();
        }
        let _ = std::io::stderr().flush();
        self.last_draw = Some(Instant::now());
    }
}

pub(crate) fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

pub(crate) fn print_stats(s: &Stats) {
    println!(
        "delivered      {} batches, {} samples ({} replaced under on_error=skip)",
        s.batches, s.samples, s.samples_skipped
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
    if s.slabs_pinned + s.pin_failures > 0 {
        println!(
            "pinned slabs   {} locked, {} fell back to pageable (RLIMIT_MEMLOCK)",
            s.slabs_pinned, s.pin_failures
        );
    }
}
