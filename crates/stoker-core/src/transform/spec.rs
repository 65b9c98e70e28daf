//! The spec language: `random_resized_crop(224) | hflip | normalize(imagenet)` parsed into
//! [`Op`]s, each validated with an error naming the operation and the argument.

/// ImageNet's channel means and standard deviations (torchvision's reference scripts).
pub const IMAGENET_MEAN: [f64; 3] = [0.485, 0.456, 0.406];
pub const IMAGENET_STD: [f64; 3] = [0.229, 0.224, 0.225];

/// One operation of a pipeline spec.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// Shorter side to this many pixels, aspect ratio kept.
    ResizeShorter(usize),
    /// Exactly this size.
    Resize {
        height: usize,
        width: usize,
    },
    CenterCrop {
        height: usize,
        width: usize,
    },
    RandomResizedCrop {
        height: usize,
        width: usize,
        scale: (f64, f64),
        ratio: (f64, f64),
    },
    HFlip {
        p: f64,
    },
    Normalize {
        mean: [f64; 3],
        std: [f64; 3],
    },
}

/// Parses a pipeline spec: operations separated by `|`, each `name` or `name(args)`, with
/// positional arguments first and then `key=value` ones (a value may hold commas:
/// `mean=0.5,0.5,0.5`). Numbers may be written as fractions (`3/4`), ranges as `a:b`.
pub fn parse(spec: &str) -> Result<Vec<Op>, String> {
    let mut ops = Vec::new();
    for part in spec.split('|').map(str::trim) {
        if part.is_empty() {
            return Err(format!("empty operation in `{spec}`"));
        }
        let (name, args) = match part.find('(') {
            Some(open) => {
                let inner = part[open + 1..]
                    .strip_suffix(')')
                    .ok_or_else(|| format!("`{part}`: missing closing parenthesis"))?;
                (part[..open].trim(), split_args(inner))
            }
            None => (part, Args::default()),
        };
        let op = parse_op(name, &args).map_err(|e| format!("`{part}`: {e}"))?;
        ops.push(op);
    }
    Ok(ops)
}

#[derive(Default, Debug)]
struct Args {
    positional: Vec<String>,
    named: Vec<(String, String)>,
}

impl Args {
    fn named(&self, key: &str) -> Option<&str> {
        self.named
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn check(&self, max_positional: usize, keys: &[&str]) -> Result<(), String> {
        if self.positional.len() > max_positional {
            return Err(format!(
                "takes at most {max_positional} positional argument(s), got {}",
                self.positional.len()
            ));
        }
        for (k, _) in &self.named {
            if !keys.contains(&k.as_str()) {
                return Err(if keys.is_empty() {
                    format!("unknown argument `{k}`")
                } else {
                    format!("unknown argument `{k}` (expected {})", keys.join(", "))
                });
            }
        }
        Ok(())
    }
}

/// Splits `a, b, key=1,2,3, other=x` into positional `[a, b]` and named
/// `[(key, "1,2,3"), (other, x)]`: a token without `=` after a named one continues it.
fn split_args(inner: &str) -> Args {
    let mut args = Args::default();
    for token in inner.split(',').map(str::trim) {
        if let Some((k, v)) = token.split_once('=') {
            args.named.push((k.trim().to_owned(), v.trim().to_owned()));
        } else if let Some((_, v)) = args.named.last_mut() {
            v.push(',');
            v.push_str(token);
        } else if !token.is_empty() || !args.positional.is_empty() {
            args.positional.push(token.to_owned());
        }
    }
    args
}

fn number(s: &str) -> Result<f64, String> {
    let s = s.trim();
    let value = match s.split_once('/') {
        Some((a, b)) => {
            let a: f64 = a
                .trim()
                .parse()
                .map_err(|_| format!("`{s}` is not a number"))?;
            let b: f64 = b
                .trim()
                .parse()
                .map_err(|_| format!("`{s}` is not a number"))?;
            a / b
        }
        None => s.parse().map_err(|_| format!("`{s}` is not a number"))?,
    };
    if value.is_finite() {
        Ok(value)
    } else {
        Err(format!("`{s}` is not a finite number"))
    }
}

fn size(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=65_535).contains(&n) => Ok(n),
        _ => Err(format!("`{s}` is not a size in 1..=65535")),
    }
}

/// `S` or `H, W` from the positional arguments.
fn sizes(args: &Args) -> Result<(usize, usize), String> {
    match args.positional.as_slice() {
        [s] => size(s).map(|s| (s, s)),
        [h, w] => Ok((size(h)?, size(w)?)),
        _ => Err("expected a size S or H, W".into()),
    }
}

fn range(s: &str, what: &str) -> Result<(f64, f64), String> {
    let (a, b) = s
        .split_once(':')
        .ok_or_else(|| format!("{what} `{s}` is not a range a:b"))?;
    let (a, b) = (number(a)?, number(b)?);
    if !(a > 0.0 && a <= b) {
        return Err(format!("{what} `{s}` needs 0 < a <= b"));
    }
    Ok((a, b))
}

fn triple(s: &str, what: &str) -> Result<[f64; 3], String> {
    let values = s.split(',').map(number).collect::<Result<Vec<_>, _>>()?;
    match values.as_slice() {
        [v] => Ok([*v; 3]),
        [a, b, c] => Ok([*a, *b, *c]),
        _ => Err(format!("{what} needs 1 or 3 values, got {}", values.len())),
    }
}

fn parse_op(name: &str, args: &Args) -> Result<Op, String> {
    match name {
        "resize" => {
            args.check(2, &[])?;
            Ok(match args.positional.as_slice() {
                [s] => Op::ResizeShorter(size(s)?),
                [h, w] => Op::Resize {
                    height: size(h)?,
                    width: size(w)?,
                },
                _ => return Err("expected resize(S) or resize(H, W)".into()),
            })
        }
        "center_crop" => {
            args.check(2, &[])?;
            let (height, width) = sizes(args)?;
            Ok(Op::CenterCrop { height, width })
        }
        "random_resized_crop" => {
            args.check(2, &["scale", "ratio"])?;
            let (height, width) = sizes(args)?;
            let scale = match args.named("scale") {
                Some(s) => range(s, "scale")?,
                None => (0.08, 1.0),
            };
            let ratio = match args.named("ratio") {
                Some(s) => range(s, "ratio")?,
                None => (3.0 / 4.0, 4.0 / 3.0),
            };
            Ok(Op::RandomResizedCrop {
                height,
                width,
                scale,
                ratio,
            })
        }
        "hflip" => {
            args.check(1, &["p"])?;
            let p = match (args.positional.first().map(String::as_str), args.named("p")) {
                (Some(_), Some(_)) => return Err("give p once".into()),
                (Some(p), None) | (None, Some(p)) => number(p)?,
                (None, None) => 0.5,
            };
            if !(0.0..=1.0).contains(&p) {
                return Err(format!("p={p} is not a probability in [0, 1]"));
            }
            Ok(Op::HFlip { p })
        }
        "normalize" => {
            if args.positional.len() == 1 && args.positional[0] == "imagenet" {
                args.check(1, &[])?;
                return Ok(Op::Normalize {
                    mean: IMAGENET_MEAN,
                    std: IMAGENET_STD,
                });
            }
            args.check(0, &["mean", "std"])?;
            let mean = triple(args.named("mean").ok_or("needs mean=... and std=..., or imagenet")?, "mean")?;
            let std = triple(args.named("std").ok_or("needs mean=... and std=..., or imagenet")?, "std")?;
            if std.contains(&0.0) {
                return Err("std must not be 0".into());
            }
            Ok(Op::Normalize { mean, std })
        }
        _ => Err(format!(
            "unknown operation `{name}` (known: resize, center_crop, random_resized_crop, hflip, normalize)"
        )),
    }
}
