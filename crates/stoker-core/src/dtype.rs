//! Element types and image layouts.

use std::fmt;
use std::str::FromStr;

/// Element type of a batch field. The discriminants match `stoker_dtype` of the C ABI.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum DType {
    /// Unsigned 8-bit integer (`uint8`): decoded pixels.
    U8 = 0,
    /// Signed 32-bit integer (`int32`).
    I32 = 1,
    /// Signed 64-bit integer (`int64`): labels and `<name>_lengths` fields.
    I64 = 2,
    /// IEEE 754 half precision (`float16`).
    F16 = 3,
    /// bfloat16: `float32`'s exponent, 7 bits of mantissa (`bfloat16`).
    BF16 = 4,
    /// IEEE 754 single precision (`float32`).
    F32 = 5,
    /// Unsigned 16-bit integer (`uint16`): 16-bit images (medical, satellite).
    U16 = 6,
}

impl DType {
    /// Every element type, in code order.
    pub const ALL: [DType; 7] = [
        DType::U8,
        DType::I32,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::U16,
    ];

    /// The `stoker_dtype` code every face uses for this type (C, C++, Python).
    pub const fn code(self) -> u32 {
        self as u32
    }

    /// The type of a `stoker_dtype` code; `None` for an unknown code.
    pub fn from_code(code: u32) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.code() == code)
    }

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::U8 => 1,
            DType::U16 | DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 => 8,
        }
    }

    /// The option-string spelling (`uint8`, `float32`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::U8 => "uint8",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
            DType::U16 => "uint16",
        }
    }

    /// Whether `value` is one of this type's values (an integer in range for the integer
    /// types, finite and in range for the floating ones): what [`DType::encode`] stores exactly
    /// (floats rounded to the nearest).
    pub fn holds(self, value: f64) -> bool {
        let int = |min: f64, max: f64| value.fract() == 0.0 && (min..=max).contains(&value);
        match self {
            DType::U8 => int(0.0, u8::MAX as f64),
            DType::U16 => int(0.0, u16::MAX as f64),
            DType::I32 => int(i32::MIN as f64, i32::MAX as f64),
            DType::I64 => int(i64::MIN as f64, i64::MAX as f64),
            DType::F16 => value.abs() <= f64::from(half::f16::MAX),
            DType::BF16 => value.abs() <= f64::from(half::bf16::MAX),
            DType::F32 => value.abs() <= f64::from(f32::MAX),
        }
    }

    /// Writes `value` converted to this type into `out` (exactly `self.size()` bytes), native
    /// endian. Integers saturate; used for pad values, so speed does not matter.
    pub fn encode(self, value: f64, out: &mut [u8]) {
        match self {
            DType::U8 => out[0] = value as u8,
            DType::I32 => out.copy_from_slice(&(value as i32).to_ne_bytes()),
            DType::I64 => out.copy_from_slice(&(value as i64).to_ne_bytes()),
            DType::F16 => out.copy_from_slice(&half::f16::from_f64(value).to_ne_bytes()),
            DType::BF16 => out.copy_from_slice(&half::bf16::from_f64(value).to_ne_bytes()),
            DType::F32 => out.copy_from_slice(&(value as f32).to_ne_bytes()),
            DType::U16 => out.copy_from_slice(&(value as u16).to_ne_bytes()),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "uint8" | "u8" => DType::U8,
            "int32" | "i32" => DType::I32,
            "int64" | "i64" => DType::I64,
            "float16" | "f16" | "half" => DType::F16,
            "bfloat16" | "bf16" => DType::BF16,
            "float32" | "f32" | "float" => DType::F32,
            "uint16" | "u16" => DType::U16,
            _ => {
                return Err(format!(
                "unknown dtype `{s}` (expected uint8, uint16, int32, int64, float16, bfloat16 or \
                 float32)"
            ))
            }
        })
    }
}

/// Memory layout of an image batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Layout {
    /// `[N, C, H, W]`, PyTorch's convention.
    #[default]
    Nchw,
    /// `[N, H, W, C]`, the decoder's natural order.
    Nhwc,
}

impl FromStr for Layout {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "nchw" | "NCHW" => Ok(Layout::Nchw),
            "nhwc" | "NHWC" => Ok(Layout::Nhwc),
            _ => Err(format!("unknown layout `{s}` (expected nchw or nhwc)")),
        }
    }
}
