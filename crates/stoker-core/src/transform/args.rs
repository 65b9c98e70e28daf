//! The arguments of one term of a spec, `op(a, b, key=1,2,3)`: positional and named, shared by
//! the operations (`spec`) and the `fields(...)` term (`roles`).

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
