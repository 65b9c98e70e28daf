//! Shard URLs: which store serves them, the name they are shown under (credentials removed), and
//! the stable name of their cache file.

use crate::error::{Error, Result};

/// The stores a shard URL can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scheme {
    S3,
    Gcs,
    Azure,
    Http,
}

/// A parsed remote shard URL.
#[derive(Clone, Debug)]
pub(crate) struct ShardUrl {
    /// The URL as written (may carry credentials: never shown).
    pub(crate) full: url::Url,
    pub(crate) scheme: Scheme,
    /// The URL without user info, query or fragment: what errors, stats and traces show.
    pub(crate) shown: String,
    /// Secrets the URL carries (password, query string), masked in any message that quotes them.
    secrets: Vec<String>,
}

impl ShardUrl {
    /// Parses `text` (`s3://`, `gs://`, `az://`, `http://`, `https://`).
    pub(crate) fn parse(text: &str) -> Result<ShardUrl> {
        let full = url::Url::parse(text).map_err(|e| {
            Error::InvalidArgument(format!(
                "shard URL `{}`: {e}",
                super::shown_without_credentials(text)
            ))
        })?;
        let scheme = match full.scheme() {
            "s3" | "s3a" => Scheme::S3,
            "gs" => Scheme::Gcs,
            "az" | "abfs" | "abfss" | "azure" => Scheme::Azure,
            "http" | "https" => Scheme::Http,
            other => {
                return Err(Error::Unsupported(format!(
                    "shard URL `{}`: unsupported scheme `{other}` (s3, gs, az, http, https)",
                    redact_url(&full)
                )))
            }
        };
        if full.host_str().is_none_or(str::is_empty) {
            return Err(Error::InvalidArgument(format!(
                "shard URL `{}`: no bucket or host",
                redact_url(&full)
            )));
        }
        let mut secrets = Vec::new();
        if let Some(password) = full.password() {
            secrets.push(password.to_owned());
        }
        if let Some(query) = full.query() {
            if !query.is_empty() {
                secrets.push(query.to_owned());
            }
        }
        Ok(ShardUrl {
            shown: redact_url(&full),
            full,
            scheme,
            secrets,
        })
    }

    /// The object's path within its store (no leading `/`, percent-decoding left to
    /// `object_store`'s path type).
    pub(crate) fn object_path(&self) -> &str {
        self.full.path().trim_start_matches('/')
    }

    /// `message` with this URL's secrets and any environment credential masked.
    pub(crate) fn scrub(&self, message: &str) -> String {
        let mut out = message.to_owned();
        for secret in self.secrets.iter().chain(env_secrets().iter()) {
            if secret.len() >= 4 {
                out = out.replace(secret.as_str(), "REDACTED");
            }
        }
        out
    }

    /// The cache file's name: a stable hash of the URL as shown (so the same object gets the
    /// same file in every process and every run) and the object's own file name (so a person
    /// looking at the cache can tell the shards apart).
    pub(crate) fn cache_name(&self) -> String {
        let base = self
            .object_path()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                    c
                } else {
                    '_'
                }
            })
            .take(96)
            .collect::<String>();
        format!(
            "{:016x}-{}",
            crate::hash::Fnv::of(self.shown.as_bytes()),
            base
        )
    }
}

/// The URL without user info, query or fragment.
pub(crate) fn redact_url(url: &url::Url) -> String {
    let mut shown = url.clone();
    // Both fail only for URLs that cannot have user info (no host), which then have none.
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    let had_query = url.query().is_some_and(|q| !q.is_empty());
    shown.set_query(None);
    shown.set_fragment(None);
    let mut text = shown.to_string();
    if had_query {
        text.push_str("?REDACTED");
    }
    text
}

/// Credentials the stores read from the environment, masked in messages (an error body from a
/// misconfigured proxy could echo a header).
fn env_secrets() -> Vec<String> {
    const KEYS: &[&str] = &[
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_ACCESS_KEY_ID",
        "AZURE_STORAGE_ACCOUNT_KEY",
        "AZURE_STORAGE_ACCESS_KEY",
        "AZURE_STORAGE_SAS_KEY",
        "AZURE_STORAGE_TOKEN",
        "AZURE_CLIENT_SECRET",
        "GOOGLE_SERVICE_ACCOUNT_KEY",
    ];
    KEYS.iter()
        .filter_map(|k| std::env::var(k).ok())
        .filter(|v| !v.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_and_paths() {
        let u = ShardUrl::parse("s3://bucket/prefix/train-0001.tar").unwrap();
        assert_eq!(u.scheme, Scheme::S3);
        assert_eq!(u.object_path(), "prefix/train-0001.tar");
        assert_eq!(u.shown, "s3://bucket/prefix/train-0001.tar");
        assert_eq!(ShardUrl::parse("gs://b/x.tar").unwrap().scheme, Scheme::Gcs);
        assert_eq!(
            ShardUrl::parse("az://container/x.tar").unwrap().scheme,
            Scheme::Azure
        );
        assert_eq!(
            ShardUrl::parse("https://h:8080/d/x.tar").unwrap().scheme,
            Scheme::Http
        );
        let err = ShardUrl::parse("ftp://h/x.tar").unwrap_err().to_string();
        assert!(err.contains("unsupported scheme `ftp`"), "{err}");
        assert!(ShardUrl::parse("s3:///x.tar").is_err());
    }

    #[test]
    fn credentials_never_shown() {
        let u = ShardUrl::parse(
            "https://alice:hunter22@host.example/data/a.tar?X-Amz-Signature=abcdef123456#frag",
        )
        .unwrap();
        assert_eq!(u.shown, "https://host.example/data/a.tar?REDACTED");
        let scrubbed = u.scrub(
            "GET https://alice:hunter22@host.example/data/a.tar?X-Amz-Signature=abcdef123456 failed",
        );
        assert!(!scrubbed.contains("hunter22"), "{scrubbed}");
        assert!(!scrubbed.contains("abcdef123456"), "{scrubbed}");
        assert!(!u.cache_name().contains("hunter22"));
        let bad = super::super::shown_without_credentials("https://bob:pw@host/x?token=t");
        assert_eq!(bad, "https://host/x");
    }

    #[test]
    fn cache_names_are_stable_and_distinct() {
        let a = ShardUrl::parse("s3://b/p/train-0.tar").unwrap();
        let b = ShardUrl::parse("s3://b/q/train-0.tar").unwrap();
        assert_ne!(a.cache_name(), b.cache_name());
        assert!(a.cache_name().ends_with("-train-0.tar"));
        // The value is pinned: it names files other processes and other runs look for.
        assert_eq!(crate::hash::Fnv::of(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(crate::hash::Fnv::of(b"a"), 0xaf63_dc4c_8601_ec8c);
        // Credentials do not change where a shard is cached.
        let c = ShardUrl::parse("https://u:p@h/x.tar").unwrap();
        let d = ShardUrl::parse("https://h/x.tar").unwrap();
        assert_eq!(c.cache_name(), d.cache_name());
    }
}
