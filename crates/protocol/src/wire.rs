//! Field codecs shared by every message body.
//!
//! All integers are little-endian. A [`Reader`] is a cursor over exactly one
//! frame body, so no field can read past the declared length (invariant I2),
//! and a count is checked against the bytes left before anything is
//! allocated for it (I3).

use kvtier_core::BlockHash;

use crate::DecodeError;

/// A cursor over one frame body; the message name labels its errors.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    message: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], message: &'static str) -> Self {
        Self { buf, message }
    }

    /// An error naming the message being decoded.
    pub(crate) fn malformed(&self, reason: &'static str) -> DecodeError {
        DecodeError::Malformed {
            message: self.message,
            reason,
        }
    }

    /// Takes the next `n` bytes, or fails if the body ends first.
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.buf.len() {
            return Err(self.malformed("body ends inside a field"));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    /// Reads an element count and checks that `count` elements of at least
    /// `min_size` bytes each fit in what is left, before any allocation.
    pub(crate) fn count(&mut self, min_size: usize) -> Result<usize, DecodeError> {
        let count = u32::get(self)? as usize;
        if count.saturating_mul(min_size.max(1)) > self.buf.len() {
            return Err(self.malformed("count larger than the body"));
        }
        Ok(count)
    }

    /// Fails with `TrailingBytes` unless the whole body was consumed.
    pub(crate) fn finish(self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        Err(DecodeError::TrailingBytes {
            message: self.message,
            count: self.buf.len(),
        })
    }
}

/// A value with one canonical encoding: `get` accepts exactly the bytes
/// `put` writes, so every decoded value re-encodes to the bytes it came from.
pub(crate) trait Wire: Sized {
    /// The fewest bytes one encoded value takes (bounds list allocations).
    const MIN_SIZE: usize;
    /// Appends the encoding of `self`.
    fn put(&self, out: &mut Vec<u8>);
    /// Reads one value.
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError>;
}

macro_rules! wire_int {
    ($($t:ty),*) => {$(
        impl Wire for $t {
            const MIN_SIZE: usize = size_of::<$t>();
            fn put(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
                Ok(<$t>::from_le_bytes(r.array()?))
            }
        }
    )*};
}
wire_int!(u8, u16, u32, u64);

impl Wire for BlockHash {
    const MIN_SIZE: usize = 16;
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(BlockHash::from_le_bytes(r.array()?))
    }
}

/// Lists: a `u32` count, then the elements.
impl<T: Wire> Wire for Vec<T> {
    const MIN_SIZE: usize = 4;
    fn put(&self, out: &mut Vec<u8>) {
        // Encoders check the frame size before sending; a list this long
        // could never fit in MAX_FRAME, so saturating keeps it refused.
        let count = u32::try_from(self.len()).unwrap_or(u32::MAX);
        count.put(out);
        for item in self {
            item.put(out);
        }
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let count = r.count(T::MIN_SIZE)?;
        let mut items = Vec::with_capacity(count);
        for _ in 0..count {
            items.push(T::get(r)?);
        }
        Ok(items)
    }
}

/// Strings: a `u32` byte length, then UTF-8 bytes.
impl Wire for String {
    const MIN_SIZE: usize = 4;
    fn put(&self, out: &mut Vec<u8>) {
        let len = u32::try_from(self.len()).unwrap_or(u32::MAX);
        len.put(out);
        out.extend_from_slice(self.as_bytes());
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let len = r.count(1)?;
        let bytes = r.take(len)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(r.malformed("string is not UTF-8")),
        }
    }
}

/// Options: a `u8` tag, 0 (absent) or 1 (present, then the value).
impl<T: Wire> Wire for Option<T> {
    const MIN_SIZE: usize = 1;
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            None => out.push(0),
            Some(v) => {
                out.push(1);
                v.put(out);
            }
        }
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match u8::get(r)? {
            0 => Ok(None),
            1 => Ok(Some(T::get(r)?)),
            _ => Err(r.malformed("option tag is neither 0 nor 1")),
        }
    }
}

/// Implements [`Wire`] for a struct as its fields in order.
macro_rules! wire_struct {
    ($name:ident { $($field:ident : $ty:ty),* $(,)? }) => {
        impl $crate::wire::Wire for $name {
            const MIN_SIZE: usize = 0 $(+ <$ty as $crate::wire::Wire>::MIN_SIZE)*;
            fn put(&self, out: &mut Vec<u8>) {
                $( $crate::wire::Wire::put(&self.$field, out); )*
            }
            fn get(r: &mut $crate::wire::Reader<'_>) -> Result<Self, $crate::DecodeError> {
                Ok(Self { $( $field: <$ty as $crate::wire::Wire>::get(r)?, )* })
            }
        }
    };
}
pub(crate) use wire_struct;

/// Implements [`Wire`] for a fieldless enum as one `u8` code; any other
/// code is malformed.
macro_rules! wire_code_enum {
    ($name:ident { $($variant:ident = $code:expr),* $(,)? }) => {
        impl $crate::wire::Wire for $name {
            const MIN_SIZE: usize = 1;
            fn put(&self, out: &mut Vec<u8>) {
                out.push(match self { $( $name::$variant => $code, )* });
            }
            fn get(r: &mut $crate::wire::Reader<'_>) -> Result<Self, $crate::DecodeError> {
                match <u8 as $crate::wire::Wire>::get(r)? {
                    $( $code => Ok($name::$variant), )*
                    _ => Err(r.malformed(concat!("unknown ", stringify!($name), " code"))),
                }
            }
        }
    };
}
pub(crate) use wire_code_enum;
