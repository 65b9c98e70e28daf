//! Stable hashing: 64-bit FNV-1a, the same in every process, build and Rust release.

use std::fmt::Write as _;

/// 64-bit FNV-1a of everything written to it. Hand-written (a dozen lines) because what it
/// names must not change across Rust versions, which `std`'s hashers do not promise: resume
/// states, cache file names, a source's identity.
pub struct Fnv(u64);

impl Fnv {
    /// A hasher at FNV-1a's offset basis (nothing written yet).
    pub fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    /// Hashes `bytes` in.
    pub fn bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    /// The hash of everything written so far (writing may continue).
    pub fn finish(&self) -> u64 {
        self.0
    }

    /// The hash of `bytes`.
    pub fn of(bytes: &[u8]) -> u64 {
        let mut h = Fnv::new();
        h.bytes(bytes);
        h.finish()
    }

    /// The hash of `value`'s `Debug` text, streamed (no string is built).
    pub fn of_debug(value: &dyn std::fmt::Debug) -> u64 {
        let mut h = Fnv::new();
        // Writing to an Fnv cannot fail.
        let _ = write!(h, "{value:?}");
        h.finish()
    }
}

impl Default for Fnv {
    fn default() -> Self {
        Fnv::new()
    }
}

impl std::fmt::Write for Fnv {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.bytes(s.as_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_is_stable() {
        // FNV-1a's published test vectors: a changed hash would orphan every cache file and
        // refuse every saved resume state.
        assert_eq!(Fnv::of(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(Fnv::of(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(Fnv::of(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
