//! A bounded walk over the compact-Thrift structs of a Parquet file (its footer, page index and
//! page headers), run on their bytes before the `parquet` crate parses them.
//!
//! Written here because neither Thrift reader at hand bounds its work by the input's size. The
//! `parquet` crate (60.1.0) skips a field it does not know by walking it, and its walk takes each
//! boolean of a list as holding no bytes (the compact protocol writes a byte each), so a list's
//! declared count alone sets the time: a 22-byte footer declaring 2^31 booleans took 5.8 s to
//! refuse in a release build, one of 112 bytes 77 s, and a page header is read on every read of
//! its page. Apache Thrift's Rust crate walks bounded but allocates a binary field's declared
//! length before reading it. This walk checks every declared count against the bytes left, so
//! its time is linear in the bytes (every element takes at least one), and nesting is bounded
//! as the crate bounds its skip (64 levels). It checks structure only: the crate still parses
//! and checks the values.

/// How deep structs, lists, sets and maps may nest.
const MAX_DEPTH: u32 = 64;

/// The compact protocol's type codes.
const BOOL_TRUE: u8 = 1;
const BOOL_FALSE: u8 = 2;
const BYTE: u8 = 3;
const I16: u8 = 4;
const I32: u8 = 5;
const I64: u8 = 6;
const DOUBLE: u8 = 7;
const BINARY: u8 = 8;
const LIST: u8 = 9;
const SET: u8 = 10;
const MAP: u8 = 11;
const STRUCT: u8 = 12;
const UUID: u8 = 13;

/// `PageHeader.compressed_page_size` (i32): the bytes of the page after its header.
const COMPRESSED_PAGE_SIZE: i16 = 3;

/// Walks the struct at the start of `bytes`, which begin at byte `at` of the file (for
/// messages); returns its length in bytes, or what is wrong, naming the byte.
pub(crate) fn check_struct(bytes: &[u8], at: u64) -> Result<usize, String> {
    let mut walk = Walk { bytes, pos: 0, at };
    walk.fields(0, None)?;
    Ok(walk.pos)
}

/// Walks the page header at the start of `bytes` (which begin at byte `at` of the file);
/// returns its length and the page's compressed size, if the header has one.
pub(crate) fn check_page_header(bytes: &[u8], at: u64) -> Result<(usize, Option<i64>), String> {
    let mut walk = Walk { bytes, pos: 0, at };
    let size = walk.fields(0, Some(COMPRESSED_PAGE_SIZE))?;
    Ok((walk.pos, size))
}

struct Walk<'a> {
    bytes: &'a [u8],
    /// The next byte to read.
    pos: usize,
    /// Where `bytes` begin in the file.
    at: u64,
}

impl Walk<'_> {
    /// Byte `pos` as the file's offset, for messages.
    fn offset(&self, pos: usize) -> u64 {
        self.at.saturating_add(pos as u64)
    }

    fn left(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn byte(&mut self) -> Result<u8, String> {
        let b = *self.bytes.get(self.pos).ok_or_else(|| {
            format!(
                "a Thrift struct runs past its end at byte {}",
                self.offset(self.pos)
            )
        })?;
        self.pos += 1;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64, String> {
        let start = self.pos;
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(format!(
            "the varint at byte {} is longer than 10 bytes",
            self.offset(start)
        ))
    }

    /// Passes `n` bytes that a value at `start` declares.
    fn skip(&mut self, n: u64, start: usize) -> Result<(), String> {
        match usize::try_from(n) {
            Ok(n) if n <= self.left() => {
                self.pos += n;
                Ok(())
            }
            _ => Err(format!(
                "the value at byte {} declares {n} bytes where {} are left",
                self.offset(start),
                self.left()
            )),
        }
    }

    /// Checks that `count` elements of at least `min_bytes` bytes each fit in what is left.
    fn fits(&self, count: u64, min_bytes: u64, what: &str, start: usize) -> Result<(), String> {
        if count.saturating_mul(min_bytes) <= self.left() as u64 {
            return Ok(());
        }
        Err(format!(
            "the {what} at byte {} declares {count} elements where {} bytes are left",
            self.offset(start),
            self.left()
        ))
    }

    fn deeper(&self, depth: u32, start: usize) -> Result<u32, String> {
        if depth >= MAX_DEPTH {
            return Err(format!(
                "the value at byte {} nests deeper than {MAX_DEPTH} levels",
                self.offset(start)
            ));
        }
        Ok(depth + 1)
    }

    /// A struct's fields up to its stop byte. With `wanted`, returns that field's value when it
    /// is an integer.
    fn fields(&mut self, depth: u32, wanted: Option<i16>) -> Result<Option<i64>, String> {
        let depth = self.deeper(depth, self.pos)?;
        let mut id = 0i16;
        let mut found = None;
        loop {
            let start = self.pos;
            let header = self.byte()?;
            let kind = header & 0x0f;
            if kind == 0 {
                return Ok(found);
            }
            id = match header >> 4 {
                0 => zigzag(self.varint()?) as i16,
                delta => id.wrapping_add(i16::from(delta)),
            };
            match kind {
                // A boolean field's value is its type code.
                BOOL_TRUE | BOOL_FALSE => {}
                I16 | I32 | I64 if wanted == Some(id) => found = Some(zigzag(self.varint()?)),
                _ => self.value(kind, depth, start)?,
            }
        }
    }

    /// One value of type `kind`, an element or a field's (a boolean field's has no bytes and is
    /// not passed here).
    fn value(&mut self, kind: u8, depth: u32, start: usize) -> Result<(), String> {
        match kind {
            BOOL_TRUE | BOOL_FALSE | BYTE => self.skip(1, start),
            I16 | I32 | I64 => self.varint().map(drop),
            DOUBLE => self.skip(8, start),
            BINARY => {
                let n = self.varint()?;
                self.skip(n, start)
            }
            LIST | SET => {
                let header = self.byte()?;
                // Some writers write an empty list as one zero byte.
                if header == 0 {
                    return Ok(());
                }
                let count = match header >> 4 {
                    15 => self.varint()?,
                    n => u64::from(n),
                };
                self.fits(count, 1, "list", start)?;
                let depth = self.deeper(depth, start)?;
                for _ in 0..count {
                    let at = self.pos;
                    self.value(header & 0x0f, depth, at)?;
                }
                Ok(())
            }
            MAP => {
                let count = self.varint()?;
                if count == 0 {
                    return Ok(());
                }
                let types = self.byte()?;
                self.fits(count, 2, "map", start)?;
                let depth = self.deeper(depth, start)?;
                for _ in 0..count {
                    let at = self.pos;
                    self.value(types >> 4, depth, at)?;
                    let at = self.pos;
                    self.value(types & 0x0f, depth, at)?;
                }
                Ok(())
            }
            STRUCT => self.fields(depth, None).map(drop),
            UUID => self.skip(16, start),
            other => Err(format!(
                "the value at byte {} has no Thrift type ({other})",
                self.offset(start)
            )),
        }
    }
}

fn zigzag(n: u64) -> i64 {
    (n >> 1) as i64 ^ -((n & 1) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Field `id` (after field `id - delta`, `delta` 1 to 15) of type `kind`.
    fn field(delta: u8, kind: u8) -> u8 {
        delta << 4 | kind
    }

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }

    #[test]
    fn every_type_is_walked_to_the_stop_byte() {
        let mut s = vec![field(1, BOOL_TRUE), field(1, BYTE), 7, field(1, I32)];
        varint(300, &mut s);
        s.extend([field(1, DOUBLE), 0, 0, 0, 0, 0, 0, 0xf0, 0x3f]);
        s.extend([field(1, BINARY), 3, b'a', b'b', b'c']);
        // A list of three booleans: a byte each, unlike a boolean field.
        s.extend([field(1, LIST), 3 << 4 | BOOL_TRUE, 1, 2, 1]);
        // A set of two structs, the second with a field.
        s.extend([field(1, SET), 2 << 4 | STRUCT, 0, field(1, I16), 4, 0]);
        // A map of one i32 to a list of 20 bytes (the long list header).
        s.extend([field(1, MAP), 1, I32 << 4 | LIST, 2, 0xf0 | BYTE, 20]);
        s.extend([9u8; 20]);
        s.extend([field(1, UUID)]);
        s.extend([5u8; 16]);
        // Field 300, with its id written out, then an empty list written as one zero byte.
        s.push(STRUCT);
        varint(600, &mut s);
        s.extend([0, field(1, LIST), 0]);
        s.push(0);
        let len = s.len();
        s.extend([0xff; 4]); // what follows the struct is not read
        assert_eq!(check_struct(&s, 0), Ok(len));
    }

    #[test]
    fn a_declared_count_beyond_the_bytes_is_refused_at_once() {
        // Field 15, a list of 2^31 - 1 booleans: the crate's own skip took seconds on it.
        let mut s = vec![field(15, LIST), 0xf0 | BOOL_TRUE];
        varint(i32::MAX as u64, &mut s);
        s.push(0);
        let e = check_struct(&s, 100).unwrap_err();
        assert_eq!(
            e,
            "the list at byte 100 declares 2147483647 elements where 1 bytes are left"
        );
        let mut s = vec![field(1, MAP)];
        varint(5, &mut s);
        s.extend([BYTE << 4 | BYTE, 1, 2, 3, 4, 5, 6, 7, 0]);
        assert!(check_struct(&s, 0).unwrap_err().contains("map at byte 0"));
        let mut s = vec![field(1, BINARY)];
        varint(1 << 40, &mut s);
        let e = check_struct(&s, 0).unwrap_err();
        assert!(e.contains("declares 1099511627776 bytes"), "{e}");
    }

    #[test]
    fn truncation_depth_and_unknown_types_are_refused() {
        assert_eq!(
            check_struct(&[field(1, I32), 0x80], 8),
            Err("a Thrift struct runs past its end at byte 10".into())
        );
        let e = check_struct(
            &[
                field(1, I64),
                0xff,
                0xff,
                0xff,
                0xff,
                0xff,
                0xff,
                0xff,
                0xff,
                0xff,
                0xff,
                1,
            ],
            0,
        );
        assert!(e.unwrap_err().contains("longer than 10 bytes"));
        let e = check_struct(&[field(1, 14), 0], 0).unwrap_err();
        assert!(e.contains("no Thrift type (14)"), "{e}");
        let mut nested = vec![field(1, STRUCT); 70];
        nested.extend([0; 71]);
        let e = check_struct(&nested, 0).unwrap_err();
        assert!(e.contains("deeper than 64 levels"), "{e}");
        let mut ok = vec![field(1, STRUCT); 60];
        ok.extend([0; 61]);
        assert_eq!(check_struct(&ok, 0), Ok(121));
    }

    #[test]
    fn a_page_headers_compressed_size_is_found_at_its_top_level() {
        // Fields 1 and 2 (i32), then compressed_page_size (3) = 150, then a struct whose own
        // field 3 is not the page's.
        let mut s = vec![field(1, I32), 0, field(1, I32), 200, 1, field(1, I32)];
        varint(150 << 1, &mut s);
        s.extend([field(2, STRUCT), field(3, I32), 8, 0, 0]);
        assert_eq!(check_page_header(&s, 0), Ok((s.len(), Some(150))));
        assert_eq!(check_page_header(&[field(1, I32), 0, 0], 0), Ok((3, None)));
    }
}
