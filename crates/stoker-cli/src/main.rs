//! The `stoker` command: a demo of the loader and side-by-side benchmarks.

mod bench;
mod demo;
mod doctor;
mod photos;
mod report;

use std::process::ExitCode;

const USAGE: &str = "\
usage:
  stoker demo [--images ROOT] [--epochs N] [--batch-size N] [--workers N|auto] [--per-class N]
              [--step-ms N]
      The ImageNet training pipeline (random_resized_crop(224) | hflip | normalize) on a folder
      of class subfolders of JPEGs: two epochs with a progress bar, each batch held for a
      simulated training step (default 30 ms), then throughput and wait statistics. Without
      --images it builds an ImageNet-like folder from real photographs.
  stoker bench images [ROOT] [--epochs N] [--batch-size N] [--workers N|auto] [--per-class N]
      That pipeline beside decode-only throughput on the same files, measured in the same run.
  stoker bench npy [--samples N] [--batch-size N] [--epochs N] [--workers N|auto] [--path FILE]
      Shuffled uint8 [N,3,224,224] batches from an npy file beside single-thread memcpy
      bandwidth, measured in the same run.
";

/// `--key value` pairs after the subcommand words.
pub(crate) struct Args {
    pairs: Vec<(String, String)>,
}

impl Args {
    fn parse(rest: &[String]) -> Result<Args, String> {
        let mut pairs = Vec::new();
        let mut it = rest.iter();
        while let Some(flag) = it.next() {
            let key = flag
                .strip_prefix("--")
                .ok_or_else(|| format!("unexpected argument `{flag}`"))?;
            let value = it.next().ok_or_else(|| format!("--{key} needs a value"))?;
            pairs.push((key.to_owned(), value.clone()));
        }
        Ok(Args { pairs })
    }

    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub(crate) fn num(&self, key: &str, default: usize) -> Result<usize, String> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| format!("--{key}: `{v}` is not a number")),
        }
    }

    /// Fails on flags the command does not know, so typos do not pass silently.
    pub(crate) fn only(&self, known: &[&str]) -> Result<(), String> {
        match self
            .pairs
            .iter()
            .find(|(k, _)| !known.contains(&k.as_str()))
        {
            Some((k, _)) => Err(format!("unknown flag --{k}")),
            None => Ok(()),
        }
    }
}

fn run(argv: &[String]) -> Result<(), String> {
    match argv {
        [cmd, rest @ ..] if cmd == "demo" => demo::run(&Args::parse(rest)?),
        [cmd, what, rest @ ..] if cmd == "bench" && what == "npy" => {
            bench::npy(&Args::parse(rest)?)
        }
        [cmd, what, root, rest @ ..]
            if cmd == "bench" && what == "images" && !root.starts_with("--") =>
        {
            bench::images(Some(root), &Args::parse(rest)?)
        }
        [cmd, what, rest @ ..] if cmd == "bench" && what == "images" => {
            bench::images(None, &Args::parse(rest)?)
        }
        // Local wiring of `stoker doctor` until the CLI moves to clap (see doctor::DoctorArgs).
        [cmd, rest @ ..] if cmd == "doctor" => {
            use clap::Parser;
            #[derive(clap::Parser)]
            #[command(name = "stoker doctor")]
            struct Doctor {
                #[command(flatten)]
                args: doctor::DoctorArgs,
            }
            let parsed = Doctor::try_parse_from(
                std::iter::once("stoker doctor").chain(rest.iter().map(String::as_str)),
            )
            .map_err(|e| e.to_string())?;
            doctor::run(&parsed.args)
        }
        [cmd, ..] if cmd == "-h" || cmd == "--help" || cmd == "help" => {
            print!("{USAGE}");
            Ok(())
        }
        _ => Err(format!("unknown command\n{USAGE}")),
    }
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    match run(&argv) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stoker: {e}");
            ExitCode::FAILURE
        }
    }
}
