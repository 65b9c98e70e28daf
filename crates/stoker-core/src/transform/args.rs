//! The arguments of one term of a spec, `op(a, b, key=1,2,3)`: positional and named, shared by
//! the operations (`spec`) and the `fields(...)` term (`roles`), and the parsers of values that
//! several operations take.

use crate::dtype::DType;

#[derive(Default, Debug)]
pub(super) struct Args {
    pub(super) positional: Vec<String>,
    pub(super) named: Vec<(String, String)>,
}

impl Args {
    pub(super) fn named(&self, key: &str) -> Option<&str> {
        self.named
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// These arguments with the positional ones from index `first` on named `names` in turn,
    /// as Python binds torchvision's `ColorJitter(0.4, 0.4)`; more positional arguments than
    /// that, or a name given both ways, is an error.
    pub(super) fn bound(&self, first: usize, names: &[&str]) -> Result<Args, String> {
        let most = first + names.len();
        if self.positional.len() > most {
            return Err(format!(
                "takes at most {most} positional argument(s), got {}",
                self.positional.len()
            ));
        }
        let mut out = Args {
            positional: Vec::new(),
            named: self.named.clone(),
        };
        for (i, value) in self.positional.iter().enumerate() {
            match i.checked_sub(first).map(|k| names[k]) {
                Some(name) if self.named(name).is_some() => {
                    return Err(format!("`{name}` is given both by position and by name"));
                }
                Some(name) => out.named.push((name.to_owned(), value.clone())),
                None => out.positional.push(value.clone()),
            }
        }
        Ok(out)
    }

    pub(super) fn check(&self, max_positional: usize, keys: &[&str]) -> Result<(), String> {
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
pub(super) fn split_args(inner: &str) -> Args {
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

/// A number, `x` or a fraction `a/b`, finite.
pub(super) fn number(s: &str) -> Result<f64, String> {
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

/// `p` given once, positionally or as `p=`, a probability; `default` when absent (the caller
/// checks the argument names).
pub(super) fn probability(args: &Args, default: f64) -> Result<f64, String> {
    let p = match (args.positional.first().map(String::as_str), args.named("p")) {
        (Some(_), Some(_)) => return Err("give p once".into()),
        (Some(p), None) | (None, Some(p)) => number(p)?,
        (None, None) => default,
    };
    if !(0.0..=1.0).contains(&p) {
        return Err(format!("p={p} is not a probability in [0, 1]"));
    }
    Ok(p)
}

/// `fill=V` or `fill=R,G,B` in the image's stored units, default 0: any number here, which the
/// pipeline checks its input type holds ([`check_fill`]).
pub(super) fn fill(args: &Args) -> Result<[f64; 3], String> {
    let Some(v) = args.named("fill") else {
        return Ok([0.0; 3]);
    };
    triple(v, "fill")
}

/// Checks that an image of `dtype` holds every value of `fill`: integers in its range for
/// integer types (torchvision casts a fill to the image's type; a fraction or an overflow there
/// would be silently another value), anything finite for floats.
pub(super) fn check_fill(fill: [f64; 3], dtype: DType) -> Result<(), String> {
    let max = match dtype {
        DType::U8 => 255.0,
        DType::U16 => 65535.0,
        _ => return Ok(()),
    };
    match fill
        .iter()
        .find(|v| v.fract() != 0.0 || !(0.0..=max).contains(*v))
    {
        Some(v) => Err(format!(
            "fill {v} is not a {dtype} value: a {dtype} image's fill is an integer in 0..={max}"
        )),
        None => Ok(()),
    }
}

/// `V` or `R,G,B`: a value for each of three channels.
pub(super) fn triple(s: &str, what: &str) -> Result<[f64; 3], String> {
    let values = s.split(',').map(number).collect::<Result<Vec<_>, _>>()?;
    match values.as_slice() {
        [v] => Ok([*v; 3]),
        [a, b, c] => Ok([*a, *b, *c]),
        _ => Err(format!("{what} needs 1 or 3 values, got {}", values.len())),
    }
}
