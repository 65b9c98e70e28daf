//! The element types tokens are stored as: Megatron's type codes, a flat file's `token_dtype`,
//! and the little-endian reading and writing of one token.

/// The element type of stored tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenType {
    /// `uint8` (Megatron code 1).
    U8,
    /// `int8` (code 2).
    I8,
    /// `int16` (code 3).
    I16,
    /// `int32` (code 4).
    I32,
    /// `int64` (code 5).
    I64,
    /// `uint16` (code 8).
    U16,
    /// `uint32` (flat files only).
    U32,
}

impl TokenType {
    /// Bytes per token.
    pub const fn size(self) -> usize {
        match self {
            TokenType::U8 | TokenType::I8 => 1,
            TokenType::I16 | TokenType::U16 => 2,
            TokenType::I32 | TokenType::U32 => 4,
            TokenType::I64 => 8,
        }
    }

    /// NumPy's name for it.
    pub const fn name(self) -> &'static str {
        match self {
            TokenType::U8 => "uint8",
            TokenType::I8 => "int8",
            TokenType::I16 => "int16",
            TokenType::I32 => "int32",
            TokenType::I64 => "int64",
            TokenType::U16 => "uint16",
            TokenType::U32 => "uint32",
        }
    }

    /// Megatron's `DType` code of this type (`uint32` has none: flat files only).
    pub const fn megatron_code(self) -> Option<u8> {
        match self {
            TokenType::U8 => Some(1),
            TokenType::I8 => Some(2),
            TokenType::I16 => Some(3),
            TokenType::I32 => Some(4),
            TokenType::I64 => Some(5),
            TokenType::U16 => Some(8),
            TokenType::U32 => None,
        }
    }

    /// The type of Megatron's `DType` code (`indexed_dataset.py`); float codes are refused.
    pub fn from_megatron_code(code: u8) -> std::result::Result<TokenType, String> {
        Ok(match code {
            1 => TokenType::U8,
            2 => TokenType::I8,
            3 => TokenType::I16,
            4 => TokenType::I32,
            5 => TokenType::I64,
            8 => TokenType::U16,
            6 | 7 => {
                return Err(format!(
                    "has token type code {code} ({}): token ids are integers",
                    if code == 6 { "float64" } else { "float32" }
                ))
            }
            _ => {
                return Err(format!(
                    "has unknown token type code {code} (Megatron's are 1-5 and 8 for integers)"
                ))
            }
        })
    }

    /// The value of one little-endian token (`bytes.len() == self.size()`).
    pub fn get(self, bytes: &[u8]) -> i64 {
        let mut b = [0u8; 8];
        let n = self.size().min(bytes.len());
        b[..n].copy_from_slice(&bytes[..n]);
        match self {
            TokenType::U8 => i64::from(b[0]),
            TokenType::I8 => i64::from(b[0] as i8),
            TokenType::I16 => i64::from(i16::from_le_bytes([b[0], b[1]])),
            TokenType::U16 => i64::from(u16::from_le_bytes([b[0], b[1]])),
            TokenType::I32 => i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            TokenType::U32 => i64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            TokenType::I64 => i64::from_le_bytes(b),
        }
    }

    /// Appends `value` as one little-endian token; an error says why it does not fit.
    pub fn put(self, value: i64, out: &mut Vec<u8>) -> std::result::Result<(), String> {
        let fits = |ok: bool| {
            if ok {
                Ok(())
            } else {
                Err(format!("token {value} does not fit in {}", self.name()))
            }
        };
        match self {
            TokenType::U8 => fits(u8::try_from(value).is_ok())?,
            TokenType::I8 => fits(i8::try_from(value).is_ok())?,
            TokenType::I16 => fits(i16::try_from(value).is_ok())?,
            TokenType::U16 => fits(u16::try_from(value).is_ok())?,
            TokenType::I32 => fits(i32::try_from(value).is_ok())?,
            TokenType::U32 => fits(u32::try_from(value).is_ok())?,
            TokenType::I64 => {}
        }
        // Two's complement little-endian: the low `size` bytes are the narrower type's bytes.
        out.extend_from_slice(&value.to_le_bytes()[..self.size()]);
        Ok(())
    }

    /// `token_dtype`: the types a raw flat file may hold.
    pub fn parse_raw(v: &str) -> std::result::Result<TokenType, String> {
        match v {
            "uint16" => Ok(TokenType::U16),
            "uint32" => Ok(TokenType::U32),
            "int32" => Ok(TokenType::I32),
            _ => Err(format!(
                "`{v}` is not a token type; expected uint16, uint32 or int32"
            )),
        }
    }
}
